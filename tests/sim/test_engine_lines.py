"""Engine release lines (sim/config/engine.py, scenarios/engines/): a name as the engine prints itself resolves to the
card of the line that covers it; each card's scheduler defaults depend on the GPU as the engine's source says, fill
the scenario where it sets nothing itself, and appear in the resolved scenario.yaml; a mixed step carries the chunk
its token budget leaves; CUDA-graph padding and the pre-emption victim follow the card."""

from __future__ import annotations

import pytest
import yaml
from packaging.version import Version

from sim import load_scenario
from sim.config import ScenarioError
from sim.config.engine import EngineSpec, engine_defaults, release_lines, resolve_engine
from sim.config.loader import dump_scenario
from sim.run import simulate
from sim.step.compute import ComputeModel

SMALL = [
    "model=llama-3.1-8b", "serving.prefill=colocated", "policies=sglang", "workload.time_scale=1",
    "run.progress=false",
]  # fmt: skip


def _line(name: str) -> EngineSpec:
    return EngineSpec.model_validate(resolve_engine(name))


@pytest.mark.parametrize(
    ("name", "line"),
    [
        ("vllm-0.5.0", "vllm-0.5"), ("vllm-0.6.3.post1", "vllm-0.5"), ("vllm-0.7.3", "vllm-0.5"),
        ("vllm-0.8.0", "vllm-0.8"), ("vllm-0.8.5.post1", "vllm-0.8"), ("vllm-0.9.2", "vllm-0.9"),
        ("vllm-0.10.1.1", "vllm-0.9"), ("vllm-0.11.0", "vllm-0.11"), ("vllm-0.11.0rc2", "vllm-0.11"),
        ("vllm-0.19.1", "vllm-0.11"), ("vllm-0.11.2.dev358", "vllm-0.11"),
        ("sglang-0.2.15", "sglang-0.2"), ("sglang-0.3.6.post3", "sglang-0.3"), ("sglang-0.4.3.post4", "sglang-0.4"),
        ("sglang-0.5.5.post1", "sglang-0.5"), ("sglang-0.5.0rc2", "sglang-0.5"),
        ("trtllm-0.5.0", "trtllm-0.5"), ("trtllm-0.21.0", "trtllm-0.5"), ("trtllm-1.0.0", "trtllm-1.0"),
        ("trtllm-1.2.0rc1", "trtllm-1.0"), ("TensorRT-LLM v0.6.1", "trtllm-0.5"), ("vllm 0.9.2", "vllm-0.9"),
        ("vllm", "vllm-0.11"), ("sglang", "sglang-0.5"), ("trtllm", "trtllm-1.0"), ("generic", "generic"),
    ],
)  # fmt: skip
def test_a_release_resolves_to_the_line_that_covers_it(name, line):
    card = resolve_engine(name)
    assert card["name"] == line
    assert load_scenario("default", [f"engine={name}"]).engine.name == line


def test_every_release_since_the_oldest_of_each_engine_has_exactly_one_line():
    """The lines of an engine tile its releases: no gap, no overlap, from vLLM 0.5 / SGLang 0.2 / TensorRT-LLM 0.5."""
    oldest = {"vllm": "0.5.0", "sglang": "0.2.0", "trtllm": "0.5.0"}
    for kind, first in oldest.items():
        lines = release_lines(kind)
        probes = [Version(f"{major}.{minor}.{patch}") for major in (0, 1) for minor in range(0, 25) for patch in (0, 3)]
        for version in (v for v in probes if v >= Version(first) and (kind == "trtllm" or v < Version("1"))):
            covering = [name for name, spec in lines if spec.contains(version, prereleases=True)]
            assert len(covering) == 1, (kind, str(version), covering)


def test_an_older_release_runs_on_the_oldest_line_with_a_note():
    scn = load_scenario("default", ["engine=vllm-0.4.3"])
    assert scn.engine.name == "vllm-0.5" and scn.engine.version == "0.4.3"
    assert "older than every line" in scn.engine.note and "vllm-0.5" in scn.engine.note


@pytest.mark.parametrize(
    ("override", "needle", "lists"),
    [
        ("engine=tgi-2.0", "unknown engine 'tgi-2.0'", True),
        ("engine=vllm-2.0", "outside every vllm release line", True),
        ("engine=sglang-1.0", "outside every sglang release line", True),
        ("engine=vllm-x.y", "unknown engine", True),
        # what a newcomer tried: an empty or bare name, a relabelled line
        ("engine=vllm-", "unknown engine 'vllm-'", False),
        ("engine=", "expected an engine as it prints itself", False),
        ("engine=123", "got 123", False),
        ("engine.name=vllm-0.9", "--set engine.name: a release line's identity", False),
        ("engine.version=0.9.2", "--set engine.version: a release line's identity", False),
    ],
)
def test_an_unknown_engine_or_a_release_past_every_line_is_refused_listing_the_lines(override, needle, lists):
    with pytest.raises(ScenarioError) as err:
        load_scenario("default", [override])
    message = str(err.value)
    assert needle in message and "\n" not in message
    if lists:
        assert "vllm-0.11 (>=0.11,<1)" in message or "unknown engine" in message


