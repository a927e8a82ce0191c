"""``simulate(scenario) -> SimResult``: load the workload, run each policy on its own replica, tabulate.

An open-loop workload is submitted at its recorded arrival times (``Replica.arrivals``); a session trace is
replayed closed loop by ``sim.sessions.SessionDriver`` (requests issued as earlier ones finish), with session
start times from a generator of their own, so every policy is offered the same sessions at the same times.

Each policy gets a fresh SimPy environment and a generator seeded from ``(scenario.seed, policy index)``,
so policies do not share random streams and the same seed gives identical tables.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import simpy

import traces
from sim.config import Scenario, ScenarioError, SessionsSpec, dump_scenario
from sim.metrics import (
    SUMMARY_COLUMNS,
    Recorder,
    layer_recall_table,
    layers_table,
    requests_table,
    steps_table,
    summarize,
    timeline_table,
)
from sim.policies import make_policy
from sim.serving.replica import Replica, Request
from sim.serving.sessions import SessionDriver, session_starts

BASELINE = "sglang"
INCOMPLETE_REASONS = ("horizon", "stuck")  # set by collect_unfinished; any other reason is a rejection
OFFLOAD_BASELINE = "headwise"  # the representative existing offloader
TABLES = {
    "requests": "requests",
    "steps": "steps",
    "layers": "layers",
    "layer_recall": "layer_recall",
    "timeline": "timeline",
}
RATIO_COLUMNS = {
    "decode_tokens_per_s": "throughput_vs_sglang",
    "goodput_requests_per_s": "goodput_vs_sglang",
    "tpot_mean_s": "tpot_mean_vs_sglang",
    "tpot_p99_s": "tpot_p99_vs_sglang",
}


@dataclass
class PolicyResult:
    """Tables of one policy's run."""

    requests: pd.DataFrame
    steps: pd.DataFrame
    summary: dict
    layers: pd.DataFrame  # per layer totals: recall bytes, fragments, stall
    layer_recall: pd.DataFrame  # recall bytes per (time bin, layer)
    timeline: pd.DataFrame  # intervals of one decode step that recalls


@dataclass
class SimResult:
    """Everything a run produced; :meth:`write` puts it on disk."""

    scenario: Scenario
    workload: pd.DataFrame
    policies: dict[str, PolicyResult] = field(default_factory=dict)

    @property
    def summary(self) -> pd.DataFrame:
        """One row per policy, columns :data:`sim.metrics.SUMMARY_COLUMNS`."""
        return pd.DataFrame([r.summary for r in self.policies.values()], columns=SUMMARY_COLUMNS)

    def write(self, out_dir: Path) -> None:
        """Write summary.csv, then requests/steps/layers/layer_recall.csv (with a ``policy`` column) and
        scenario.yaml."""
        out_dir.mkdir(parents=True, exist_ok=True)
        self.summary.to_csv(out_dir / "summary.csv", index=False)
        for name, table in TABLES.items():
            frames = [getattr(r, table).assign(policy=p) for p, r in self.policies.items()]
            df = pd.concat(frames, ignore_index=True)
            df = df[["policy"] + [c for c in df.columns if c != "policy"]]
            df.to_csv(out_dir / f"{name}.csv", index=False)
        dump_scenario(self.scenario, out_dir / "scenario.yaml")


