"""traces.measured.vllm_requests: per-request vLLM server timestamps (requests.jsonl + meta.json).

Fixture ``fixtures/measured/vllm_requests/``: the first 8 lines of casys-kaist/LLMServingSim
``bench/examples/RTX4090/Llama-3.1-8B/vllm/requests.jsonl`` at 5daddb21a545658d5150b535712d0494584b5278 (a real
``python -m bench run`` of vLLM 0.19.0), plus one line ``bench-8`` with every timestamp null (the shape
``bench/core/runner.py`` ``_record_from_metrics`` writes for a request whose stream returned no metrics; added here);
``meta.json`` is that run's, with ``resolved_config`` cut to ``cache_config`` and ``scheduler_config`` and
``num_requests`` set to 9. Schema: ``bench/core/recorder.py`` at the same commit.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from traces.measured import (
    MEASURED_FORMATS,
    MeasuredFormatError,
    detect_iteration_file,
    detect_measured_format,
    read_measured,
    read_vllm_requests,
)
from traces.measured.vllm_requests import TOOL

FIXTURES = Path(__file__).parent / "fixtures" / "measured"
RUN_DIR = FIXTURES / "vllm_requests"
REQUESTS = RUN_DIR / "requests.jsonl"

# bench-0 .. bench-7 of the fixture: (arrival_time, queued_ts, scheduled_ts, first_token_ts, last_token_ts)
QUEUED_0, FIRST_0, LAST_0 = 27536.660701067, 27537.350135653, 27554.231018618
QUEUED_7, FIRST_7, LAST_7 = 27537.553478264, 27537.899056186, 27553.709921682
LATEST_LAST = 27562.305334095  # bench-2 and bench-3


def _one_line(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_reads_the_engine_timestamps_anchored_at_queued_ts():
    run = read_vllm_requests(REQUESTS)
    df = run.requests
    assert (run.tool, run.backend, run.model) == (TOOL, "vllm", "meta-llama/Llama-3.1-8B")
    assert run.num_prompts == len(df) == 9 and df["request_id"].tolist() == list(range(9))
    assert df["prompt_tokens"].tolist() == [2358, 1034, 1320, 685, 298, 399, 1307, 1379, 1200]
    assert df["output_tokens"].tolist() == [531, 769, 769, 769, 526, 520, 758, 519, 300]
    # arrival_time is epoch seconds, the rest monotonic: ttft and e2e are measured from queued_ts
    assert df["ttft_s"].iloc[0] == pytest.approx(FIRST_0 - QUEUED_0, abs=1e-9)
    assert df["e2e_s"].iloc[0] == pytest.approx(LAST_0 - QUEUED_0, abs=1e-9)
    assert df["tpot_s"].iloc[0] == pytest.approx((LAST_0 - FIRST_0) / 530, abs=1e-12)
    assert df["ttft_s"].iloc[7] == pytest.approx(FIRST_7 - QUEUED_7, abs=1e-9)
    assert df["e2e_s"].iloc[7] == pytest.approx(LAST_7 - QUEUED_7, abs=1e-9)
    # send times: the server's own arrival_time, rebased to the first request's
    assert df["arrival_s"].iloc[0] == 0.0
    assert df["arrival_s"].iloc[1] == pytest.approx(1787267980.3478317 - 1787267980.0827403, abs=1e-6)
    assert df["itl_s"].isna().all() and df["cached_tokens"].isna().all()
    assert df["success"].tolist() == [True] * 8 + [False]
    failed = df.iloc[8]
    assert math.isnan(failed["ttft_s"]) and math.isnan(failed["e2e_s"]) and math.isnan(failed["arrival_s"])
    assert run.duration_s == pytest.approx(LATEST_LAST - QUEUED_0, abs=1e-9)
    assert math.isnan(run.request_rate) and run.max_concurrency is None and run.load == "trace"
    assert any("anchored at queued_ts" in note for note in run.notes)
    assert any("1 request(s) without a first and last token" in note for note in run.notes)


def test_meta_json_gives_the_engine_and_the_resolved_config():
    run = read_vllm_requests(RUN_DIR)  # the folder works as well as the file
    assert run.engine == "vllm-0.19.0"
    meta = run.summary["meta"]
    assert meta["kv_cache"]["num_gpu_blocks"] == 2588 and meta["kv_cache"]["block_size"] == 16
    assert meta["engine_kwargs"]["max_num_seqs"] == 256 and meta["engine_kwargs"]["max_num_batched_tokens"] == 2048
    assert meta["resolved_config"]["scheduler_config"]["enable_chunked_prefill"] is True
    assert run.summary["vllm_version"] == "0.19.0"


def test_without_meta_json_the_engine_is_vllm_without_a_version(tmp_path):
    shutil.copy(REQUESTS, tmp_path / "requests.jsonl")
    run = read_vllm_requests(tmp_path / "requests.jsonl")
    assert run.engine == "vllm" and run.model is None and run.summary == {"meta": {}}
    assert any("no meta.json" in note for note in run.notes)


# ---------------------------------------------------------------------------------------------------------------
# Detection


def test_detection_picks_the_format_from_the_content_and_the_folder(tmp_path):
    assert TOOL in MEASURED_FORMATS
    assert detect_measured_format(REQUESTS) == TOOL
    assert detect_measured_format(RUN_DIR) == TOOL
    renamed = tmp_path / "x.txt"
    renamed.write_bytes(REQUESTS.read_bytes())
    assert detect_measured_format(renamed) == TOOL
    run = read_measured(RUN_DIR)
    assert run.tool == TOOL and len(run.requests) == 9
    assert not detect_iteration_file(REQUESTS)


@pytest.mark.parametrize(
    "name",
    [
        "sglang_bench_serving.jsonl",
        "vllm_bench_serve.json",
        "guidellm_report.json",
        "inference_perf_per_request.json",
        "vllm_otel_spans.jsonl",
        "broken_sglang_no_details.jsonl",
        "broken_vllm_lengths.json",
        "forward_pass_metrics.jsonl",
        "forward_pass_recv.txt",
    ],
)
def test_no_other_fixture_is_detected_as_vllm_requests(name):
    try:
        fmt = detect_measured_format(FIXTURES / name)
    except MeasuredFormatError:
        return  # not a measured run at all (the forward-pass files)
    assert fmt != TOOL


# ---------------------------------------------------------------------------------------------------------------
# Round trip: a known table written in the recorder's layout reads back


def _write_requests(folder: Path, table: pd.DataFrame, *, epoch_offset: float, meta: dict | None = None) -> Path:
    """LLMServingSim's ``recorder.write_requests`` layout from a table of (arrival, queue wait, schedule wait, ttft
    after scheduling, decode time) in seconds: arrival_time on an epoch clock, the rest on a monotonic one
    (``epoch_offset`` apart; 0 puts both on one clock)."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "requests.jsonl").open("w") as f:
        for i, row in table.iterrows():
            arrival = float(row["arrival"])
            queued = arrival + float(row["queue_wait"])
            scheduled = queued + float(row["schedule_wait"])
            first = scheduled + float(row["prefill"])
            last = first + float(row["decode"])
            record = {
                "request_id": f"bench-{i}",
                "input_toks": int(row["prompt"]),
                "output_toks": int(row["output"]),
                "arrival_time": arrival + epoch_offset,
                "queued_ts": queued,
                "scheduled_ts": scheduled,
                "first_token_ts": first,
                "last_token_ts": last,
            }
            if "cached" in row:
                record["num_cached_tokens"] = int(row["cached"])
            f.write(json.dumps(record) + "\n")
    if meta is not None:
        (folder / "meta.json").write_text(json.dumps(meta, indent=2))
    return folder / "requests.jsonl"


