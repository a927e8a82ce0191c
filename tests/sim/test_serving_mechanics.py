"""Serving mechanics that shape real curves: a client's concurrency cap and mixed chunked prefill."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sim.config import load_scenario
from sim.run import simulate

BASE = [
    "policies=sglang", "serving.prefill=colocated", "workload.trace=null", "workload.time_scale=1",
    "workload.synthetic.num_requests=40", "workload.synthetic.rate_per_s=100000",
    "workload.synthetic.prompt_tokens_mean=4000", "workload.synthetic.prompt_tokens_cv=0",
    "workload.synthetic.output_tokens_mean=100", "workload.synthetic.output_tokens_cv=0", "run.progress=false",
    "model=llama-3.1-8b", "hardware=h100-sxm", "run.debug_checks=true",
]  # fmt: skip


def _run(*extra: str):
    return simulate(load_scenario("default", [*BASE, *extra])).policies["sglang"]


@pytest.mark.parametrize("cap", [1, 4])
def test_a_concurrency_cap_keeps_at_most_that_many_requests_in_flight(cap):
    req = _run(f"workload.synthetic.max_concurrency={cap}").requests
    assert len(req) == 40 and req["finish_s"].notna().all()
    events = sorted([(t, 1) for t in req["arrival_s"]] + [(t, -1) for t in req["finish_s"]], key=lambda e: (e[0], e[1]))
    in_flight = np.cumsum([d for _, d in events])
    assert in_flight.max() == cap  # and the cap is reached
    # a closed loop: each request is sent when one finishes, so arrivals spread over the run
    assert req["arrival_s"].max() > 0.5 * req["finish_s"].max()


def test_mixed_prefill_keeps_decoding_while_a_prompt_is_prefilled():
    plain, mixed = _run(), _run("serving.mixed_prefill=true")
    for r in (plain, mixed):
        assert r.requests["finish_s"].notna().all()
    # prefill-first stops decode for every forward; mixing charges only the chunk's FLOPs to the step
    p_steps, m_steps = plain.steps, mixed.steps
    prefill_s = m_steps[m_steps["phase"] == "prefill"]["duration_s"].to_numpy()
    assert prefill_s[0] > 0 and (prefill_s[1:] == 0).all()  # the first runs alone (nothing decodes yet); then mixed
    # prefill-first runs every queued prompt before the first decode step; mixing decodes the early ones meanwhile
    first_decode = lambda steps: steps[steps["phase"] == "decode"]["start_s"].min()  # noqa: E731
    assert first_decode(m_steps) < first_decode(p_steps)
    assert mixed.requests["finish_s"].min() < plain.requests["finish_s"].min()


def test_mixed_prefill_is_off_by_default_and_only_changes_colocated_runs():
    assert load_scenario("default").serving.mixed_prefill is False
    a = _run("serving.prefill=disaggregated")
    b = _run("serving.prefill=disaggregated", "serving.mixed_prefill=true")
    assert pd.Series(a.summary).equals(pd.Series(b.summary))
