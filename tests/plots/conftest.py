"""Small hand-made result tables for the figure tests (shapes match what ``pulseinfer simulate`` writes)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

POLICIES = ["sglang", "headwise", "pulseinfer"]  # sglang never recalls


@pytest.fixture
def requests_df() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for k, policy in enumerate(POLICIES):
        for i in range(30):
            tpot = np.nan if i == 0 else 0.01 * (10 ** (2 - k)) * rng.lognormal(0, 0.5)
            rows.append({"policy": policy, "request_id": i, "ttft_s": 0.2 + 0.05 * i, "tpot_s": tpot})
    return pd.DataFrame(rows)


@pytest.fixture
def steps_df() -> pd.DataFrame:
    rows = []
    for k, policy in enumerate(POLICIES):
        for i in range(60):
            recall = 0 if policy == "sglang" else (1 + i % 5) * 2e8 * k
            rows.append(
                {
                    "policy": policy, "step_id": i, "phase": "prefill" if i % 10 == 0 else "decode",
                    "start_s": 0.5 * i, "duration_s": 0.4, "batch_size": 8 + k + i % 3,
                    "recall_bytes": recall, "link_busy_s": 0.0 if policy == "sglang" else 0.3,
                    "hbm_used_bytes": (60 + k * 10) * 2**30, "host_used_bytes": 0 if policy == "sglang" else 2**33,
                }
            )  # fmt: skip
    return pd.DataFrame(rows)


@pytest.fixture
def summary_df() -> pd.DataFrame:
    return pd.DataFrame({"policy": ["sglang", "headwise", "full_offload", "pulseinfer"],
                         "decode_tokens_per_s": [1000.0, 1200.0, 800.0, 1500.0]})  # fmt: skip


@pytest.fixture
def layer_recall_df() -> pd.DataFrame:
    rows = [
        (policy, 10.0 * t, layer, 0 if policy == "sglang" else 1e8 * (layer + t))
        for policy in POLICIES
        for t in range(12)
        for layer in range(8)
    ]
    return pd.DataFrame(rows, columns=["policy", "time_s", "layer", "recall_bytes"])


@pytest.fixture
def timeline_df() -> pd.DataFrame:
    rows = []
    for policy in ["headwise", "pulseinfer"]:
        for step in range(3):
            t0 = step * 1.0
            for layer in range(8):
                start = t0 + layer * 1e-3
                rows.append((policy, step, layer, "transfer", start, start + 6e-4, False))
                if layer % 3 == 1:  # a pre-empted second piece
                    rows.append((policy, step, layer, "transfer", start + 6e-4, start + 8e-4, True))
                rows.append((policy, step, layer, "compute", start + 8e-4, start + 1.7e-3, False))
    cols = ["policy", "step_id", "layer", "kind", "start_s", "end_s", "preempted"]
    return pd.DataFrame(rows, columns=cols)
