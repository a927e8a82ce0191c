"""Fixtures for simulator tests: small scenarios built from the shipped cards."""

from __future__ import annotations

import pytest

from sim.config import load_scenario


@pytest.fixture
def one_request_scenario():
    """Factory: one request (constant lengths) on the shipped default, colocated prefill, debug checks on."""

    def make(prompt_tokens: int = 20000, output_tokens: int = 50, *overrides: str):
        return load_scenario(
            "default",
            [
                "workload.trace=null",
                "workload.time_scale=1",
                "workload.synthetic.num_requests=1",
                "workload.synthetic.rate_per_s=1",
                f"workload.synthetic.prompt_tokens_mean={prompt_tokens}",
                f"workload.synthetic.output_tokens_mean={output_tokens}",
                "workload.synthetic.prompt_tokens_cv=0",
                "workload.synthetic.output_tokens_cv=0",
                "serving.prefill=colocated",
                "run.debug_checks=true",
                "run.progress=false",
                *overrides,
            ],
        )

    return make
