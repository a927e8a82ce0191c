"""The workload a scenario describes: a trace (or seeded synthetic or ServeGen arrivals), then shaped.

Open-loop traces are cut and rescaled by ``traces.shape_requests`` (window, ``max_requests``, time scale or
target rate, prompt-length filter); a session trace comes back as a session table cut by
``traces.shape_sessions`` and is replayed closed loop (sim/serving/sessions.py). Every row dropped or
changed on the way is counted in the table's ``attrs`` (``traces.trace_notes`` prints them).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

import traces
from sim.config import Scenario, ScenarioError, SessionsSpec
from traces.servegen_traffic import servegen_requests


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
            if s.max_concurrency is not None:  # each request a one-turn session, gated by the client's slots
                df = df.assign(session_id=df["request_id"].astype(str), turn=0, think_time_s=0.0)
                df.attrs["max_concurrency"] = s.max_concurrency
                return df
        elif w.servegen is not None:  # ServeGen's per-client arrivals (traces/servegen_traffic.py), own seeded stream
            df = _servegen_table(scenario)
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


def _servegen_table(scenario: Scenario) -> pd.DataFrame:
    """The request table of ``workload.servegen``; its errors name workload.servegen (or its ``lengths``)."""
    g = scenario.workload.servegen
    lengths_from = None
    if g.lengths != "servegen":
        try:
            lengths_from = traces.load_trace(g.lengths)
        except ValueError as exc:
            raise ScenarioError(f"workload.servegen.lengths: {exc} (or 'servegen')") from None
    rng = np.random.default_rng([scenario.seed, 0x5E6E])
    try:
        return servegen_requests(
            g.slice, g.target_rate_per_s, g.duration_s, rng, start_s=g.start_s, lengths_from=lengths_from
        )
    except ValueError as exc:  # TraceError included
        raise ScenarioError(f"workload.servegen: {exc}") from None


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