def _known_table(n: int = 12, seed: int = 5) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "arrival": 5000.0 + np.cumsum(rng.exponential(0.4, size=n)),
            "queue_wait": rng.uniform(0.0, 0.002, size=n),
            "schedule_wait": rng.uniform(0.0, 0.3, size=n),
            "prefill": rng.uniform(0.02, 0.4, size=n),
            "decode": rng.uniform(0.5, 9.0, size=n),
            "prompt": rng.integers(100, 4000, size=n),
            "output": rng.integers(2, 800, size=n),
            "cached": rng.integers(0, 100, size=n),
        }
    )


@pytest.mark.parametrize("epoch_offset", [1.787e9, 0.0])
def test_write_then_read_returns_the_known_table(tmp_path, epoch_offset):
    table = _known_table()
    meta = {"schema_version": 1, "model": "Qwen/Qwen3-8B", "vllm_version": "0.11.0", "kv_cache": {"num_gpu_blocks": 9}}
    path = _write_requests(tmp_path / "run", table, epoch_offset=epoch_offset, meta=meta)
    assert detect_measured_format(path) == TOOL
    run = read_measured(path)
    df = run.requests
    assert df["prompt_tokens"].tolist() == table["prompt"].tolist()
    assert df["output_tokens"].tolist() == table["output"].tolist()
    assert df["cached_tokens"].tolist() == table["cached"].astype(float).tolist()
    np.testing.assert_allclose(df["arrival_s"], table["arrival"] - table["arrival"].iloc[0], atol=1e-6)
    # on two clocks the anchor is queued_ts; on one clock it is the arrival (so the queue wait counts in ttft)
    anchor_wait = table["schedule_wait"] + (table["queue_wait"] if epoch_offset == 0.0 else 0.0)
    np.testing.assert_allclose(df["ttft_s"], anchor_wait + table["prefill"], atol=1e-6)
    np.testing.assert_allclose(df["e2e_s"], anchor_wait + table["prefill"] + table["decode"], atol=1e-6)
    np.testing.assert_allclose(df["tpot_s"], table["decode"] / (table["output"] - 1), rtol=1e-6)
    assert df["success"].all() and run.engine == "vllm-0.11.0" and run.model == "Qwen/Qwen3-8B"
    assert any(f"anchored at {'arrival_time' if epoch_offset == 0.0 else 'queued_ts'}" in n for n in run.notes)


