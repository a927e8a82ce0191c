"""A real server's benchmark run, replayed in the simulator and compared like for like (``validate --measured``).

A :class:`traces.measured.MeasuredRun` (SGLang ``bench_serving``, ``vllm bench serve``, guidellm, inference-perf, vLLM
request spans) records what each request asked for and what the server gave it. :func:`replay_workload` rebuilds the
offered load from it — the requests' lengths, and their send times where the file records them, else the recorded
rate (Poisson, seeded), the client's concurrency cap (a closed loop) or everything at once — and
:func:`simulate_measured` simulates that workload on a scenario's model, card, TP and serving mode.
:func:`validation_table` compares the two with the tools' own definitions:

- TTFT, E2E: per request; TPOT: per request (E2E − TTFT) / (output − 1); each as mean, p50 and p99 over the
  successful requests;
- ITL: every gap between a request's successive tokens, pooled over requests (mean, p50, p99); the simulator's token
  times are the ends of the decode steps between a request's first token and its finish (:func:`token_gaps`);
- throughput: output tokens and requests of the successful requests over the time they took, first send to last
  finish, on both sides (the tool's ``duration`` where the file records no send times).

:func:`measured_from_result` turns a simulated run into a :class:`MeasuredRun` (so it can be written in a real format
and read back: the round trip the tests check).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from sim.config import Scenario, load_scenario
from traces.measured import MeasuredRun
from traces.measured.schema import build_requests

VALIDATION_COLUMNS = ["metric", "measured", "simulated", "error_pct"]
LATENCIES = ("ttft", "tpot", "itl", "e2e")
STATS = {"mean": None, "p50": 50.0, "p99": 99.0}
POISSON_STREAM = 0x3EA5  # the replayed Poisson arrivals' own generator, beside the scenario's seed
MAX_SPAN_S = 7 * 86400.0  # send times spread over more than a week are not one benchmark run


def replay_workload(run: MeasuredRun, seed: int = 0, max_seq_len: int | None = None) -> tuple[pd.DataFrame, list[str]]:
    """The request table that reproduces ``run``'s offered load, and notes on what was assumed.

    Args:
        run: a measured run; failed requests and requests with no output tokens are left out, with a note (the
            measured figures, :func:`run_metrics`, count successful requests only).
        seed: seed of the Poisson arrivals when the file records a rate but no send times.
        max_seq_len: the scenario model's longest context; longer requests are left out, with a note.

    Returns:
        (request table: ``request_id``, ``arrival_s``, ``prompt_tokens``, ``output_tokens`` — plus the session
        columns and ``attrs["max_concurrency"]`` when the client capped its requests in flight — , notes).

    Raises:
        ValueError: no request of the run succeeded with output tokens, every one is longer than ``max_seq_len``,
            or the recorded send times span more than :data:`MAX_SPAN_S`.
    """
    req = run.requests
    keep = req["success"].to_numpy(bool) & (req["output_tokens"].to_numpy() > 0)
    notes = list(run.notes)
    if not keep.all():
        notes.append(f"{int((~keep).sum())} failed request(s) or request(s) without output tokens left out of the "
                     "replay and of the measured figures")  # fmt: skip
    req = req[keep].reset_index(drop=True)
    if not len(req):
        raise ValueError(f"{run.source_path}: no request succeeded with output tokens; nothing to replay")
    if max_seq_len is not None:
        long = (req["prompt_tokens"] + req["output_tokens"]).to_numpy() > max_seq_len
        if long.all():
            i = int(np.argmax(long))
            raise ValueError(
                f"{run.source_path}: every request is longer than the model's max_seq_len {max_seq_len} (request {i}: "
                f"{int(req['prompt_tokens'][i])} + {int(req['output_tokens'][i])} tokens); is the scenario's model "
                "the server's?"
            )
        if long.any():
            notes.append(f"{int(long.sum())} request(s) longer than the model's max_seq_len {max_seq_len} left out")
            req = req[~long].reset_index(drop=True)
    n = len(req)
    load = run.load
    if load == "trace":
        arrival_s = req["arrival_s"].fillna(0.0).to_numpy(dtype=float)
        arrival_s = arrival_s - arrival_s.min()
        if arrival_s.max() > MAX_SPAN_S:
            i = int(np.argmax(arrival_s))
            raise ValueError(
                f"{run.source_path}: send times span {arrival_s.max():.3g} s (request {i} is sent last); more than "
                f"{MAX_SPAN_S:.0f} s is not one benchmark run"
            )
    elif load == "rate":
        rng = np.random.default_rng([seed, POISSON_STREAM])
        arrival_s = np.concatenate(([0.0], np.cumsum(rng.exponential(1.0 / run.request_rate, n - 1))))
        notes.append(f"arrivals: Poisson at the recorded {run.request_rate:g} req/s (seed {seed}); no send times")
    else:
        arrival_s = np.zeros(n)
        notes.append("arrivals: all at once (no rate or send times recorded)" if load == "all_at_once" else
                     f"arrivals: closed loop at the recorded concurrency {run.max_concurrency}")  # fmt: skip
    table = pd.DataFrame({
        "request_id": np.arange(n, dtype=np.int64), "arrival_s": arrival_s,
        "prompt_tokens": req["prompt_tokens"].to_numpy(dtype=np.int64),
        "output_tokens": req["output_tokens"].to_numpy(dtype=np.int64), "hash_ids": [None] * n,
    })  # fmt: skip
    order = np.argsort(table["arrival_s"].to_numpy(), kind="stable")
    table = table.iloc[order].reset_index(drop=True)
    if run.max_concurrency is not None:  # each request a one-turn session, gated by the client's slots
        table = table.assign(session_id=table["request_id"].astype(str), turn=0, think_time_s=0.0)
        table.attrs["max_concurrency"] = int(run.max_concurrency)
    return table, notes


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


def measured_scenario(scenario: str | None, overrides: list[str], policy: str) -> Scenario:
    """The scenario a measured run is replayed on: ``scenario`` + ``overrides``, one policy, every table kept.

    Raises:
        ScenarioError: bad overrides, or a policy the scenario does not define.
    """
    return load_scenario(scenario, [*overrides, f"policies={policy}", "run.tables=all", "run.progress=false"])


def simulate_measured(run: MeasuredRun, scenario: Scenario, seed: int = 0):
    """Replay ``run`` on ``scenario``'s first policy: (PolicyResult, the replayed workload, notes).

    Raises:
        ScenarioError, CapacityError: as :func:`sim.run.simulate_policy`.
    """
    from sim.run import simulate_policy

    workload, notes = replay_workload(run, seed, scenario.model.max_seq_len)
    result = simulate_policy(scenario, workload, scenario.policies[0])
    if not np.isfinite(result.requests["finish_s"].to_numpy(float)).any():
        reasons = result.requests["unfinished_reason"].dropna().unique().tolist()
        raise ValueError(
            f"{run.source_path}: no replayed request finished in the simulation ({', '.join(map(str, reasons))}); "
            "check the scenario's model, card and serving mode"
        )
    return result, workload, notes


def token_gaps(requests: pd.DataFrame, steps: pd.DataFrame) -> list[np.ndarray]:
    """Per request, the gaps (s) between its successive tokens in a simulation: the ends of the decode steps after its
    first token up to its finish (float64 [output − 1] each; a request whose steps do not match its token count —
    pre-empted and re-admitted — gets its TPOT as every gap)."""
    decode = steps[steps["phase"] == "decode"]
    ends = np.sort((decode["start_s"] + decode["duration_s"]).to_numpy())
    gaps = []
    for first, finish, out in zip(requests["first_token_s"], requests["finish_s"], requests["output_tokens"],
                                  strict=True):  # fmt: skip
        if not (math.isfinite(first) and math.isfinite(finish)) or out < 2:
            gaps.append(np.zeros(0))
            continue
        lo, hi = np.searchsorted(ends, first, side="right"), np.searchsorted(ends, finish, side="right")
        times = ends[lo:hi]
        if len(times) == out - 1:
            gaps.append(np.diff(np.concatenate(([first], times))))
        else:
            gaps.append(np.full(out - 1, (finish - first) / (out - 1)))
    return gaps


def measured_from_result(result, workload: pd.DataFrame, tool: str = "pulseinfer_simulate") -> MeasuredRun:
    """A simulated run as a :class:`MeasuredRun` (send times, TTFT, ITLs as the tools record them)."""
    req = result.requests.set_index("request_id").loc[workload["request_id"]].reset_index()
    itl = token_gaps(req, result.steps)
    ttft = (req["first_token_s"] - req["arrival_s"]).to_numpy()
    e2e = (req["finish_s"] - req["arrival_s"]).to_numpy()
    ok = np.isfinite(e2e)
    table = build_requests(
        req["prompt_tokens"].to_numpy(), req["output_tokens"].to_numpy(), req["arrival_s"].to_numpy(), ttft, e2e,
        [g if k else None for g, k in zip(itl, ok, strict=True)], ok.tolist(),
    )  # fmt: skip
    finished = req["finish_s"].to_numpy(float)
    duration_s = float(np.nanmax(finished) - np.nanmin(req["arrival_s"])) if np.isfinite(finished).any() else math.nan
    cap = workload.attrs.get("max_concurrency")
    return MeasuredRun(table, tool, math.inf, cap, duration_s, None, "pulseinfer", len(table), {}, "<simulated>")


def _stat(values: np.ndarray, stat: str) -> float:
    values = values[np.isfinite(values)]
    if not len(values):
        return math.nan
    q = STATS[stat]
    return float(values.mean()) if q is None else float(np.percentile(values, q))


def run_metrics(run: MeasuredRun) -> dict[str, float]:
    """Mean, p50 and p99 of TTFT, TPOT, ITL (pooled) and E2E in ms over the successful requests, and the output
    and request throughput over the run's duration."""
    req = run.requests[run.requests["success"]]
    out: dict[str, float] = {}
    columns = {"ttft": req["ttft_s"].to_numpy(float), "tpot": req["tpot_s"].to_numpy(float),
               "e2e": req["e2e_s"].to_numpy(float)}  # fmt: skip
    gaps = [np.asarray(g, dtype=float) for g in req["itl_s"] if g is not None and len(g)]
    columns["itl"] = np.concatenate(gaps) if gaps else np.zeros(0)
    for name in LATENCIES:
        for stat in STATS:
            out[f"{name}_{stat}_ms"] = _stat(columns[name], stat) * 1e3
    out["output_throughput_tok_s"] = float(req["output_tokens"].sum()) / _span_s(run, req)
    out["request_throughput_req_s"] = len(req) / _span_s(run, req)
    return out


def _span_s(run: MeasuredRun, req: pd.DataFrame) -> float:
    """The time the successful requests took, first send to last finish, where send times and E2E are recorded
    (both sides of a comparison measured the same way); else the tool's own ``duration``."""
    ends = (req["arrival_s"] + req["e2e_s"]).to_numpy(float)
    if len(req) and np.isfinite(ends).all() and req["arrival_s"].notna().all():
        span = float(ends.max() - req["arrival_s"].min())
        if span > 0:
            return span
    return run.duration_s if run.duration_s and math.isfinite(run.duration_s) and run.duration_s > 0 else math.nan


def validation_table(measured: MeasuredRun, simulated: MeasuredRun) -> pd.DataFrame:
    """``metric, measured, simulated, error_pct`` for every metric both runs have (NaN where one lacks it)."""
    a, b = run_metrics(measured), run_metrics(simulated)
    rows = []
    for metric in a:
        m, s = a[metric], b[metric]
        error = (s - m) / m * 100 if math.isfinite(m) and math.isfinite(s) and m else math.nan
        rows.append({"metric": metric, "measured": m, "simulated": s, "error_pct": error})
    return pd.DataFrame(rows, columns=VALIDATION_COLUMNS)
