"""``pulseinfer trace stats``: the README figures for every shipped trace; bad input exits 2 with one error line."""

from __future__ import annotations

import contextlib
import io

import pytest

from pulseinfer.cli import EXIT_BAD_INPUT, main
from traces import SHIPPED_TRACES

# (rows, input line, output line, share line) as printed; numbers as in traces/data/README.md
EXPECTED = {
    "mooncake_conversation": (
        "5,719", "mean 12,870   p50 7,640   p90 28,638   p99 91,207   max 123,192",
        "mean 346   p50 356   p90 608   p99 1,105   max 2,000", "> 8K 47.9%   > 32K 7.7%   > 128K 0.0%",
    ),
    "azure_code_2023": (
        "5,740", "mean 2,028   p50 1,460   p90 5,012   p99 7,436   max 7,437",
        "mean 27   p50 13   p90 53   p99 247   max 1,899", "> 8K 0.0%   > 32K 0.0%   > 128K 0.0%",
    ),
    "azure_conv_2023": (
        "10,108", "mean 1,243   p50 1,033   p90 4,076   p99 4,123   max 14,050",
        "mean 217   p50 134   p90 427   p99 610   max 1,000", "> 8K 0.0%   > 32K 0.0%   > 128K 0.0%",
    ),
    "ragpulse_week1": (
        "3,800", "mean 3,021   p50 3,166   p90 3,922   p99 5,269   max 6,467",
        "mean 256   p50 201   p90 508   p99 795   max 1,843", "> 8K 0.0%   > 32K 0.0%   > 128K 0.0%",
    ),
    "claude_code_sessions": (
        "1,437", "mean 93,732   p50 95,737   p90 139,386   p99 154,958   max 196,860",
        "mean 355   p50 210   p90 696   p99 2,690   max 9,183", "> 8K 100.0%   > 32K 95.2%   > 128K 18.8%",
    ),
}  # fmt: skip
SPANS = {
    "mooncake_conversation": ("1,797 s (29.9 min)", "3.183 req/s"),
    "azure_code_2023": ("1,788 s (29.8 min)", "3.210 req/s"),
    "azure_conv_2023": ("1,800 s (30.0 min)", "5.616 req/s"),
    "ragpulse_week1": ("604,371 s (7.0 days)", "0.0063 req/s"),
}


def test_expected_figures_cover_every_shipped_trace():
    assert set(EXPECTED) == set(SHIPPED_TRACES)


@pytest.fixture(scope="module")
def all_stats_output() -> str:
    """`pulseinfer trace stats` with no argument: every shipped trace, once for the module."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["trace", "stats"]) == 0
    return out.getvalue()


@pytest.mark.parametrize("name", list(EXPECTED))
def test_trace_stats_prints_the_readme_figures(all_stats_output, name):
    block = next(b for b in all_stats_output.split("\n\n") if b.startswith(name + " "))
    rows, prompt, output, shares = EXPECTED[name]
    lines = {line[2:17].strip(): line[17:] for line in block.splitlines()[1:] if not line.startswith("  note")}
    assert lines["rows"] == rows
    assert lines["input tokens"] == prompt
    assert lines["output tokens"] == output
    assert lines["input share"] == shares
    if name in SPANS:
        assert (lines["span"], lines["rate"]) == SPANS[name]
    else:
        assert lines["span"].startswith("n/a")
        assert lines["sessions"].startswith("15; requests per session p50 52")


def test_trace_stats_of_one_file_with_a_format(tmp_path, capsys):
    path = tmp_path / "t.csv"
    path.write_text("ts,in,out\n0,100,5\n2,300,7\n")
    assert main(["trace", "stats", str(path), "--columns", "arrival=ts,prompt_tokens=in,output_tokens=out"]) == 0
    out = capsys.readouterr().out
    assert "format csv" in out
    assert "rate           1.000 req/s" in out


def _assert_one_error_line(err: str, *needles: str) -> None:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


def test_missing_trace_exits_2_with_one_error_line(capsys):
    assert main(["trace", "stats", "/nonexistent.jsonl"]) == EXIT_BAD_INPUT
    _assert_one_error_line(capsys.readouterr().err, "/nonexistent.jsonl", "shipped:")


def test_malformed_row_exits_2_naming_file_line_and_field(tmp_path, capsys):
    path = tmp_path / "bad.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:00:00.0000000,12,x\r\n")
    assert main(["trace", "stats", str(path)]) == EXIT_BAD_INPUT
    _assert_one_error_line(capsys.readouterr().err, f"{path} line 2", "field 'GeneratedTokens'")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["mooncake_conversation", "--format", "parquet"], "unknown trace format 'parquet'"),
        (["mooncake_conversation", "--week", "2"], "week applies to RAGPulse"),
        (["mooncake_conversation", "--columns", "arrival"], "--columns: expected KEY=VALUE"),
    ],
)
def test_bad_options_exit_2_with_one_error_line(capsys, args, needle):
    assert main(["trace", "stats", *args]) == EXIT_BAD_INPUT
    _assert_one_error_line(capsys.readouterr().err, needle)
