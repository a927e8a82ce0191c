"""``pulseinfer trace``: look at a trace before simulating it.

``pulseinfer trace stats [TRACE ...]`` prints, per trace (a shipped name or a path; none = every shipped trace),
what ``traces.trace_stats`` computes: rows, span, rate, prompt and output tokens mean/p50/p90/p99/max and the
share of prompts above 8K/32K/128K, plus what reading did (``traces.trace_notes``). Bad input: one ``error:``
line, exit status 2.
"""

from __future__ import annotations

import argparse
import math

from pulseinfer.errors import UsageError

_INDENT = "  "


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "trace",
        help="describe request traces (trace stats)",
        description="Describe request traces before simulating them.",
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    stats = actions.add_parser(
        "stats",
        help="rows, span, rate, token percentiles, long-prompt shares",
        description="Print rows, span, rate, prompt/output tokens mean/p50/p90/p99/max and the share of prompts "
        "above 8K/32K/128K tokens for each trace (shipped name or path; none = every shipped trace).",
    )
    stats.add_argument("traces", nargs="*", metavar="TRACE", help="shipped trace name, file, or session folder")
    stats.add_argument(
        "--format",
        dest="trace_format",
        default="auto",
        help="auto (default), mooncake, azure, ragpulse, kvcache_tester, burstgpt, csv or jsonl",
    )
    stats.add_argument(
        "--columns",
        default=None,
        metavar="KEY=VALUE,...",
        help="column mapping for csv/jsonl, e.g. arrival=ts,arrival_unit=ms,prompt_tokens=in,output_tokens=out",
    )
    stats.add_argument("--week", type=int, default=None, help="RAGPulse: which week of a multi-week file")
    return p


def run(args: argparse.Namespace) -> int:
    import traces

    columns = _parse_columns(args.columns)
    names = args.traces or list(traces.SHIPPED_TRACES)
    blocks = []
    for name in names:
        df = traces.load_trace(name, args.trace_format, columns=columns, week=args.week)
        blocks.append(format_stats(name, df, traces.trace_stats(df), traces.trace_notes(df)))
    print("\n\n".join(blocks))
    return 0


def format_stats(name: str, df, stats: dict[str, float], notes: list[str]) -> str:
    """The text block for one trace: a title line, then one labelled line per statistic, then the notes."""
    source, fmt = df.attrs.get("source", ""), df.attrs.get("format", "?")
    lines = [f"{name} ({source}, format {fmt})" if source and source != name else f"{name} (format {fmt})"]

    def row(label: str, text: str) -> None:
        lines.append(f"{_INDENT}{label:<15}{text}")

    row("rows", f"{stats['rows']:,}")
    if "num_sessions" in stats:
        row("span", "n/a (sessions have their own clocks)")
        row("rate", "n/a (closed loop: set by the session arrival rate and the server)")
        row(
            "sessions",
            f"{stats['num_sessions']:,}; requests per session p50 {stats['requests_per_session_p50']:,.0f}; "
            f"session span p50 {_duration(stats['session_span_s_p50'])}; "
            f"sub-agent requests {stats.get('num_subagent_requests', 0):,}",
        )
    else:
        span_s = stats["span_s"]
        row("span", f"{span_s:.1f} s" if span_s < 120 else f"{span_s:,.0f} s ({_duration(span_s)})")
        rate = stats["rate_per_s"]
        digits = 3 if rate >= 0.1 else 4
        row("rate", "n/a (zero span)" if math.isnan(rate) else f"{rate:.{digits}f} req/s")
    for label, column in (("input tokens", "prompt_tokens"), ("output tokens", "output_tokens")):
        parts = [f"{key} {stats[f'{column}_{key}']:,.0f}" for key in ("mean", "p50", "p90", "p99", "max")]
        row(label, "   ".join(parts))
    shares = [f"> {k.upper()} {100 * stats[f'share_prompt_over_{k}']:.1f}%" for k in ("8k", "32k", "128k")]
    row("input share", "   ".join(shares))
    lines.extend(f"{_INDENT}note: {note}" for note in notes)
    return "\n".join(lines)


def _duration(span_s: float) -> str:
    if span_s < 120:
        return f"{span_s:.1f} s"
    if span_s < 2 * 3600:
        return f"{span_s / 60:.1f} min"
    if span_s < 2 * 86400:
        return f"{span_s / 3600:.1f} h"
    return f"{span_s / 86400:.1f} days"


def _parse_columns(text: str | None) -> dict[str, str] | None:
    """``arrival=ts,prompt_tokens=in,...`` as a dict; UsageError naming the bad item."""
    if text is None:
        return None
    mapping: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UsageError(f"--columns: expected KEY=VALUE items separated by commas, got {item!r}")
        mapping[key.strip()] = value.strip()
    return mapping
