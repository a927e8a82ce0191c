"""Fixtures for search, plan and cluster tests: tiny synthetic workloads on the shipped default scenario."""

from __future__ import annotations

from pathlib import Path

import pytest

from study.search import SearchConfig
from study.slo import TailSlo
from study.space import parse_space

# 30 requests, 12k-token prompts, 40 output tokens, colocated prefill: one simulation takes ~0.1 s.
TINY = [
    "workload.trace=null",
    "workload.time_scale=1",
    "workload.synthetic.num_requests=30",
    "workload.synthetic.rate_per_s=5",
    "workload.synthetic.prompt_tokens_mean=12000",
    "workload.synthetic.output_tokens_mean=40",
    "serving.prefill=colocated",
    "run.progress=false",
]

# Constant lengths (cv = 0), short prompts: queueing, and so TTFT, grows with the arrival rate.
CONSTANT = [
    "workload.trace=null",
    "workload.time_scale=1",
    "workload.synthetic.num_requests=30",
    "workload.synthetic.rate_per_s=2",
    "workload.synthetic.prompt_tokens_mean=4000",
    "workload.synthetic.output_tokens_mean=30",
    "workload.synthetic.prompt_tokens_cv=0",
    "workload.synthetic.output_tokens_cv=0",
    "serving.prefill=colocated",
    "run.progress=false",
]

TINY_SPACE = {
    "params": {
        "policy.pulseinfer.budget_tokens": {"low": 512, "high": 2048, "step": 512},
        "policy.pulseinfer.max_running_requests": {"choices": [2, 8, 64]},
    }
}


@pytest.fixture
def tiny_overrides() -> list[str]:
    return list(TINY)


@pytest.fixture
def constant_overrides() -> list[str]:
    return list(CONSTANT)


@pytest.fixture
def tiny_space_data() -> dict:
    return {"params": dict(TINY_SPACE["params"])}


@pytest.fixture
def tiny_config(tmp_path: Path):
    """Factory: a SearchConfig on the tiny workload with a journal file under tmp_path."""

    def make(name: str = "study", objective: str = "goodput", storage: Path | None = None, seed: int = 0):
        return SearchConfig(
            scenario="default",
            space=parse_space(TINY_SPACE),
            slo=TailSlo(tpot_p99_s=2.0),  # the tiny workload's colocated 12K prefills hold decode ~1.4 s at p99
            storage=str(storage or tmp_path / f"{name}.journal"),
            study_name=name,
            objective=objective,
            overrides=tuple(TINY),
            seed=seed,
        )

    return make
