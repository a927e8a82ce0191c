"""What a measured file says about the server it was run on, and what the replay must be told or must tell the user:
the engine and release it records (:func:`engine_overrides`, :func:`files_engine`), the server settings of a
``meta.json`` (:func:`recorded_overrides`) and its KV pool (:func:`pool_note`), a stream that sends several tokens a
chunk (:func:`chunked_stream`), and measured TTFTs the card cannot reach without prefix-cache hits
(:func:`roofline_check`). Each gives overrides for the scenario or one line for the user; none changes a table.
"""

from __future__ import annotations

import numpy as np

from sim.config import Scenario
from traces.measured import MeasuredRun


def roofline_check(run: MeasuredRun, scenario: Scenario) -> str | None:
    """A line flagging measured TTFTs the card cannot reach without prefix-cache hits, or None.

    A request's TTFT is at least its prompt's GEMM FLOPs (2 · active weights · prompt tokens; attention left out, so
    the bound is low) at the card's dense peak (FP8 for FP8 weights on FP8 tensor cores, else BF16) on its
    ``tp_size`` GPUs. A measured TTFT below that bound needs tokens the server did not compute: cache hits.
    """
    model, hw = scenario.model, scenario.hardware
    req = replayable(run, model.max_seq_len)
    ttft = req["ttft_s"].to_numpy(float)
    prompts = req["prompt_tokens"].to_numpy(float)
    peak = hw.fp8_tflops if model.dtype == "fp8" and hw.fp8_tflops is not None else hw.bf16_tflops
    bound_s = (
        2.0 * model.num_layers * model.active_params_per_layer * prompts / (peak * 1e12 * scenario.serving.tp_size)
    )
    ok = np.isfinite(ttft) & (ttft > 0)
    below = ok & (ttft < bound_s)
    if not below.any():
        return None
    factor = float(np.max(bound_s[below] / ttft[below]))
    return (f"cache hits: {int(below.sum())} of {int(ok.sum())} requests' measured TTFT is below the time "
            f"{hw.name} x{scenario.serving.tp_size} needs to prefill their prompts at its peak FLOPs (up to "
            f"{factor:.1f}x below): the server had prefix-cache hits the replay cannot see; give --prefix-share "
            "(or a file that records cached tokens or prompt texts)")  # fmt: skip


def engine_overrides(run: MeasuredRun, overrides: list[str]) -> tuple[list[str], str]:
    """``overrides`` with the engine the file records (``engine=NAME-VERSION``, :attr:`MeasuredRun.engine`) added
    when they set none, and a phrase saying where the engine came from (for the command's report line). A release
    newer than every line of its engine runs on that engine's newest line, and the phrase says so."""
    from sim.config import ScenarioError
    from sim.config.engine import resolve_engine

    if any(item.split("=", 1)[0].strip() == "engine" for item in overrides):
        return overrides, "set by --set engine"
    found = run.engine
    if found is None:
        return overrides, "the file names no engine: the scenario's"
    try:
        line = resolve_engine(found)
    except ScenarioError:  # a release newer than every line: the newest line of that engine, said so
        kind = found.split("-", 1)[0]
        newest = resolve_engine(kind)["name"]
        return [f"engine={kind}", *overrides], f"from the file: {found}, newer than every line: the newest, {newest}"
    note = f"; {line['note']}" if line.get("note") else ""
    return [f"engine={found}", *overrides], f"from the file: {found}{note}"


def files_engine(runs: list[MeasuredRun], overrides: list[str]) -> tuple[list[str], str]:
    """:func:`engine_overrides` for several files of one server: the engine they record, the one with a release
    where some name only the engine.

    Raises:
        ValueError: the files record different engines or release lines (not one server), naming them, unless
            ``overrides`` set the engine.
    """
    from sim.config import ScenarioError
    from sim.config.engine import resolve_engine

    if any(item.split("=", 1)[0].strip() == "engine" for item in overrides) or len(runs) == 1:
        return engine_overrides(runs[0], overrides)
    named = [(r, r.engine) for r in runs if r.engine]
    if not named:
        return overrides, "the files name no engine: the scenario's"
    versioned = [(r, e) for r, e in named if "-" in e] or named
    lines = {}
    for run, engine in versioned:
        try:
            lines[resolve_engine(engine)["name"]] = run
        except ScenarioError:  # newer than every line: that engine's newest
            lines[resolve_engine(engine.split("-", 1)[0])["name"]] = run
    kinds = {e.split("-", 1)[0] for _, e in named}
    if len(lines) > 1 or len(kinds) > 1:
        found = ", ".join(f"{r.source_path}: {e}" for r, e in named)
        raise ValueError(f"the files record different engines ({found}): not one server; fit them one engine at a "
                         "time, or give --set engine=LINE to fit them as one")  # fmt: skip
    return engine_overrides(next(iter(lines.values())), overrides)


