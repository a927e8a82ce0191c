"""workload.servegen: ServeGen arrivals in a scenario (validation, seeding, a tiny simulated run)."""

from __future__ import annotations

import pytest

from sim.config import ScenarioError, load_scenario
from sim.run import simulate_policy
from sim.workload import load_workload

SERVEGEN = [
    "workload.trace=null",
    "workload.time_scale=1",
    "workload.servegen.target_rate_per_s=1",
    "workload.servegen.duration_s=10",
    "workload.servegen.start_s=3600",
    "serving.prefill=colocated",
    "run.progress=false",
    "policies=[sglang]",
]


def test_a_servegen_scenario_simulates():
    scenario = load_scenario("default", SERVEGEN)
    workload = load_workload(scenario)
    assert 3 <= len(workload) <= 40 and workload.attrs["source"] == "servegen"
    assert workload.attrs["slice"] == "language_m_large" and workload.attrs["start_s"] == 3600
    result = simulate_policy(scenario, workload, "sglang")
    assert len(result.requests) == len(workload)
    assert result.summary["policy"] == "sglang"


def test_seeded_from_the_scenario_seed():
    a = load_workload(load_scenario("default", SERVEGEN))
    b = load_workload(load_scenario("default", SERVEGEN))
    c = load_workload(load_scenario("default", [*SERVEGEN, "seed=1"]))
    assert a["arrival_s"].equals(b["arrival_s"]) and not a["arrival_s"].equals(c["arrival_s"])


def test_lengths_from_a_shipped_trace():
    own = load_workload(load_scenario("default", SERVEGEN))
    swapped = load_workload(load_scenario("default", [*SERVEGEN, "workload.servegen.lengths=mooncake_conversation"]))
    assert own["arrival_s"].equals(swapped["arrival_s"])
    assert swapped.attrs["lengths"] != "servegen" and swapped["prompt_tokens"].mean() > own["prompt_tokens"].mean()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            SERVEGEN[1:],
            "not workload.trace and workload.servegen (trace is 'mooncake_conversation', set workload.trace: null)",
        ),
        (
            [
                *SERVEGEN,
                "workload.synthetic.num_requests=2",
                "workload.synthetic.rate_per_s=1",
                "workload.synthetic.prompt_tokens_mean=9",
                "workload.synthetic.output_tokens_mean=9",
            ],
            "not workload.synthetic and workload.servegen",
        ),
        ([SERVEGEN[0], *SERVEGEN[2:]], "workload.time_scale (0.6) applies to a trace, not to workload.servegen"),
        ([*SERVEGEN, "workload.end_s=5"], "workload.end_s (5.0) applies to a trace, not to workload.servegen"),
        ([*SERVEGEN, "workload.servegen.lengths=nope"], "workload.servegen.lengths: no such trace file"),
        ([*SERVEGEN, "workload.servegen.slice=nope"], "workload.servegen: no such ServeGen slice folder"),
        ([*SERVEGEN, "workload.servegen.start_s=1209595"], "workload.servegen: ServeGen slice 'language_m_large'"),
    ],
)
def test_one_line_errors(overrides, expected):
    with pytest.raises(ScenarioError) as err:
        load_workload(load_scenario("default", overrides))
    assert expected in str(err.value) and "\n" not in str(err.value).strip()
