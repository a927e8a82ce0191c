"""Reader for the MLCommons "endpoints" benchmark client's `result_summary.json` (`performance/result_summary.json`
of an `inference-endpoint benchmark` run).

Source read: mlcommons/endpoints at commit ea3327530376fef63d706f4105612e17c2c80a8d:

- `src/inference_endpoint/metrics/report.py` (`Report`: `version`, `git_sha`, `test_started_at`,
  `n_samples_issued`, `n_samples_completed`, `n_samples_failed`, `duration_ns`, `state`, `complete`, `ttft`,
  `tpot`, `latency`, `output_sequence_lengths`, `input_sequence_lengths`, `legacy_loadgen_window_duration_ns`,
  `qps`, `tps`, `finish_reason_counts`, `run_config`; `Report.to_json` writes it; `_series_to_metric_dict` gives
  each series as `{total, min, max, median, avg, std_dev, percentiles: {"99.9": ..., "50.0": ...},
  early_stopping_percentiles?, histogram: {buckets: [[lo, hi], ...], counts: [...]}}`, or `{}` for a series
  with no samples; `SERIES_TO_SUMMARY_FIELD`: series `ttft_ns` -> `ttft`, `tpot_ns` -> `tpot`,
  `sample_latency_ns` -> `latency`);
- `src/inference_endpoint/async_utils/services/metrics_aggregator/metrics_table.py` (what each series holds, per
  sample: `latency` = complete - issued, ns; `ttft` = first chunk - issued, ns, streaming only; `tpot` = (complete
  - first chunk) / tokens after the first chunk, ns, streaming only; `input_sequence_lengths` = prompt tokens
  at issue; `output_sequence_lengths` = output tokens at completion, not recorded for an empty output);
  `.../metrics_aggregator/registry.py` (`SeriesSampler._exact_stat`: `np.histogram` over `_log_spaced_edges(min,
  max, n)`, i.e. n log-spaced bins from max(min, 1) to max(max, 10 min), values clipped into the edge range, so
  the counts sum to the sample count; percentiles with `method="lower"`); `.../metrics_aggregator/aggregator.py`
  (failed samples still complete and are in `latency`); `src/inference_endpoint/config/schema.py` (`run_config`:
  `load_pattern` {`type`: max_throughput | poisson | concurrency | agentic_inference | burst | step,
  `target_qps`, `target_concurrency`}, `warmup`, RNG seeds; from `commands/benchmark/pipeline.py`).
  `input_sequence_lengths` exists since commit ad5f15bb (#442); older summaries have no prompt lengths.

The file holds aggregates and histograms only, no per-request rows, no send times. The request table is rebuilt:
one row per count of the `latency` histogram (the completed samples), every count at its bin's value (the
midpoint of the bin cut to the series' exact [min, max]; the first bin reaches down to min because endpoints clips
values below its first edge into it). The other series are rebuilt the same way and paired with the rows by rank:
row i (rows in ascending latency) gets the i-th smallest TTFT, TPOT, prompt length and output length. So the
table's distributions (and percentiles) are the histograms', within a bin's width, but the pairing of a request's
TTFT, latency and lengths is not the measured one, and lengths are bin midpoints rounded to whole tokens. A series
with fewer samples than rows (TTFT/TPOT of samples that never streamed a token, OSL of empty outputs) fills the
lowest-latency rows with NaN (0 tokens for OSL); any other count mismatch is resampled by quantile; notes say so.
Where rebuilt TTFT exceeds the rebuilt latency of its row (a binning artefact, the exact min/max being
consistent) TTFT is set to that latency and notes count it.

Mapped: ttft_s, e2e_s, tpot_s (endpoints' own TPOT, which excludes the first chunk's tokens) from the ns series;
prompt_tokens / output_tokens from the length series; success True for every row (endpoints counts
`n_samples_failed` samples inside the histograms and the rows cannot be told apart; notes give the count);
arrival_s NaN; itl_s None (the summary has no chunk gaps); cached_tokens NaN, prefix_ids None. Run level:
request_rate = `target_qps` (poisson), inf (max_throughput, concurrency, agentic_inference), NaN otherwise or
without `run_config`; max_concurrency = `target_concurrency` for concurrency and agentic_inference only
(`load_generator/strategy.py` issues max_throughput as one burst and poisson on its timer); duration_s =
`duration_ns` / 1e9 (NaN when null); model and backend None (the summary names neither; config.yaml beside it
has the model); `summary` = the whole object (percentiles, qps, tps, finish reasons, early stopping estimates,
... are not mapped to rows).

Errors: `MeasuredFormatError`, one line: not one JSON object; a missing or empty `latency`,
`input_sequence_lengths` or `output_sequence_lengths` (no lengths: refused, the table would have to invent
them); a series without `min`/`max`/`histogram`, a non-finite, negative or non-numeric value, bins that are not
[lo <= hi] pairs, counts that are not non-negative integers or that do not match `total` / `avg`, samples in a bin
outside [min, max]; `ttft.max` above `latency.max` (a request's e2e must be >= its ttft).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from traces.measured.parse import (
    as_count,
    concurrency_value,
    fail,
    parse_json_documents,
    rate_value,
    read_text,
    show,
    source_name,
)
from traces.measured.schema import MeasuredFormatError, MeasuredRun, build_requests

TOOL = "mlcommons_endpoints"
FMT_DESC = "an MLCommons endpoints result_summary.json"
HINT = "expected the endpoints client's performance/result_summary.json"
NS = 1e-9
MARKER_KEYS = ("n_samples_issued", "n_samples_completed", "latency")
_INF_PATTERNS = ("max_throughput", "concurrency", "agentic_inference")
_CONCURRENCY_PATTERNS = ("concurrency", "agentic_inference")


def read_mlcommons_result_summary(path: str | Path) -> MeasuredRun:
    """Read an MLCommons endpoints `result_summary.json` into a MeasuredRun rebuilt from its histograms.

    Args:
        path: the `result_summary.json`.

    Raises:
        MeasuredFormatError: see the module docstring.
    """
    source = source_name(path)
    documents = parse_json_documents(read_text(path, FMT_DESC), source, FMT_DESC)
    obj = documents[0][1]
    if len(documents) != 1 or not isinstance(obj, dict):
        raise MeasuredFormatError(f"{source}: not {FMT_DESC}: expected one JSON object ({HINT})")
    for key in MARKER_KEYS:
        if key not in obj:
            raise MeasuredFormatError(f"{source}: not {FMT_DESC}: missing '{key}' ({HINT})")
    counts = {k: as_count(obj.get(k, 0), k, None, source, FMT_DESC) for k in MARKER_KEYS[:2] + ("n_samples_failed",)}
    latency = _series(obj, "latency", source, time=True)
    if latency is None:
        raise fail(source, FMT_DESC, "field 'latency': no samples (the run completed none); nothing to rebuild")
    missing = [k for k in ("input_sequence_lengths", "output_sequence_lengths") if _empty(obj.get(k))]
    if missing:
        names = " and ".join(f"'{k}'" for k in missing)
        raise fail(
            source,
            FMT_DESC,
            f"no token lengths: {names} missing or empty (written since endpoints #442, with a tokenizer); "
            "refusing to rebuild requests without them",
        )
    isl = _series(obj, "input_sequence_lengths", source, time=False)
    osl = _series(obj, "output_sequence_lengths", source, time=False)
    ttft = _series(obj, "ttft", source, time=True)
    tpot = _series(obj, "tpot", source, time=True)
    assert isl is not None and osl is not None  # not empty, checked above
    if ttft is not None and ttft["max"] > latency["max"]:
        raise fail(
            source,
            FMT_DESC,
            f"field 'ttft.max': {ttft['shown_max']} ns exceeds 'latency.max' {latency['shown_max']} ns; expected every "
            "sample's latency (e2e) >= its ttft",
        )

    n = latency["n"]
    notes = [
        f"rows rebuilt from histograms: {n} rows, one per count of 'latency', each at its bin's midpoint (cut to the "
        "series' min/max); rows in ascending latency, TTFT/TPOT/lengths paired by rank, not per request; no send "
        "times (arrival_s NaN), no inter-token gaps (itl_s None); percentiles are the histograms' within a bin"
    ]
    e2e = [v * NS for v in latency["values"]]
    ttft_s = [math.nan] * n
    if ttft is not None:
        values = _align(ttft, n, math.nan, notes)
        ttft_s = [v * NS for v in values]
        capped = 0
        for i in range(n):
            if ttft_s[i] > e2e[i]:
                ttft_s[i] = e2e[i]
                capped += 1
        if capped:
            notes.append(
                f"{capped} row(s): rebuilt TTFT above the row's rebuilt latency (bin midpoints); TTFT set to it"
            )
    else:
        notes.append("no 'ttft' samples (a non-streaming run): ttft_s NaN")
    tpot_s = [math.nan] * n
    if tpot is not None:
        tpot_s = [v * NS for v in _align(tpot, n, math.nan, notes)]
    notes.append("tpot_s: endpoints' own TPOT, (complete - first chunk) / tokens after the first chunk")
    prompts = [int(round(v)) for v in _align(isl, n, None, notes)]
    outputs = [int(round(v)) for v in _align(osl, n, 0.0, notes)]
    if counts["n_samples_failed"]:
        notes.append(
            f"{counts['n_samples_failed']} failed sample(s) are inside the histograms and cannot be told apart: "
            "every row is marked success"
        )
    if obj.get("complete") is False:
        notes.append(f"endpoints marks the report incomplete (state {obj.get('state')!r}): partial metrics")
    requests = build_requests(prompts, outputs, None, ttft_s, e2e, [None] * n, [True] * n, tpot_s=tpot_s)
    rate, concurrency = _load(obj.get("run_config"), source, notes)
    duration_ns = obj.get("duration_ns")
    if duration_ns is None:
        duration_s = math.nan
        notes.append("duration_ns is null: duration_s NaN")
    else:
        duration_s = as_count(duration_ns, "duration_ns", None, source, FMT_DESC) * NS
    return MeasuredRun(
        requests=requests,
        tool=TOOL,
        request_rate=rate,
        max_concurrency=concurrency,
        duration_s=duration_s,
        model=None,
        backend=None,
        num_prompts=n,
        summary=obj,
        source_path=source,
        notes=notes,
    )


def _empty(value: Any) -> bool:
    """A series the file does not have: absent, null, {} or one without a histogram (no samples)."""
    return not isinstance(value, dict) or not value.get("histogram") or not value["histogram"].get("counts")


def _number(value: Any, name: str, source: str, time: bool) -> float:
    """A finite number >= 0 (ns for a time series, tokens otherwise)."""
    unit = "nanoseconds" if time else "tokens"
    if type(value) in (int, float) and math.isfinite(value) and value >= 0:
        return float(value)
    if type(value) in (int, float) and math.isfinite(value):
        what = "negative time" if time else "negative value"
        raise fail(source, FMT_DESC, f"field '{name}': {what} {show(value)}; expected >= 0 {unit}")
    raise fail(source, FMT_DESC, f"field '{name}': expected a finite number >= 0 of {unit}, got {show(value)}")


def _series(obj: dict[str, Any], key: str, source: str, time: bool) -> dict[str, Any] | None:
    """A series' rebuilt values (sorted ascending, one per count), its min, max and sample count; None without
    samples."""
    stat = obj.get(key)
    if stat is None or stat == {}:
        return None
    if not isinstance(stat, dict):
        raise fail(source, FMT_DESC, f"field '{key}': expected an object, got {show(stat)}")
    if "histogram" not in stat and set(stat) <= {"early_stopping_percentiles"}:
        return None  # an enabled-but-empty series keeps only its (all-null) early-stopping map
    for field in ("min", "max", "histogram"):
        if field not in stat:
            raise MeasuredFormatError(f"{source}: not {FMT_DESC}: missing '{key}.{field}' ({HINT})")
    low = _number(stat["min"], f"{key}.min", source, time)
    high = _number(stat["max"], f"{key}.max", source, time)
    if low > high:
        raise fail(source, FMT_DESC, f"field '{key}.min': {show(stat['min'])} above '{key}.max' {show(stat['max'])}")
    hist = stat["histogram"]
    if (
        not isinstance(hist, dict)
        or not isinstance(hist.get("buckets"), list)
        or not isinstance(hist.get("counts"), list)
    ):
        raise fail(
            source, FMT_DESC, f"field '{key}.histogram': expected {{buckets: [...], counts: [...]}}, got {show(hist)}"
        )
    buckets, counts = hist["buckets"], hist["counts"]
    if len(buckets) != len(counts):
        raise fail(
            source,
            FMT_DESC,
            f"field '{key}.histogram.counts' has {len(counts)} entries, expected {len(buckets)} (one per bucket)",
        )
    values: list[float] = []
    for j, (bucket, count) in enumerate(zip(buckets, counts)):
        name = f"{key}.histogram.buckets"
        if not isinstance(bucket, list) or len(bucket) != 2:
            raise fail(source, FMT_DESC, f"field '{name}' index {j}: expected [lo, hi], got {show(bucket)}")
        lo = _number(bucket[0], f"{name}[{j}][0]", source, time)
        hi = _number(bucket[1], f"{name}[{j}][1]", source, time)
        if lo > hi:
            raise fail(source, FMT_DESC, f"field '{name}' index {j}: lo {show(bucket[0])} above hi {show(bucket[1])}")
        c = as_count(count, f"{key}.histogram.counts", j, source, FMT_DESC)
        if not c:
            continue
        # endpoints clips values below the first edge into bin 0, so it reaches down to min
        cut_lo = low if j == 0 else max(lo, low)
        cut_hi = min(hi, high)
        if cut_lo > cut_hi:
            raise fail(
                source,
                FMT_DESC,
                f"field '{key}.histogram.counts' index {j}: {c} sample(s) in bin [{lo!r}, {hi!r}] outside "
                f"[{key}.min, {key}.max] = [{low!r}, {high!r}]",
            )
        values.extend([(cut_lo + cut_hi) / 2] * c)
    n = len(values)
    if not n:
        return None
    total, avg = stat.get("total"), stat.get("avg")
    if type(total) in (int, float) and type(avg) in (int, float) and avg > 0 and math.isfinite(total / avg):
        implied = total / avg
        if abs(implied - n) > 0.5 + 1e-9 * n:
            raise fail(
                source,
                FMT_DESC,
                f"field '{key}.histogram.counts': the counts sum to {n} but total/avg = {implied:.6g} samples",
            )
    values.sort()
    return {"values": values, "min": low, "max": high, "n": n, "key": key, "shown_max": show(stat["max"])}


def _align(series: dict[str, Any], n: int, pad: float | None, notes: list[str]) -> list[float]:
    """A series' sorted values spread over `n` rank-ordered rows (see the module docstring)."""
    values, m, key = series["values"], series["n"], series["key"]
    if m == n:
        return values
    if m < n and pad is not None:
        notes.append(f"'{key}' has {m} samples for {n} rows: the {n - m} lowest-latency rows get {pad}")
        return [pad] * (n - m) + values
    notes.append(f"'{key}' has {m} samples for {n} rows: resampled by quantile (row i gets quantile (i + 0.5) / {n})")
    return [values[min(m - 1, int((i + 0.5) * m / n))] for i in range(n)]