# ---------------------------------------------------------------------------------------------------------------
# Bad input: one line naming file, line, field and index


def _lines() -> list[dict]:
    return [json.loads(line) for line in REQUESTS.read_text().splitlines()]


def _broken(tmp_path: Path, index: int, **changes) -> Path:
    lines = _lines()
    for key, value in changes.items():
        if value is KeyError:
            del lines[index][key]
        else:
            lines[index][key] = value
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.parametrize(
    ("index", "changes", "expected"),
    [
        (
            3,
            {"first_token_ts": 27537.0},
            r"line 4: a vLLM per-request timestamps requests\.jsonl: field 'first_token_ts' index 3: 27537\.0 is "
            r"before 'scheduled_ts' 27537\.221853495 \(timestamps go backwards\)",
        ),
        (5, {"last_token_ts": 27537.5}, r"field 'last_token_ts' index 5: 27537\.5 is before 'first_token_ts'"),
        (1, {"scheduled_ts": 27530.0}, r"field 'scheduled_ts' index 1: .* before 'queued_ts'"),
        (2, {"output_toks": KeyError}, r"not a vLLM per-request timestamps requests\.jsonl: missing 'output_toks' at "),
        (0, {"queued_ts": KeyError}, r"missing 'queued_ts' at index 0"),
        (4, {"input_toks": -5}, r"field 'input_toks' index 4: expected a non-negative integer, got -5$"),
        (6, {"output_toks": 12.5}, r"field 'output_toks' index 6: expected a non-negative integer, got 12\.5$"),
        (0, {"last_token_ts": float("nan")}, r"field 'last_token_ts' index 0: expected a finite time stamp"),
        (0, {"first_token_ts": float("inf")}, r"field 'first_token_ts' index 0: expected a finite time stamp"),
        (2, {"last_token_ts": None}, r"field 'last_token_ts' index 2: missing while 'first_token_ts' is set$"),
        (2, {"scheduled_ts": None}, r"field 'first_token_ts' index 2: set to .* while the earlier 'scheduled_ts'"),
        (1, {"num_cached_tokens": 5000}, r"field 'num_cached_tokens' index 1: 5000 cached tokens for a prompt of 1034"),
    ],
)
def test_bad_values_are_one_line_errors_naming_the_field(tmp_path, index, changes, expected):
    path = _broken(tmp_path, index, **changes)
    with pytest.raises(MeasuredFormatError) as excinfo:
        read_measured(path)
    message = _one_line(excinfo)
    assert message.startswith(f"{path} line {index + 1}: ")
    assert re.search(expected, message), message


def test_arrival_after_queued_on_one_clock_goes_backwards(tmp_path):
    table = _known_table(n=3)
    path = _write_requests(tmp_path, table, epoch_offset=0.0)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    lines[1]["arrival_time"] = lines[1]["queued_ts"] + 0.5
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(MeasuredFormatError, match=r"field 'queued_ts' index 1: .* before 'arrival_time'"):
        read_vllm_requests(path)


def test_a_broken_meta_json_is_named(tmp_path):
    shutil.copy(REQUESTS, tmp_path / "requests.jsonl")
    (tmp_path / "meta.json").write_text("[1, 2]")
    with pytest.raises(MeasuredFormatError) as excinfo:
        read_vllm_requests(tmp_path)
    assert re.search(
        r"meta\.json: the meta\.json of a vLLM requests\.jsonl run: expected one JSON object", _one_line(excinfo)
    )


def test_wrong_file_for_the_reader_says_what_is_missing():
    with pytest.raises(
        MeasuredFormatError, match=r"not a vLLM per-request timestamps requests\.jsonl: missing 'input_toks'"
    ):
        read_vllm_requests(FIXTURES / "vllm_otel_spans.jsonl")