# ---- defaults by GPU, as each engine's source chooses them ------------------------------------------------------


def _defaults(engine: str, card: str, usage: str = "serve") -> tuple[int, int, bool]:
    scn = load_scenario("default", [*SMALL, f"engine={engine}", f"hardware={card}", f"serving.usage_context={usage}"])
    knobs = scn.policy["sglang"]
    return knobs.chunked_prefill_tokens, knobs.max_running_requests, scn.serving.mixed_prefill


def test_vllm_v1_defaults_differ_between_a100_and_h100_as_its_arg_utils_says():
    """vLLM >= 0.9 (arg_utils _set_default_args): >= 70 GiB and not an A100 → 8192 tokens and 1024 sequences for
    `vllm serve` (16384 for the LLM class); A100s of any size and smaller GPUs → 2048 and 256 (8192 offline)."""
    for engine in ("vllm-0.9.2", "vllm-0.11.0"):
        assert _defaults(engine, "h100-sxm") == (8192, 1024, True)
        assert _defaults(engine, "h200") == (8192, 1024, True)
        assert _defaults(engine, "a100-80gb") == (2048, 256, True)
        assert _defaults(engine, "a100-40gb") == (2048, 256, True)
        assert _defaults(engine, "h100-sxm", "offline")[0] == 16384
        assert _defaults(engine, "a100-80gb", "offline")[0] == 8192
    assert _defaults("vllm-0.8.5", "a100-80gb") == (8192, 1024, True)  # 0.8 checked memory only: 80 GiB is large
    assert _defaults("vllm-0.8.5", "a100-40gb") == (2048, 256, True)


def test_sglang_and_trtllm_and_vllm_v0_defaults():
    assert _defaults("sglang-0.5.5", "h100-sxm") == (8192, 2048, False)
    assert _defaults("sglang-0.5.5", "a100-40gb") == (4096, 2048, False)  # < 60 GB: chunked_prefill_size 4096
    assert _defaults("sglang-0.3.6", "h100-sxm") == (8192, 2048, False)
    assert _defaults("trtllm-1.2.0rc1", "h100-sxm") == (8192, 2048, True)
    # vLLM V0: max(max_model_len, 2048) without chunked prefill; above a 32K max_model_len it chunks by itself
    short = load_scenario("default", [*SMALL, "engine=vllm-0.7.3", "hardware=h100-sxm", "model.max_seq_len=16384"])
    assert (short.policy["sglang"].chunked_prefill_tokens, short.serving.mixed_prefill) == (16384, False)
    assert _defaults("vllm-0.7.3", "h100-sxm") == (2048, 256, True)  # Llama-3.1's 131,072-token context


def test_the_kv_pool_follows_each_engines_memory_rule():
    """SGLang 0.5 on an 80 GB-class GPU at TP 1 reserves 512 + 1.5·8192 + 2·256 + 1024/8 MB = 13,440 MiB; vLLM takes
    90 % of HBM less weights and its reserve; TensorRT-LLM 90 % of what is free after the weights."""
    sglang = engine_defaults(_line("sglang-0.5.5"), 79.6, "h100-sxm", 1, 15.0, 131072, "serve")
    assert sglang.reserve_gib == pytest.approx(13440 / 1024)
    vllm = _line("vllm-0.11.0")
    d = engine_defaults(vllm, 79.6, "h100-sxm", 1, 15.0, 131072, "serve")
    fixed = vllm.kv_memory.reserve_gib + vllm.kv_memory.reserve_per_budget_token_kib * 8192 / 2**20
    assert 79.6 - 15.0 - d.reserve_gib == pytest.approx(0.9 * 79.6 - 15.0 - fixed)  # the pool
    trt = _line("trtllm-1.0")
    t = engine_defaults(trt, 79.6, "h100-sxm", 1, 15.0, 131072, "serve")
    fixed = trt.kv_memory.reserve_gib + trt.kv_memory.reserve_per_budget_token_kib * 8192 / 2**20
    assert 79.6 - 15.0 - t.reserve_gib == pytest.approx(0.9 * (79.6 - 15.0 - fixed))
    tp8 = engine_defaults(_line("sglang-0.4.3"), 79.6, "h100-sxm", 8, 4.0, 131072, "serve")
    assert tp8.reserve_gib == pytest.approx(9.5 + 8 / 2)  # (9.5 + tp/2) GB on 35-90 GB GPUs


