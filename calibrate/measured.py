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

from calibrate.measured_server import chunked_stream
from sim.config import Scenario, load_scenario
from traces.measured import MeasuredRun
from traces.measured.prefix import PREFIX_BLOCK_TOKENS
from traces.measured.schema import build_requests

VALIDATION_COLUMNS = ["metric", "measured", "simulated", "error_pct"]
LATENCIES = ("ttft", "tpot", "itl", "e2e")
STATS = {"mean": None, "p50": 50.0, "p99": 99.0}
POISSON_STREAM = 0x3EA5  # the replayed Poisson arrivals' own generator, beside the scenario's seed
MAX_SPAN_S = 7 * 86400.0  # send times spread over more than a week are not one benchmark run
QUEUE_FLOOR_MS = 1.0  # a measured queue time below this has no relative error worth printing
UNORDERED_TOOL = "mlcommons_endpoints"  # its rows are rebuilt from histograms, in latency order, not send order
ORDER_STREAM = 0x0D3E  # the generator that shuffles such rows into a send order, beside the scenario's seed
# --set keys a measured replay cannot honour: the file gives the load and what is compared, --policy the policy
NOT_REPLAYED = ("workload", "slo", "cost", "policies", "serving.router", "run.tables", "run.workers", "run.max_")


def replay_workload(
    run: MeasuredRun, seed: int = 0, max_seq_len: int | None = None, prefix_share: float | None = None
) -> tuple[pd.DataFrame, list[str]]:
    """The request table that reproduces ``run``'s offered load, and notes on what was assumed.

    Args:
        run: a measured run; failed requests and requests with no output tokens are left out, with a note (the
            measured figures, :func:`run_metrics`, count successful requests only).
        seed: seed of the Poisson arrivals when the file records a rate but no send times.
        max_seq_len: the scenario model's longest context; longer requests are left out, with a note.
        prefix_share: a prompt prefix every request shares (:func:`prefix_chains`): a share of each prompt
            (0 < x < 1) or a token count (x >= 1); None: what the file records (prompt texts, cached tokens).

    Returns:
        (request table: ``request_id``, ``source_id`` (the measured request's ``request_id``), ``arrival_s``,
        ``prompt_tokens``, ``output_tokens``, ``hash_ids`` — plus the session columns and
        ``attrs["max_concurrency"]`` when the client capped its requests in flight, and ``attrs["hash_block_tokens"]``
        and ``attrs["warm_prefixes"]`` when the replay knows prefixes — , notes).

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
    if run.tool == UNORDERED_TOOL:  # rows in latency order: sent in a seeded random order instead
        rank = {rid: i for i, rid in enumerate(send_order(run, seed))}
        req = req.iloc[np.argsort(req["request_id"].map(rank).to_numpy(), kind="stable")].reset_index(drop=True)
        notes.append(f"send order: the rows were rebuilt from histograms in latency order; sent shuffled (seed {seed})")
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
    chains, warm, prefix_notes = prefix_chains(req, prefix_share)
    notes.extend(prefix_notes)
    table = pd.DataFrame({
        "request_id": np.arange(n, dtype=np.int64), "source_id": req["request_id"].to_numpy(dtype=np.int64),
        "arrival_s": arrival_s, "prompt_tokens": req["prompt_tokens"].to_numpy(dtype=np.int64),
        "output_tokens": req["output_tokens"].to_numpy(dtype=np.int64), "hash_ids": chains,
    })  # fmt: skip
    order = np.argsort(table["arrival_s"].to_numpy(), kind="stable")
    table = table.iloc[order].reset_index(drop=True)
    if any(c is not None for c in chains):
        table["hash_ids"] = [c if c is not None else () for c in table["hash_ids"]]
        table.attrs["hash_block_tokens"] = PREFIX_BLOCK_TOKENS
        # the server's cache before the run: earliest senders last, so they are the most recently used
        table.attrs["warm_prefixes"] = [warm[i] for i in order[::-1] if warm[i]]
    if run.max_concurrency is not None:  # each request a one-turn session, gated by the client's slots
        table = table.assign(session_id=table["request_id"].astype(str), turn=0, think_time_s=0.0)
        table.attrs["max_concurrency"] = int(run.max_concurrency)
    return table, notes


def prefix_chains(
    req: pd.DataFrame, prefix_share: float | None
) -> tuple[list[tuple[int, ...] | None], list[tuple[tuple[int, ...], int]], list[str]]:
    """The replay's prefix-cache view of each request (sim/serving/prefix.py; blocks of
    :data:`traces.measured.prefix.PREFIX_BLOCK_TOKENS` tokens), from, in order of precedence:

    - ``prefix_share``: every prompt starts with the same prefix, ``prefix_share`` of its tokens (0 < x < 1) or
      that many tokens (x >= 1), capped at the prompt; the first request to arrive computes it, later ones hit it;
    - the prompt texts (``prefix_ids``): prompts share exactly the blocks their texts share;
    - neither: no chains (no prefix cache effect), unless cached tokens are recorded.

    Cached tokens the server reported (``cached_tokens``) are what its cache held when the request came: those
    blocks of the request's chain (its own, if it has none) are put in the cache before the run (warm prefixes).

    Returns:
        (per request its hash chain or None, per request its warm (chain, tokens) or None, notes).
    """
    n = len(req)
    block = PREFIX_BLOCK_TOKENS
    prompts = req["prompt_tokens"].to_numpy(dtype=np.int64)
    notes: list[str] = []
    chains: list[tuple[int, ...] | None] = [None] * n
    if prefix_share is not None:
        shared = np.minimum(prompts, prefix_share if prefix_share >= 1 else np.floor(prefix_share * prompts))
        shared_blocks = (shared // block).astype(int)
        chains = [(*range(k), -(i + 1)) for i, k in enumerate(shared_blocks)]  # a unique block after the shared ones
        what = f"{prefix_share:g} token(s)" if prefix_share >= 1 else f"{prefix_share:.0%} of each prompt"
        notes.append(f"prefix: every prompt starts with the same prefix ({what}; --prefix-share); the prefix cache "
                     f"holds it after its first prefill")  # fmt: skip
        if not shared_blocks.any():
            notes.append(f"prefix: --prefix-share {prefix_share:g} is shorter than one {block}-token block of every "
                         "prompt: the cache holds whole blocks, so it changes nothing")  # fmt: skip
        whole = int((prompts <= prefix_share).sum()) if prefix_share >= 1 else 0
        if whole:
            notes.append(f"prefix: --prefix-share {prefix_share:g} is as long as {whole} of {n} prompts (median "
                         f"{int(np.median(prompts)):,} tokens): shared whole but their last token")  # fmt: skip
    elif "prefix_ids" in req.columns and req["prefix_ids"].notna().any():
        chains = [tuple(c) if c is not None else None for c in req["prefix_ids"]]
        notes.append("prefix: shared prompt prefixes found from the prompt texts go through the prefix cache")
    cached = req["cached_tokens"].to_numpy(dtype=float) if "cached_tokens" in req.columns else np.full(n, np.nan)
    warm: list[tuple[tuple[int, ...], int] | None] = [None] * n
    hits = np.isfinite(cached) & (cached >= block)
    if hits.any():
        for i in np.flatnonzero(hits):
            k = int(min(cached[i], prompts[i] - 1) // block)
            chain = chains[i] or ()
            if len(chain) < k:  # the recorded hit is longer than the chain known: its own blocks, unique to it
                chain = (*chain, -(i + 1), *range(k - len(chain) - 1))
            chains[i] = chain
            warm[i] = (tuple(chain[:k]), k * block)
        notes.append(f"prefix: the server reported cache hits on {int(hits.sum())} request(s) "
                     f"({int(cached[hits].sum()):,} tokens); those blocks are cached when the run starts")  # fmt: skip
    return chains, warm, notes


def check_replay_overrides(overrides: list[str]) -> None:
    """Refuse a ``--set`` key a measured replay cannot honour (:data:`NOT_REPLAYED`: the file gives the load and what
    is compared, ``--policy`` the policy).

    Raises:
        ScenarioError: one line naming the key and what a replay takes.
    """
    from sim.config import ScenarioError

    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key.startswith(NOT_REPLAYED):
            raise ScenarioError(
                f"--set {key}: a measured replay takes its load and its comparison from the file, so {key} does not "
                "apply (it takes the model, hardware, engine, serving.tp_size, serving.prefill, policy.*, "
                "run.horizon_s and seed; the policy is --policy)"
            )


def measured_scenario(scenario: str | None, overrides: list[str], policy: str) -> Scenario:
    """The scenario a measured run is replayed on: ``scenario`` + ``overrides``, one policy, every table kept.

    Raises:
        ScenarioError: bad overrides, a policy the scenario does not define, or ``serving.replicas`` > 1.
    """
    from sim.config import ScenarioError

    scn = load_scenario(scenario, [*overrides, f"policies={policy}", "run.tables=all", "run.progress=false"])
    if scn.serving.replicas > 1:  # a fleet keeps no step tables, which the replay's token gaps come from
        raise ScenarioError(f"serving.replicas: {scn.serving.replicas}: a measured run is replayed on one server; "
                            "give each replica's benchmark file on its own (set serving.replicas=1)")  # fmt: skip
    return scn


def simulate_measured(run: MeasuredRun, scenario: Scenario, seed: int = 0, prefix_share: float | None = None):
    """Replay ``run`` on ``scenario``'s first policy: (PolicyResult, the replayed workload, notes).
    ``prefix_share``: as :func:`replay_workload`.

    Raises:
        ScenarioError, CapacityError: as :func:`sim.run.simulate_policy`.
    """
    from sim.run import simulate_policy

    workload, notes = replay_workload(run, seed, scenario.model.max_seq_len, prefix_share)
    if workload.attrs.get("hash_block_tokens") and not getattr(
        scenario.policy[scenario.policies[0]], "prefix_cache", False
    ):
        notes.append(f"prefix: the replay knows shared prefixes but the scenario's prefix cache is off "
                     f"(engine {scenario.engine.name}); they are computed every time")  # fmt: skip
    result = simulate_policy(scenario, workload, scenario.policies[0])
    if scenario.run.horizon_s is not None:
        cut = int(horizon_cut(result.requests.set_index("request_id").reindex(workload["request_id"].to_numpy())).sum())
        if cut:
            notes.append(f"run.horizon_s {scenario.run.horizon_s:g} s cut {cut} of {len(workload)} replayed requests "
                         "(not sent or not finished by then): they are left out of both sides")  # fmt: skip
    if not np.isfinite(result.requests["finish_s"].to_numpy(float)).any():
        reasons = result.requests["unfinished_reason"].dropna().unique().tolist()
        raise ValueError(
            f"{run.source_path}: no replayed request finished in the simulation ({', '.join(map(str, reasons))}); "
            "check the scenario's model, card and serving mode"
        )
    return result, workload, notes


def horizon_cut(requests: pd.DataFrame) -> np.ndarray:
    """Per row of a simulation's request table reindexed on the workload: cut by ``run.horizon_s`` (never arrived,
    or unfinished when the horizon came)."""
    from sim.metrics.outcomes import HORIZON

    return (requests["arrival_s"].isna() | (requests["unfinished_reason"] == HORIZON)).to_numpy()


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
    """A simulated run as a :class:`MeasuredRun` (send times, TTFT, ITLs as the tools record them). Requests that
    ``run.horizon_s`` cut (never sent, or unfinished at the horizon) are not in it (:func:`horizon_cut`)."""
    req = result.requests.set_index("request_id").reindex(workload["request_id"].to_numpy())
    cut = horizon_cut(req)
    req, workload = req[~cut].rename_axis("request_id").reset_index(), workload[~cut]
    itl = token_gaps(req, result.steps)
    ttft = (req["first_token_s"] - req["arrival_s"]).to_numpy()
    e2e = (req["finish_s"] - req["arrival_s"]).to_numpy()
    ok = np.isfinite(e2e)
    table = build_requests(
        req["prompt_tokens"].to_numpy(), req["output_tokens"].to_numpy(), req["arrival_s"].to_numpy(), ttft, e2e,
        [g if k else None for g, k in zip(itl, ok, strict=True)], ok.tolist(),
    )  # fmt: skip
    table["queue_s"] = (req["scheduled_s"] - req["arrival_s"]).to_numpy(float)  # arrival to first admitted
    if "source_id" in workload.columns:  # the measured request each simulated one replays
        table["source_id"] = workload["source_id"].to_numpy(dtype=np.int64)
    finished = req["finish_s"].to_numpy(float)
    duration_s = float(np.nanmax(finished) - np.nanmin(req["arrival_s"])) if np.isfinite(finished).any() else math.nan
    cap = workload.attrs.get("max_concurrency")
    return MeasuredRun(table, tool, math.inf, cap, duration_s, None, "pulseinfer", len(table), {}, "<simulated>")


def send_order(run: MeasuredRun, seed: int = 0) -> np.ndarray:
    """The request_ids of ``run`` in the order they were sent, as far as the file says: its row order, except for
    rows rebuilt from histograms (MLCommons endpoints: sorted by latency, not sent so), which are shuffled by a
    generator seeded with ``seed``."""
    ids = run.requests["request_id"].to_numpy()
    if run.tool == UNORDERED_TOOL:
        return ids[np.random.default_rng([seed, ORDER_STREAM]).permutation(len(ids))]
    return ids


def window_ids(run: MeasuredRun, share: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray, str]:
    """Split a run's successful requests into an early and a late window, the late one ``share`` of them:
    (early request_ids, late request_ids, the late window in words). Requests are ordered by when they happened as
    the file records it: their send time where recorded; all at once, their finish (E2E); else their send order
    (:func:`send_order`). The whole run is always replayed; a window only says which requests are scored (never a
    subset replayed cold).
    """
    req = run.requests[run.requests["success"] & (run.requests["output_tokens"] > 0)]
    if run.load == "trace":
        key, what = req["arrival_s"].to_numpy(float), "sent last"
    elif run.load == "all_at_once":
        key, what = req["e2e_s"].fillna(np.inf).to_numpy(float), "finished last"
    else:
        rank = {rid: i for i, rid in enumerate(send_order(run, seed))}
        key, what = req["request_id"].map(rank).to_numpy(float), "sent last (send order)"
    order = np.argsort(key, kind="stable")
    ids = req["request_id"].to_numpy()[order]
    cut = max(1, min(len(ids) - 1, int(round(len(ids) * (1 - share)))))
    return ids[:cut], ids[cut:], f"the {len(ids) - cut} requests {what} of {run.source_path}"


def _stat(values: np.ndarray, stat: str) -> float:
    values = values[np.isfinite(values)]
    if not len(values):
        return math.nan
    q = STATS[stat]
    return float(values.mean()) if q is None else float(np.percentile(values, q))


def run_metrics(run: MeasuredRun, scored: np.ndarray | None = None, window: bool | None = None) -> dict[str, float]:
    """Mean, p50 and p99 of TTFT, TPOT, ITL (pooled) and E2E in ms over the successful requests, and the output
    and request throughput over the run's duration.

    ``scored``: the measured ``request_id`` s to score (a window of the run, :func:`window_ids`; a simulated run's
    requests are matched by their ``source_id``); None scores every request. A window's throughput is its requests'
    tokens over their own span, first send to last finish, which needs send times (NaN without them); ``window``
    False says ``scored`` is the whole run less what the replay left out (its duration stands). Default: whether
    ``scored`` is given."""
    req = run.requests[run.requests["success"]]
    window = scored is not None if window is None else window
    if scored is not None:
        key = "source_id" if "source_id" in req.columns else "request_id"
        req = req[req[key].isin(scored)]
    out: dict[str, float] = {}
    columns = {"ttft": req["ttft_s"].to_numpy(float), "tpot": req["tpot_s"].to_numpy(float),
               "e2e": req["e2e_s"].to_numpy(float)}  # fmt: skip
    gaps = [np.asarray(g, dtype=float) for g in req["itl_s"] if g is not None and len(g)]
    columns["itl"] = np.concatenate(gaps) if gaps else np.zeros(0)
    if "queue_s" in req.columns and np.isfinite(req["queue_s"].to_numpy(float)).any():  # server-side records
        columns["queue"] = req["queue_s"].to_numpy(float)
        columns["prefill"] = columns["ttft"] - columns["queue"]
    for name in [*LATENCIES, *(k for k in ("queue", "prefill") if k in columns)]:
        for stat in STATS:
            out[f"{name}_{stat}_ms"] = _stat(columns[name], stat) * 1e3
    span_s = _span_s(run, req, window)
    out["output_throughput_tok_s"] = float(req["output_tokens"].sum()) / span_s
    out["request_throughput_req_s"] = len(req) / span_s
    return out


def _span_s(run: MeasuredRun, req: pd.DataFrame, window: bool = False) -> float:
    """The time the successful requests took, first send to last finish, where send times and E2E are recorded
    (both sides of a comparison measured the same way; a run sent all at once was sent at 0); else, for the whole
    run, the tool's own ``duration`` (NaN for a window)."""
    arrivals = req["arrival_s"].fillna(0.0) if run.load == "all_at_once" else req["arrival_s"]
    ends = (arrivals + req["e2e_s"]).to_numpy(float)
    if len(req) and np.isfinite(ends).all() and arrivals.notna().all():
        span = float(ends.max() - arrivals.min())
        if span > 0:
            return span
    if window:
        return math.nan
    return run.duration_s if run.duration_s and math.isfinite(run.duration_s) and run.duration_s > 0 else math.nan


