"""The shipped mooncake_conversation slice reproduces the statistics published in traces/data/README.md."""

from __future__ import annotations

import pandas as pd
import pytest

from traces import load_trace, trace_stats


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
