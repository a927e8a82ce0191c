"""The shipped traces reproduce the statistics published in traces/data/README.md."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from traces import SHIPPED_TRACES, load_trace, trace_stats
from traces.registry import DATA_DIR


@pytest.fixture(scope="module")
def mooncake_conversation() -> pd.DataFrame:
    return load_trace("mooncake_conversation")


@pytest.fixture(scope="module")
def mooncake_stats(mooncake_conversation: pd.DataFrame) -> dict[str, float]:
    return trace_stats(mooncake_conversation)


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("rows", 5719),
        ("span_s", 1797),
        ("prompt_tokens_mean", 12870),
        ("prompt_tokens_p50", 7640),
        ("prompt_tokens_p90", 28638),
        ("prompt_tokens_p99", 91207),
        ("prompt_tokens_max", 123192),
        ("output_tokens_mean", 346),
        ("output_tokens_p50", 356),
        ("output_tokens_p90", 608),
        ("output_tokens_p99", 1105),
        ("output_tokens_max", 2000),
    ],
)
def test_mooncake_conversation_count_statistic_matches_readme(mooncake_stats, key, expected):
    assert round(mooncake_stats[key]) == expected


@pytest.mark.parametrize(
    ("key", "expected_percent"),
    [("share_prompt_over_8k", 47.9), ("share_prompt_over_32k", 7.7)],
)
def test_mooncake_conversation_long_prompt_share_matches_readme(mooncake_stats, key, expected_percent):
    assert round(100 * mooncake_stats[key], 1) == expected_percent


def test_mooncake_conversation_rate_matches_readme(mooncake_stats):
    assert round(mooncake_stats["rate_per_s"], 3) == 3.183


def test_mooncake_conversation_is_sorted_without_blank_lines(mooncake_conversation):
    assert mooncake_conversation.attrs["num_resorted"] == 0
    assert mooncake_conversation.attrs["num_blank_lines"] == 0


def test_mooncake_conversation_keeps_hash_ids(mooncake_conversation):
    assert mooncake_conversation["hash_ids"].iloc[0] == list(range(14))


# Every shipped trace against traces/data/README.md: rows, then the
# statistics rounded as printed there (tokens to integers, shares to 0.1 %, rate to 3 decimals).
README_STATS = {
    "azure_code_2023": {
        "rows": 5740, "span_s": 1788, "rate": 3.210,
        "prompt": (2028, 1460, 5012, 7436, 7437), "output": (27, 13, 53, 247, 1899), "over": (0.0, 0.0, 0.0),
    },
    "azure_conv_2023": {
        "rows": 10108, "span_s": 1800, "rate": 5.616,
        "prompt": (1243, 1033, 4076, 4123, 14050), "output": (217, 134, 427, 610, 1000), "over": (0.0, 0.0, 0.0),
    },
    "ragpulse_week1": {
        "rows": 3800, "span_s": 604371, "rate": 0.006,
        "prompt": (3021, 3166, 3922, 5269, 6467), "output": (256, 201, 508, 795, 1843), "over": (0.0, 0.0, 0.0),
    },
    "claude_code_sessions": {
        "rows": 1437, "span_s": None, "rate": None,
        "prompt": (93732, 95737, 139386, 154958, 196860), "output": (355, 210, 696, 2690, 9183),
        "over": (100.0, 95.2, 18.8),
    },
    "mooncake_conversation": {
        "rows": 5719, "span_s": 1797, "rate": 3.183,
        "prompt": (12870, 7640, 28638, 91207, 123192), "output": (346, 356, 608, 1105, 2000), "over": (47.9, 7.7, 0.0),
    },
}  # fmt: skip


def test_readme_table_covers_every_shipped_trace():
    assert set(README_STATS) == set(SHIPPED_TRACES)


@pytest.fixture(scope="module")
def shipped_tables() -> dict[str, pd.DataFrame]:
    return {name: load_trace(name) for name in SHIPPED_TRACES}


@pytest.fixture(scope="module")
def shipped_stats(shipped_tables) -> dict[str, dict[str, float]]:
    return {name: trace_stats(df) for name, df in shipped_tables.items()}


@pytest.mark.parametrize("name", list(README_STATS))
def test_shipped_trace_statistics_match_readme(shipped_stats, name):
    stats, expected = shipped_stats[name], README_STATS[name]
    assert stats["rows"] == expected["rows"]
    if expected["span_s"] is None:
        assert math.isnan(stats["span_s"]) and math.isnan(stats["rate_per_s"])
    else:
        assert round(stats["span_s"]) == expected["span_s"]
        assert round(stats["rate_per_s"], 3) == expected["rate"]
    keys = ("mean", "p50", "p90", "p99", "max")
    assert tuple(round(stats[f"prompt_tokens_{k}"]) for k in keys) == expected["prompt"]
    assert tuple(round(stats[f"output_tokens_{k}"]) for k in keys) == expected["output"]
    shares = tuple(round(100 * stats[f"share_prompt_over_{k}"], 1) for k in ("8k", "32k", "128k"))
    assert shares == expected["over"]


def test_claude_code_sessions_session_statistics_match_readme(shipped_stats):
    stats = shipped_stats["claude_code_sessions"]
    assert stats["num_sessions"] == 15
    assert stats["num_subagent_requests"] == 96
    assert stats["requests_per_session_p50"] == 52
    assert round(stats["session_span_s_p50"] / 60) == 87  # "session length median 87 min"


def test_shipped_readers_report_no_skipped_rows(shipped_tables):
    for name, df in shipped_tables.items():
        attrs = df.attrs
        assert attrs.get("num_blank_lines", 0) == 0, name
        assert attrs.get("num_skipped_zero_prompt", 0) == 0, name


def test_every_shipped_trace_has_a_licence_file():
    licences = {p.name for p in (DATA_DIR / "LICENSES").iterdir()}
    assert licences == {
        "kvcache-ai_Mooncake_LICENSE-APACHE",
        "Azure_AzurePublicDataset_LICENSE_CC-BY-4.0",
        "flashserve_RAGPulse_LICENSE_MIT",
        "callanjfox_kv-cache-tester_LICENSE_Apache-2.0",
    }