def validation_table(measured: MeasuredRun, simulated: MeasuredRun, scored: np.ndarray | None = None) -> pd.DataFrame:
    """``metric, measured, simulated, error_pct`` for every metric both runs have (NaN where one lacks it), over the
    measured requests ``scored`` (None: all; :func:`run_metrics`)."""
    window = scored is not None  # a window's throughput needs send times; the whole run's has the tool's duration
    if "source_id" in simulated.requests.columns:  # only what was replayed is compared, on both sides
        replayed = simulated.requests["source_id"].to_numpy()
        scored = replayed if scored is None else np.intersect1d(scored, replayed)
    a, b = run_metrics(measured, scored, window), run_metrics(simulated, scored, window)
    if chunked_stream(measured, ids=scored) is not None:  # per chunk, not per token: not the replay's ITL
        a.update({k: math.nan for k in a if k.startswith("itl_")})
    rows = []
    for metric in [m for m in a if m in b or not m.startswith(("queue", "prefill"))]:
        m, s = a[metric], b[metric]
        error = (s - m) / m * 100 if math.isfinite(m) and math.isfinite(s) and m else math.nan
        if metric.startswith("queue") and not m >= QUEUE_FLOOR_MS:  # a share of a near-zero wait says nothing
            error = math.nan
        rows.append({"metric": metric, "measured": m, "simulated": s, "error_pct": error})
    return pd.DataFrame(rows, columns=VALIDATION_COLUMNS)