def test_a_scenario_key_beats_the_engine_default_and_a_preset_does_not():
    mine = ["policy.sglang.chunked_prefill_tokens=4096", "serving.mixed_prefill=false", "hardware.reserve_gib=3"]
    scn = load_scenario("default", [*SMALL, "engine=vllm-0.11.0", "hardware=h100-sxm", *mine])
    assert scn.policy["sglang"].chunked_prefill_tokens == 4096 and scn.serving.mixed_prefill is False
    assert scn.hardware.reserve_gib == 3
    assert scn.policy["sglang"].max_running_requests == 1024  # not set: the engine's
    assert scn.policy["sglang"].block_size == 16 and scn.policy["sglang"].preempt_victim == "newest"


def test_each_cards_defaults_appear_in_the_resolved_scenario_yaml(tmp_path):
    for engine, card in [("vllm-0.9.2", "a100-80gb"), ("sglang-0.5.5.post1", "h100-sxm"), ("trtllm-1.2.0rc1", "h200")]:
        scn = load_scenario("default", [*SMALL, f"engine={engine}", f"hardware={card}"])
        path = tmp_path / f"{engine}.yaml"
        dump_scenario(scn, path)
        written = yaml.safe_load(path.read_text())
        line = EngineSpec.model_validate(resolve_engine(engine))
        tier = line.tier(scn.hardware.hbm_gib, scn.hardware.name)
        knobs = written["policy"]["sglang"]
        assert written["engine"]["name"] == line.name and written["engine"]["version"] == engine.split("-", 1)[1]
        assert knobs["chunked_prefill_tokens"] == tier.token_budget
        assert knobs["max_running_requests"] == tier.max_running_requests
        assert knobs["block_size"] == line.block_tokens and knobs["prefix_cache"] == line.prefix_cache
        assert knobs["new_token_ratio_init"] == line.new_token_ratio_init
        assert written["serving"]["mixed_prefill"] == line.mixed_prefill
        assert written["engine"]["cuda_graph_max_batch"] == tier.cuda_graph_max_batch
        assert written["hardware"]["reserve_gib"] > 0
        assert load_scenario(path) == scn  # the written file runs the same scenario


# ---- mechanisms ---------------------------------------------------------------------------------------------------


def test_a_mixed_step_carries_the_chunk_its_token_budget_leaves():
    """vLLM V1 fills a step's budget with the running decodes first, then prefill chunks: a forward holds
    batch + chunk tokens ≤ budget, and exactly the budget while prompts wait."""
    load = [
        "workload.trace=null", "workload.synthetic.num_requests=12", "workload.synthetic.rate_per_s=1e5",
        "workload.synthetic.prompt_tokens_cv=0",
        "workload.synthetic.prompt_tokens_mean=3000", "workload.synthetic.output_tokens_mean=40",
        "workload.synthetic.output_tokens_cv=0",
    ]  # fmt: skip
    scn = load_scenario("default", [*SMALL, *load, "engine=vllm-0.11.0", "hardware=a100-80gb"])
    budget = scn.policy["sglang"].chunked_prefill_tokens
    steps = simulate(scn).policies["sglang"].steps.reset_index(drop=True)
    mixed = 0
    for i in range(1, len(steps)):
        row, before = steps.iloc[i], steps.iloc[i - 1]
        if row["phase"] == "prefill" and before["phase"] == "decode" and row["duration_s"] == 0:  # one forward
            total = int(before["batch_size"]) + int(row["prefill_tokens"])
            assert total <= budget
            mixed += total == budget
    assert mixed >= 10  # the prompts (36,000 tokens) fill many steps to the budget


def test_cuda_graph_padding_follows_the_card():
    scn = load_scenario("default", [*SMALL, "engine=vllm-0.11.0", "hardware=h100-sxm"])
    vllm = ComputeModel(scn.model, scn.hardware, engine=scn.engine)
    assert [vllm.padded_batch(b) for b in (1, 3, 5, 9, 500, 512, 513)] == [1, 4, 8, 16, 504, 512, 513]
    trt = load_scenario("default", [*SMALL, "engine=trtllm-1.2.0rc1", "hardware=h100-sxm"])
    plain = ComputeModel(trt.model, trt.hardware, engine=trt.engine)
    assert [plain.padded_batch(b) for b in (3, 5, 9)] == [3, 5, 9]  # enable_padding off
    sglang = load_scenario("default", [*SMALL, "engine=sglang-0.5.5", "hardware=h100-sxm"])
    s = ComputeModel(sglang.model, sglang.hardware, engine=sglang.engine)
    assert [s.padded_batch(b) for b in (11, 13, 250, 257)] == [12, 16, 256, 257]  # graphs up to 256 on H100
    assert vllm.gemm_layer_s(500) == vllm.gemm_layer_s(497)  # both run their GEMMs at the 504 graph


