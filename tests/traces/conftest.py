"""Fixtures for tests/traces: small request tables and JSONL files written in tmp_path."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytest


@pytest.fixture
def write_trace(tmp_path: Path) -> Callable[..., Path]:
    """Factory: write `lines` (str, joined with newlines) to tmp_path/name and return the path."""

    def _write(lines: Sequence[str], name: str = "trace.jsonl", newline: str = "\n") -> Path:
        path = tmp_path / name
        path.write_bytes((newline.join(lines) + newline).encode("utf-8"))
        return path

    return _write


@pytest.fixture
def make_requests() -> Callable[..., pd.DataFrame]:
    """Factory: a request table with the given arrivals (defaults: prompt 100, output 10, hash_ids [])."""

    def _make(
        arrival_s: Sequence[float],
        prompt_tokens: Sequence[int] | None = None,
        output_tokens: Sequence[int] | None = None,
    ) -> pd.DataFrame:
        n = len(arrival_s)
        return pd.DataFrame(
            {
                "request_id": np.arange(n, dtype=np.int64),
                "arrival_s": np.asarray(arrival_s, dtype=np.float64),
                "prompt_tokens": np.asarray(prompt_tokens if prompt_tokens is not None else [100] * n, dtype=np.int64),
                "output_tokens": np.asarray(output_tokens if output_tokens is not None else [10] * n, dtype=np.int64),
                "hash_ids": pd.Series([[] for _ in range(n)], dtype=object),
            }
        )

    return _make