def load_workload(scenario: Scenario) -> pd.DataFrame:
    """The request table the scenario describes (trace or synthetic, then shaped).

    A session trace (``traces.is_session_table``) comes back as a session table, cut by
    ``traces.shape_sessions`` (``sessions.max_sessions``, the prompt-length filter, ``sessions.max_think_time_s``);
    :func:`simulate_policy` replays it closed loop.

    Raises:
        ScenarioError: if the trace is missing or malformed, a key does not apply to the trace (window or time
            scale on a session trace, ``sessions`` on an open-loop one), or shaping removes every request.
    """
    w = scenario.workload
    try:
        if w.synthetic is not None:
            s = w.synthetic
            rng = np.random.default_rng([scenario.seed, 0xA11])
            df = traces.synthetic_requests(
                s.num_requests, s.rate_per_s, s.prompt_tokens_mean, s.output_tokens_mean, rng,
                prompt_tokens_cv=s.prompt_tokens_cv, output_tokens_cv=s.output_tokens_cv,
            )  # fmt: skip
        else:
            columns = w.columns.model_dump() if w.columns is not None else None
            df = traces.load_trace(w.trace, w.format, columns=columns, week=w.week)
        if traces.is_session_table(df):
            return _shape_sessions(scenario, df)
        if w.sessions is not None:
            raise ScenarioError(
                f"workload.sessions: trace {w.trace!r} is not a session trace (format {df.attrs.get('format')}); "
                "sessions apply to kvcache_tester session traces"
            )
        return traces.shape_requests(
            df,
            start_s=w.start_s,
            end_s=w.end_s,
            max_requests=w.max_requests,
            time_scale=w.time_scale,
            target_rate_per_s=w.target_rate_per_s,
            min_prompt_tokens=w.min_prompt_tokens,
            max_prompt_tokens=w.max_prompt_tokens,
        )
    except ScenarioError:
        raise
    except traces.TraceError as exc:
        raise ScenarioError(f"workload.trace: {exc}") from None
    except ValueError as exc:
        raise ScenarioError(f"workload: {exc}") from None


def _shape_sessions(scenario: Scenario, df: pd.DataFrame) -> pd.DataFrame:
    """Cut a session table as the scenario says; the open-loop keys that do not apply are errors."""
    w = scenario.workload
    open_loop = {
        "start_s": w.start_s,
        "end_s": w.end_s,
        "max_requests": w.max_requests,
        "time_scale": None if w.time_scale == 1.0 else w.time_scale,
        "target_rate_per_s": w.target_rate_per_s,
    }
    given = [key for key, value in open_loop.items() if value is not None]
    if given:
        raise ScenarioError(
            f"workload.{given[0]}: does not apply to session trace {w.trace!r} (sessions have no shared clock and "
            "are replayed closed loop); use workload.sessions (session_rate_per_s, max_concurrent_sessions, "
            "max_sessions, max_think_time_s)"
        )
    spec = w.sessions or SessionsSpec()
    return traces.shape_sessions(
        df,
        max_sessions=spec.max_sessions,
        min_prompt_tokens=w.min_prompt_tokens,
        max_prompt_tokens=w.max_prompt_tokens,
        max_think_time_s=spec.max_think_time_s,
    )


def simulate_policy(
    scenario: Scenario,
    workload: pd.DataFrame,
    policy_name: str,
    seed_index: int = 0,
    on_finish: Callable[[Request], None] | None = None,
) -> PolicyResult:
    """Run one policy over the workload on one replica.

    Raises:
        CapacityError: if the model does not fit in HBM.
    """
    env = simpy.Environment()
    policy = make_policy(scenario, policy_name)
    rng = np.random.default_rng([scenario.seed, seed_index])
    rec = Recorder(scenario.model.num_layers, scenario.run.layer_bin_s)
    driver: SessionDriver | None = None
    if traces.is_session_table(workload):  # closed loop: sessions issue requests as earlier ones finish
        replica = Replica(env, scenario, policy, [], rng, rec, on_finish)
        spec = scenario.workload.sessions or SessionsSpec()
        # Same session start times for every policy: a generator of their own, not the policy's.
        starts_rng = np.random.default_rng([scenario.seed, 0x5E55])
        starts = session_starts(workload["session_id"].nunique(), spec.session_rate_per_s, starts_rng)
        driver = SessionDriver(env, replica, workload, starts, spec.max_concurrent_sessions)
        env.process(driver.run())
    else:
        reqs = [
            Request(int(i), float(a), int(p), int(o))
            for i, a, p, o in zip(
                workload["request_id"],
                workload["arrival_s"],
                workload["prompt_tokens"],
                workload["output_tokens"],
            )
        ]
        replica = Replica(env, scenario, policy, reqs, rng, rec, on_finish)
        env.process(replica.arrivals())
    main = env.process(replica.run())
    horizon = scenario.run.horizon_s
    try:
        env.run(until=main if horizon is None else min_event(env, main, horizon))
        reason = "horizon"
    except RuntimeError:  # SimPy: no events left before `until` — nothing can make progress any more
        reason = "stuck"
    collect_unfinished(replica, rec, reason)
    if driver is not None:
        rec.requests.extend(driver.unissued(reason))
    requests = requests_table(rec.requests)
    if driver is not None:  # which session and turn each request belongs to
        requests = requests.merge(workload[["request_id", "session_id", "turn"]], on="request_id", how="left")
    steps = steps_table(rec)
    end_s = float(requests["finish_s"].max()) if horizon is None else env.now
    if np.isnan(end_s):
        end_s = env.now
    summary = summarize(
        policy_name,
        requests,
        steps,
        rec,
        scenario.slo,
        replica.fixed_hbm_bytes,
        replica.block_bytes,
        end_s,
        replica.device.peak,
    )
    return PolicyResult(requests, steps, summary, layers_table(rec), layer_recall_table(rec), timeline_table(rec))