@pytest.mark.parametrize(("engine", "victim"), [("vllm-0.11.0", "newest"), ("sglang-0.5.5", "fewest_decoded")])
def test_a_full_pool_preempts_the_request_the_engine_picks(engine, victim, monkeypatch):
    """Requests arrive one after another into a pool that holds a few: vLLM pre-empts the most recently admitted
    (running.pop()), SGLang the one with the fewest output tokens (then the longest prompt)."""
    from sim.serving.replica import Replica

    picked = []
    original = Replica._preempt

    def spy(self):
        before = list(self.batch.reqs)
        generated = self.batch.generated.copy()
        original(self)
        (gone,) = [i for i, r in enumerate(before) if r not in self.batch.reqs]
        picked.append((gone, len(before), int(generated[gone]), int(generated.min())))

    monkeypatch.setattr(Replica, "_preempt", spy)
    load = [
        "hardware=a100-80gb", "workload.trace=null", "workload.synthetic.num_requests=16",
        "workload.synthetic.rate_per_s=50", "workload.synthetic.prompt_tokens_cv=0",
        "workload.synthetic.prompt_tokens_mean=2000", "workload.synthetic.output_tokens_mean=3000",
        "workload.synthetic.output_tokens_cv=0", "hardware.hbm_gib=24", "hardware.reserve_gib=1",
        "policy.sglang.new_token_ratio_init=0", "policy.sglang.new_token_ratio_min=0", "run.debug_checks=true",
    ]  # fmt: skip
    scn = load_scenario("default", [*SMALL, *load, f"engine={engine}"])
    assert scn.policy["sglang"].preempt_victim == victim
    req = simulate(scn).policies["sglang"].requests
    assert picked and req["num_preemptions"].sum() == len(picked)
    assert req["finish_s"].notna().all()
    for index, size, generated, fewest in picked:
        assert index == size - 1 if victim == "newest" else generated == fewest


# ---- what a newcomer tried ----------------------------------------------------------------------------------------


def test_a_host_cost_card_must_name_a_line_it_lays_over(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("name: vllm-0.8\nstep_serial_us: 1000\n")
    scn = load_scenario("default", [f"engine={mine}"])
    assert scn.engine.name == "vllm-0.8" and scn.engine.step_serial_us == 1000 and scn.engine.mixed_prefill
    typo = tmp_path / "typo.yaml"
    typo.write_text("name: vlm-0.8\nstep_serial_us: 1000\n")
    with pytest.raises(ScenarioError, match=r"engine.name: unknown engine 'vlm-0.8'"):
        load_scenario("default", [f"engine={typo}"])
    assert load_scenario("default", ["engine=generic"]).engine.version == ""  # inherits sglang-0.4, not its release


def test_vllm_011_caps_sequences_at_the_budget_and_sizes_graphs_from_the_cap():
    """vLLM 0.11: max_num_seqs = min(max_num_seqs, max_num_batched_tokens) and CUDA graphs up to min(2 × seqs, 512),
    also when the scenario sets the budget or the cap itself; the reserve follows the scenario's budget."""
    base = [*SMALL, "engine=vllm-0.11.0", "hardware=h100-sxm"]
    scn = load_scenario("default", base)
    assert (scn.policy["sglang"].max_running_requests, scn.engine.cuda_graph_max_batch) == (1024, 512)
    small = load_scenario("default", [*base, "policy.sglang.chunked_prefill_tokens=512"])
    assert (small.policy["sglang"].max_running_requests, small.engine.cuda_graph_max_batch) == (512, 512)
    assert small.hardware.reserve_gib < scn.hardware.reserve_gib  # a smaller profiled activation
    capped = load_scenario("default", [*base, "policy.sglang.max_running_requests=64"])
    assert capped.engine.cuda_graph_max_batch == 128
    older = load_scenario(
        "default", [*SMALL, "engine=vllm-0.9.2", "hardware=h100-sxm", "policy.sglang.chunked_prefill_tokens=512"]
    )
    assert older.policy["sglang"].max_running_requests == 1024  # 0.9 had no such cap