def recorded_overrides(
    runs: MeasuredRun | list[MeasuredRun], overrides: list[str], policy: str
) -> tuple[list[str], list[str]]:
    """``overrides`` with the server settings the files record (a ``requests.jsonl``'s ``meta.json``: vLLM's
    ``max_num_seqs``, ``max_num_batched_tokens``, ``tensor_parallel_size``, ``enable_prefix_caching``) added where
    ``overrides`` do not set them, and a note per setting taken (so none is read and silently left unused).

    Raises:
        ValueError: two files record different values of a setting ``overrides`` do not set.
    """
    recorded: dict[str, object] = {}
    for run in runs if isinstance(runs, list) else [runs]:
        for key, value in _server_settings(run, policy).items():
            if value is None:
                continue
            if key in recorded and recorded[key] != value:
                if any(item.split("=", 1)[0].strip() == key for item in overrides):
                    continue
                raise ValueError(f"{run.source_path}: its server ran with {key}={value}, another file's with "
                                 f"{recorded[key]}: not one server; give --set {key}=")  # fmt: skip
            recorded[key] = value
    given = {item.split("=", 1)[0].strip() for item in overrides}
    added, notes = [], []
    for key, value in recorded.items():
        if key in given or (isinstance(value, int) and not isinstance(value, bool) and value < 1):
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        added.append(f"{key}={text}")
        notes.append(f"{key}={text} (from the file's server settings)")
    return [*added, *overrides], notes


def _server_settings(run: MeasuredRun, policy: str) -> dict[str, object]:
    """The scenario keys a file's ``meta.json`` sets (None where it does not say)."""
    meta = run.summary.get("meta") if isinstance(run.summary.get("meta"), dict) else {}
    kwargs = meta.get("engine_kwargs") if isinstance(meta.get("engine_kwargs"), dict) else {}
    kv = meta.get("kv_cache") if isinstance(meta.get("kv_cache"), dict) else {}
    return {
        f"policy.{policy}.max_running_requests": kwargs.get("max_num_seqs"),
        f"policy.{policy}.chunked_prefill_tokens": kwargs.get("max_num_batched_tokens"),
        "serving.tp_size": kwargs.get("tensor_parallel_size"),
        f"policy.{policy}.prefix_cache": kv.get("enable_prefix_caching"),
    }


def pool_note(run: MeasuredRun, scenario: Scenario, pool_gib: float) -> str | None:
    """A line comparing the server's KV pool (``meta.json``'s ``num_kv_tokens``) with the replay's, or None."""
    meta = run.summary.get("meta") if isinstance(run.summary.get("meta"), dict) else {}
    kv = meta.get("kv_cache") if isinstance(meta.get("kv_cache"), dict) else {}
    server = kv.get("num_kv_tokens")
    if not isinstance(server, (int, float)) or server <= 0:
        return None
    replay = pool_gib * 2**30 / (scenario.model.kv_bytes_per_token / scenario.serving.tp_size)
    if abs(replay / server - 1) < 0.1:
        return None
    return (f"KV pool: the server held {int(server):,} tokens (meta.json), the replay on {scenario.hardware.name} "
            f"holds {int(replay):,} ({replay / server:.1f}x): admission and batch sizes differ; a card with the "
            "server's memory matches it better")  # fmt: skip


def replayable(run: MeasuredRun, max_seq_len: int | None = None):
    """The requests of ``run`` the replay keeps (calibrate/measured.py ``replay_workload``): successful, with output
    tokens, within ``max_seq_len``."""
    req = run.requests
    keep = req["success"].to_numpy(bool) & (req["output_tokens"].to_numpy() > 0)
    if max_seq_len is not None:
        keep &= (req["prompt_tokens"] + req["output_tokens"]).to_numpy() <= max_seq_len
    return req[keep]


def chunked_stream(run: MeasuredRun, max_seq_len: int | None = None, ids=None) -> str | None:
    """A note when the file's token gaps are per chunk, not per token (a stream that sends several tokens at once:
    fewer gaps than output tokens − 1, by more than 10 % over the run), or None. Its ITL is then not compared."""
    req = replayable(run, max_seq_len)
    req = req if ids is None else req[req["request_id"].isin(ids)]  # the requests compared
    pairs = [(len(g), int(o) - 1) for g, o in zip(req["itl_s"], req["output_tokens"], strict=True)
             if g is not None and o > 1]  # fmt: skip
    gaps, tokens = sum(g for g, _ in pairs), sum(t for _, t in pairs)
    if not tokens or gaps >= 0.9 * tokens:
        return None
    return (f"ITL: the stream sent several tokens per chunk ({gaps:,} gaps for {tokens:,} tokens after the first, "
            f"{tokens / max(gaps, 1):.1f} a chunk); its ITL is per chunk and is not compared (TPOT is)")  # fmt: skip
