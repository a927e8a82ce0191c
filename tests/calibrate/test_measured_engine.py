"""The engine a measured file records (traces/measured/engine.py ``engine_from``) picks the replay's engine card
(calibrate/measured.py ``engine_overrides``) unless ``--set engine=`` is given; the phrase says where it came from."""

from __future__ import annotations

import pytest

from calibrate.measured_server import engine_overrides
from traces.measured.engine import engine_from


@pytest.mark.parametrize(
    ("backend", "summary", "engine"),
    [
        ("sglang", {"server_info": {"version": "0.5.5.post1"}}, "sglang-0.5.5.post1"),
        ("vllm", {"vllm_version": "0.9.2"}, "vllm-0.9.2"),
        ("openai-chat", {"vllm_version": "v0.9.2"}, "vllm-0.9.2"),  # the client's backend names no engine
        ("openai-chat", {}, None),
        ("vllm", {"sglang_version": "0.4.3"}, "vllm"),  # another engine's key is not this one's release
        ("vllm", {"vllm_version": "banana"}, "vllm"),
        ("openai", {"metadata": {"engine": "TensorRT-LLM", "engine_version": "1.2.0rc1"}}, "trtllm-1.2.0rc1"),
        ("guidellm", {"metadata": {"version": 2}}, None),  # a report schema's version, not an engine's
    ],
)
def test_the_engine_a_file_records(backend, summary, engine):
    assert engine_from(backend, summary) == engine


class _Run:
    def __init__(self, engine):
        self.engine = engine


def test_the_files_engine_runs_unless_the_user_sets_one():
    assert engine_overrides(_Run("vllm-0.9.2"), ["model=x"]) == (
        ["engine=vllm-0.9.2", "model=x"],
        "from the file: vllm-0.9.2",
    )
    assert engine_overrides(_Run("vllm-0.9.2"), ["engine=sglang"])[1] == "set by --set engine"
    assert engine_overrides(_Run(None), [])[1] == "the file names no engine: the scenario's"
    overrides, note = engine_overrides(_Run("vllm-2.0.1"), [])
    assert overrides == ["engine=vllm"] and "newer than every line: the newest, vllm-0.11" in note
    assert "older than every line" in engine_overrides(_Run("vllm-0.4.0"), [])[1]