def unfinished_counts(requests: pd.DataFrame) -> dict[str, int]:
    """``rejected``: requests that can never run here (refused on arrival or admission);
    ``incomplete``: requests cut by the horizon or left when the scheduler got stuck."""
    reason = requests["unfinished_reason"]
    incomplete = reason.isin(INCOMPLETE_REASONS)
    return {"rejected": int(((reason != "") & ~incomplete).sum()), "incomplete": int(incomplete.sum())}


def policy_summary(scenario: Scenario, workload: pd.DataFrame, policy_name: str, seed_index: int = 0) -> dict:
    """One policy on one replica: :func:`simulate_policy`'s summary row plus :func:`unfinished_counts`.

    Raises:
        CapacityError: if the model does not fit in HBM.
    """
    result = simulate_policy(scenario, workload, policy_name, seed_index=seed_index)
    return {**result.summary, **unfinished_counts(result.requests)}


def min_event(env: simpy.Environment, main: simpy.Process, horizon_s: float) -> simpy.Event:
    """An event that fires when ``main`` ends or at ``horizon_s``, whichever is first."""
    return env.any_of([main, env.timeout(horizon_s)])


def collect_unfinished(replica: Replica, rec: Recorder, reason: str) -> None:
    """Record the requests that arrived but neither finished nor were rejected, with ``reason``:
    ``"horizon"`` (the horizon cut them) or ``"stuck"`` (the scheduler could make no more progress)."""
    if len(replica.batch):
        replica.batch.remove(np.ones(len(replica.batch), dtype=bool))
    recorded = {r.request_id for r in rec.requests}
    for r in replica.submitted:
        if r.request_id not in recorded:
            r.unfinished_reason = reason
            rec.requests.append(r)


def simulate(scenario: Scenario, progress: Callable[[str, int], Callable[[Request], None]] | None = None) -> SimResult:
    """Simulate every policy of the scenario on the same workload.

    Args:
        scenario: a validated scenario.
        progress: optional factory ``(policy_name, num_requests) -> on_finish callback``.

    Raises:
        ScenarioError: bad workload input.
        CapacityError: the model does not fit on the hardware.
    """
    workload = load_workload(scenario)
    result = SimResult(scenario, workload)
    for i, name in enumerate(scenario.policies):
        on_finish = progress(name, len(workload)) if progress else None
        result.policies[name] = simulate_policy(scenario, workload, name, seed_index=i, on_finish=on_finish)
    return result


def with_ratios(summary: pd.DataFrame) -> pd.DataFrame:
    """Add ratio columns: ``*_vs_sglang`` for throughput, goodput and TPOT when sglang was run, and
    ``throughput_vs_headwise`` when the headwise baseline was run."""
    out = summary.copy()
    policies = set(summary["policy"])
    if BASELINE in policies:
        base = summary.set_index("policy").loc[BASELINE]
        for col, ratio in RATIO_COLUMNS.items():
            out[ratio] = out[col] / base[col]
    if OFFLOAD_BASELINE in policies:
        base = summary.set_index("policy").loc[OFFLOAD_BASELINE]
        out["throughput_vs_headwise"] = out["decode_tokens_per_s"] / base["decode_tokens_per_s"]
    return out