def _load(run_config: Any, source: str, notes: list[str]) -> tuple[float, int | None]:
    """(request_rate, max_concurrency) from `run_config.load_pattern`."""
    if run_config is None:
        notes.append("no run_config (written since endpoints #377): request_rate NaN, max_concurrency None")
        return math.nan, None
    if not isinstance(run_config, dict):
        raise fail(source, FMT_DESC, f"field 'run_config': expected an object, got {show(run_config)}")
    pattern = run_config.get("load_pattern")
    if not isinstance(pattern, dict):
        raise fail(source, FMT_DESC, f"field 'run_config.load_pattern': expected an object, got {show(pattern)}")
    kind = pattern.get("type")
    concurrency = concurrency_value(
        pattern.get("target_concurrency"), "run_config.load_pattern.target_concurrency", source, FMT_DESC
    )
    if kind not in _CONCURRENCY_PATTERNS:
        concurrency = None  # load_generator/strategy.py applies target_concurrency to these two patterns only
    if kind == "poisson":
        rate = rate_value(pattern.get("target_qps"), "run_config.load_pattern.target_qps", source, FMT_DESC)
    elif kind in _INF_PATTERNS:
        rate = math.inf
    else:
        rate = math.nan
    notes.append(f"load pattern {kind!r}")
    return rate, concurrency


def looks_like(obj: Any) -> bool:
    """True for an object with endpoints' `n_samples_issued`, `n_samples_completed` and `latency`."""
    return isinstance(obj, dict) and all(k in obj for k in MARKER_KEYS)


__all__ = ["FMT_DESC", "TOOL", "looks_like", "read_mlcommons_result_summary"]
