"""One GPU's view (sim/step/gpu.py): its shard's bytes and every PCIe transfer through ``LinkModel`` on the replica's
queues — prompt write-back, swap-out and swap-in, HiCache reload and write-through."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import simpy

from sim.config import load_scenario
from sim.config.parallel import shard_model
from sim.metrics.recorder import Recorder
from sim.policies import make_policy
from sim.serving.replica import Replica
from sim.serving.request import Request
from sim.step.gpu import GpuView
from sim.step.link import LinkModel
from sim.step.timing import StepDevices
from tests.sim.oracles import link as link_oracle
from tests.sim.oracles.steps import time_steps

SERVING = Path(__file__).resolve().parents[2] / "sim" / "serving"
BASE = ["policies=[sglang,pulseinfer]", "run.progress=false", "workload.max_requests=50"]


def _replica(*overrides: str, policy: str = "pulseinfer") -> Replica:
    scenario = load_scenario("default", [*BASE, *overrides])
    env = simpy.Environment()
    rec = Recorder(scenario.model.num_layers, 10.0, 200, False)
    return Replica(env, scenario, make_policy(scenario, policy), np.random.default_rng(0), rec)


def _view(tp: int = 1) -> tuple[GpuView, StepDevices]:
    scenario = load_scenario("default", BASE)
    gpu = GpuView(scenario.model, scenario.hardware, tp)
    return gpu, StepDevices(simpy.Environment(), gpu.hardware)


def test_the_view_is_the_shard_and_the_policy_takes_it():
    replica = _replica("serving.tp_size=2")
    scenario = load_scenario("default", [*BASE, "serving.tp_size=2"])
    gpu = replica.gpu
    assert gpu is replica.policy.gpu and replica.policy.model is gpu.model and replica.policy.hardware is gpu.hardware
    assert gpu.model == shard_model(scenario.model, 2)
    assert gpu.kv_bytes_per_token == scenario.model.kv_bytes_per_token // 2  # 8 KV heads split 2 ways
    assert replica.policy.link is gpu.link


def test_prompt_write_back_queues_the_shard_not_the_model():
    """A colocated prefill's offloaded prompt KV on one GPU's D2H queue: at tp_size 2 half of tp_size 1's seconds,
    the shard's bytes through ``LinkModel.d2h_s``."""
    busy = {}
    for tp in (1, 2):
        replica = _replica("serving.prefill=colocated", f"serving.tp_size={tp}")
        req = Request(0, 0.0, 8000, 10, offloaded=True)
        replica._write_offloaded_prompts([(req, 8000), (Request(1, 0.0, 500, 10), 500)])  # the dense one writes nothing
        busy[tp] = replica.devices.d2h_busy_s
        assert busy[tp] == LinkModel(replica.gpu.hardware).d2h_s(8000 * replica.gpu.kv_bytes_per_token)
    assert busy[2] == pytest.approx(busy[1] / 2, rel=1e-12)


def test_swap_and_hicache_seconds_are_the_link_models():
    """Loads from host are one copy per layer through ``LinkModel`` (latency included), not bytes / bandwidth; stores
    are ``LinkModel.d2h_s``; on idle queues a transfer ends that long after it is queued."""
    gpu, devices = _view()
    tokens = 3000
    nbytes = tokens * gpu.kv_bytes_per_token
    layers = gpu.model.num_layers
    load_s = layers * link_oracle.transfer_s(gpu.link, nbytes / layers)
    assert gpu.load_s(tokens) == load_s
    assert load_s >= nbytes / (gpu.hardware.h2d_bandwidth_gbps * 1e9) + layers * gpu.hardware.h2d_latency_us * 1e-6
    assert gpu.swap_in(devices, 1.0, tokens) == pytest.approx(1.0 + load_s, rel=1e-15)
    assert devices.link_free_s == pytest.approx(1.0 + load_s, rel=1e-15)
    assert gpu.swap_out(devices, 2.0, tokens) == 2.0 + gpu.link.d2h_s(nbytes) == devices.d2h_free_s
    gpu, devices = _view()
    assert gpu.hicache_load(devices, 1.0, tokens) == (0.0, load_s)
    assert devices.link_free_s == 1.0 + load_s  # the reload occupies the link
    assert gpu.write_through(devices, 1.0, tokens) == gpu.link.d2h_s(nbytes) == devices.d2h_busy_s
    assert gpu.swap_in(devices, 5.0, 0) == 5.0 and gpu.swap_out(devices, 5.0, 0) == 5.0  # nothing to copy


