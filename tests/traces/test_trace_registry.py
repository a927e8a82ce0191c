"""resolve_trace, load_trace, trace_stats and the package surface."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest

import traces
from traces import SHIPPED_TRACES, TraceError, detect_format, load_trace, resolve_trace, trace_stats
from traces.registry import DATA_DIR

GOOD_LINE = '{"timestamp": 0, "input_length": 10, "output_length": 2}'


def test_shipped_name_resolves_to_an_existing_data_file():
    path = resolve_trace("mooncake_conversation")
    assert path == DATA_DIR / "mooncake_conversation.jsonl"
    assert path.is_file()


def test_every_shipped_trace_file_exists():
    assert all((DATA_DIR / name).exists() for name in SHIPPED_TRACES.values())


def test_shipped_session_trace_resolves_to_its_folder():
    assert resolve_trace("claude_code_sessions").is_dir()


def test_existing_file_path_resolves_to_itself(write_trace):
    path = write_trace([GOOD_LINE])
    assert resolve_trace(str(path)) == path


def test_unknown_name_error_lists_shipped_names():
    with pytest.raises(TraceError) as info:
        resolve_trace("foo")
    assert str(info.value) == (
        "no such trace file or shipped trace name 'foo' (shipped: mooncake_conversation, azure_code_2023, "
        "azure_conv_2023, ragpulse_week1, claude_code_sessions)"
    )


def test_load_trace_auto_reads_jsonl_as_mooncake(write_trace):
    df = load_trace(str(write_trace([GOOD_LINE, GOOD_LINE])))
    assert len(df) == 2


def test_load_trace_explicit_format_ignores_extension(write_trace):
    df = load_trace(str(write_trace([GOOD_LINE], name="trace.txt")), fmt="mooncake")
    assert df["prompt_tokens"].tolist() == [10]


def test_load_trace_auto_with_unknown_extension_raises(write_trace):
    path = write_trace([GOOD_LINE], name="trace.txt")
    with pytest.raises(TraceError, match=r"cannot tell the trace format from extension '\.txt'.*pass fmt="):
        load_trace(str(path))


def test_unknown_format_error_lists_known_formats():
    known = "auto, mooncake, azure, ragpulse, kvcache_tester, burstgpt, csv, jsonl"
    with pytest.raises(TraceError, match=re.escape(f"unknown trace format 'parquet'; known: {known}")):
        load_trace("mooncake_conversation", fmt="parquet")


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("mooncake_conversation", "mooncake"),
        ("azure_code_2023", "azure"),
        ("azure_conv_2023", "azure"),
        ("ragpulse_week1", "ragpulse"),
        ("claude_code_sessions", "kvcache_tester"),
    ],
)
def test_detect_format_recognises_every_shipped_file(name, fmt):
    assert detect_format(resolve_trace(name)) == fmt


def test_week_with_a_format_other_than_ragpulse_raises():
    with pytest.raises(TraceError, match="week applies to RAGPulse traces"):
        load_trace("mooncake_conversation", week=1)


def test_a_folder_read_as_a_single_file_format_raises(tmp_path):
    with pytest.raises(TraceError, match="is a folder"):
        load_trace(str(tmp_path), fmt="mooncake")


def test_trace_stats_share_over_128k(make_requests):
    stats = trace_stats(make_requests([0.0, 1.0], prompt_tokens=[131072, 131073]))
    assert stats["share_prompt_over_128k"] == 0.5  # 131,072 itself is not over 128K


def test_trace_stats_of_a_small_table(make_requests):
    df = make_requests([2.0, 3.0, 6.0], prompt_tokens=[8192, 8193, 40000], output_tokens=[1, 2, 6])
    stats = trace_stats(df)
    assert stats["rows"] == 3
    assert stats["span_s"] == 4.0
    assert stats["rate_per_s"] == 0.75  # rows / span, as in traces/data/README.md
    assert stats["output_tokens_mean"] == 3.0
    assert stats["output_tokens_p50"] == 2.0
    assert stats["output_tokens_p90"] == pytest.approx(5.2)  # linear interpolation
    assert stats["prompt_tokens_max"] == 40000
    assert stats["share_prompt_over_8k"] == pytest.approx(2 / 3)  # 8192 itself is not over 8K
    assert stats["share_prompt_over_32k"] == pytest.approx(1 / 3)


def test_trace_stats_rate_is_nan_for_zero_span(make_requests):
    assert math.isnan(trace_stats(make_requests([1.0, 1.0]))["rate_per_s"])


def test_trace_stats_of_empty_table_raises(make_requests):
    with pytest.raises(ValueError, match="no rows"):
        trace_stats(make_requests([]))


def test_package_exports_the_public_api():
    assert set(traces.__all__) == {
        "FORMATS",
        "REQUEST_COLUMNS",
        "SESSION_COLUMNS",
        "SHIPPED_SERVEGEN_SLICES",
        "ServeGenSlice",
        "read_servegen",
        "servegen_requests",
        "SHIPPED_TRACES",
        "ColumnMap",
        "TraceError",
        "detect_format",
        "is_session_table",
        "load_trace",
        "read_azure",
        "read_burstgpt",
        "read_csv_trace",
        "read_jsonl_trace",
        "read_kvcache_tester",
        "read_mooncake",
        "read_ragpulse",
        "resolve_trace",
        "shape_requests",
        "shape_sessions",
        "synthetic_requests",
        "trace_notes",
        "trace_stats",
    }


def test_traces_imports_no_other_project_package():
    code = (
        "import sys, traces; "
        "bad = [m for m in ('sim', 'engine', 'pulseinfer', 'calibrate', 'plots', 'scenarios', 'torch') "
        "if m in sys.modules]; print(bad)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