def test_a_swap_in_queued_behind_a_recall_finishes_after_it():
    """The link is one FIFO queue: a swap-in (or a HiCache reload) queued while a recall holds the link starts when
    the recall ends, and a recall queued after a swap-in waits for it."""
    gpu, devices = _view()
    compute = np.full((1, 4), 1e-4)
    link = np.full((1, 4), 2e-4)
    run = time_steps(devices, 0.0, compute, np.ones(1, bool), 0.0, 0.0, 0.0, sequential=(link, np.zeros((1, 4))))
    recall_end = run.link_free_s
    assert recall_end > 0
    devices.link_free_s = recall_end  # the recall still on the link
    end = gpu.swap_in(devices, 0.0, 2000)
    assert end == pytest.approx(recall_end + gpu.load_s(2000), rel=1e-15) and end > recall_end
    wait, load = gpu.hicache_load(devices, 0.0, 1000)  # a reload queued next waits for both
    assert wait == end and load == gpu.load_s(1000)
    # a recall queued after a swap-in waits for it
    gpu, devices = _view()
    alone = time_steps(devices, 0.0, compute, np.ones(1, bool), 0.0, 0.0, 0.0, sequential=(link, np.zeros((1, 4))))
    swap_end = gpu.swap_in(devices, 0.0, 2000)
    behind = time_steps(devices, 0.0, compute, np.ones(1, bool), 0.0, 0.0, 0.0, sequential=(link, np.zeros((1, 4))))
    assert behind.link_free_s == pytest.approx(swap_end + alone.link_free_s, rel=1e-12)
    assert behind.stall_s[0] > alone.stall_s[0] + 0.9 * gpu.load_s(2000)


def test_a_swap_in_slows_while_the_d2h_queue_is_busy():
    gpu, devices = _view()
    coupling = gpu.hardware.d2h_coupling
    assert coupling > 0
    load_s = gpu.load_s(2000)
    devices.queue_d2h(0.0, 1e12)  # D2H busy far past the copy
    end = gpu.swap_in(devices, 0.0, 2000)
    assert end == pytest.approx(load_s / (1 - coupling), rel=1e-12)


def test_preemption_swaps_out_behind_the_d2h_queue_and_the_step_waits():
    """``retract: swap``: the victim's KV is queued on the D2H queue (behind what it holds) and the next decode step
    waits until it ends."""
    replica = _replica("serving.prefill=disaggregated", "policy.sglang.retract=swap", policy="sglang")
    gpu, devices = replica.gpu, replica.devices
    req = Request(0, 0.0, 4000, 100, generated=11)
    replica.batch.add([req])
    devices.queue_d2h(0.0, 1e9)  # earlier offload writes on the D2H queue
    backlog_end = devices.d2h_free_s
    replica._preempt()
    ctx = 4000 + 11 - 1
    assert replica.swap_end_s == pytest.approx(backlog_end + gpu.store_s(ctx), rel=1e-15)
    assert list(replica.waiting) == [req] and req.swapped


def _divides_by_bandwidth(tree: ast.AST) -> list[int]:
    """Lines that divide by, or read, a raw ``*_bandwidth_gbps`` (or divide by a ``*_bps`` rate)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.endswith("bandwidth_gbps"):
            lines.append(node.lineno)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div | ast.FloorDiv):
            for sub in ast.walk(node.right):
                name = sub.attr if isinstance(sub, ast.Attribute) else sub.id if isinstance(sub, ast.Name) else ""
                if name.endswith(("bandwidth_gbps", "_bps")):
                    lines.append(node.lineno)
    return sorted(set(lines))


def test_serving_charges_no_transfer_at_a_raw_bandwidth():
    """Transfers are charged through one GPU's view (sim/step/gpu.py → ``LinkModel``): no module of sim/serving
    divides bytes by a card's raw bandwidth, and the replica reads the model and the card only through the view."""
    found = {}
    for path in sorted(SERVING.glob("*.py")):
        tree = ast.parse(path.read_text())
        if lines := _divides_by_bandwidth(tree):
            found[path.name] = lines
        for node in ast.walk(tree):  # self.scenario.model / self.scenario.hardware: the whole model, the raw card
            if (
                path.name in ("replica.py", "prefill.py", "decode.py")
                and isinstance(node, ast.Attribute)
                and node.attr in ("model", "hardware")
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "scenario"
            ):
                found.setdefault(path.name, []).append(node.lineno)
    assert not found, f"raw bandwidth or the unsharded scenario read in sim/serving: {found}"
    bad = ast.parse("t = nbytes / (hw.h2d_bandwidth_gbps * 1e9)\nu = n / self.d2h_bps")
    assert _divides_by_bandwidth(bad) == [1, 2]  # the check itself sees them


def test_resume_loads_on_the_link_behind_a_recall_and_the_step_waits_for_it():
    """A swapped request resumed by the decode admission loads its KV on the link after the recall queued there; the
    next decode step starts when the load ends."""
    replica = _replica("serving.prefill=disaggregated", "policy.sglang.retract=swap", policy="sglang")
    gpu, devices, env = replica.gpu, replica.devices, replica.env
    req = Request(0, 0.0, 4000, 100, generated=11, prefill_target=4010, swapped=True)
    replica.waiting.append(req)
    devices.link_free_s = 0.25  # a recall still on the link
    assert replica._admit_prefilled() == [req] and not req.swapped
    assert replica.swap_end_s == pytest.approx(0.25 + gpu.load_s(4010), rel=1e-15)
    replica.batch.add([req])
    env.process(replica._decode_step())
    env.run()
    assert env.now > replica.swap_end_s > 0.25  # the step ran after the load, which ran after the recall
