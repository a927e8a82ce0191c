"""Node-level host sharing (sim/config/parallel.py ``host_share``): the GPUs recalling at once behind one PCIe switch
share its uplink, those on one socket its DRAM; a lone GPU keeps its card's rates; fleets pack replicas on nodes."""

from __future__ import annotations

import pytest

from sim.config import HardwareSpec
from sim.config.loader import load_card, load_scenario
from sim.config.parallel import host_share, per_gpu_hardware
from sim.serving.fleet import Fleet, replicas_sharing_node
from sim.step.link import LinkModel


def _hw(**changes) -> HardwareSpec:
    return HardwareSpec.model_validate({**load_card("hardware", "h200"), **changes})


def test_eight_tp_ranks_two_per_switch_get_half_the_uplink_each():
    hw = _hw(gpus_per_pcie_switch=2, host_dram_gbps_per_socket=None)
    share = host_share(hw, 8)
    assert share.on_switch == 2
    assert share.h2d_gbps == pytest.approx(hw.h2d_bandwidth_gbps / 2)
    assert share.d2h_gbps == pytest.approx(hw.d2h_bandwidth_gbps / 2)
    gpu = per_gpu_hardware(hw, 8)
    assert LinkModel(gpu).bps == pytest.approx(hw.h2d_bandwidth_gbps * 1e9 / 2)
    assert gpu.gpu_gather_gbps == pytest.approx(min(hw.gpu_gather_gbps, hw.h2d_bandwidth_gbps / 2))


def test_a_lone_gpu_gets_the_full_rate():
    hw = _hw(gpus_per_pcie_switch=2)  # a shared switch and a socket DRAM figure, but nobody to share them with
    share = host_share(hw, 1)
    assert (share.on_switch, share.on_socket) == (1, 1)
    assert share.h2d_gbps == hw.h2d_bandwidth_gbps
    assert per_gpu_hardware(hw, 1) is hw  # the card itself: its link and gather rates, exactly
    assert LinkModel(per_gpu_hardware(hw, 1)).gather_bps == pytest.approx(96e9)  # 8 threads x 12 GB/s


def test_the_uplink_binds_only_below_the_gpus_link():
    hw = _hw(gpus_per_pcie_switch=2, pcie_uplink_gbps=220, host_dram_gbps_per_socket=None)  # a x16 Gen5 GPU, fat uplink
    assert host_share(hw, 2).h2d_gbps == hw.h2d_bandwidth_gbps  # 220 / 2 > 55
    assert host_share(_hw(gpus_per_pcie_switch=4, pcie_uplink_gbps=110), 4).h2d_gbps == pytest.approx(27.5)


def test_the_socket_dram_cap_binds_when_set():
    hw = _hw(gpus_per_socket=4, host_dram_gbps_per_socket=200, host_gather_threads=8, host_gather_gbps_per_thread=12)
    share = host_share(hw, 4)
    assert share.on_socket == 4
    assert share.gather_gbps == pytest.approx(200 / (2 * 4))  # 25 GB/s < 8 x 12: read + write of each byte
    assert share.h2d_gbps == pytest.approx(50)  # 200 / 4 < 55: a copy crosses DRAM once
    assert LinkModel(per_gpu_hardware(hw, 4)).gather_bps == pytest.approx(25e9)
    unset = host_share(_hw(host_dram_gbps_per_socket=None), 4)
    assert unset.gather_gbps is None and unset.h2d_gbps == 55


def test_a_measured_size_table_is_capped_only_by_sharing():
    table = [(4096, 2.0), (1 << 26, 60.0)]
    hw = _hw(h2d_size_table=table, gpus_per_pcie_switch=2, host_dram_gbps_per_socket=None)
    assert per_gpu_hardware(hw, 1).h2d_size_table == table  # alone: measured rates kept, even above the fit
    assert per_gpu_hardware(hw, 2).h2d_size_table == [(4096, 2.0), (1 << 26, 27.5)]


def test_fleets_pack_replicas_on_nodes_and_share_the_host():
    scn = load_scenario("default", ["policies=pulseinfer", "run.progress=false", "hardware.gpus_per_pcie_switch=2"])
    assert replicas_sharing_node(scn, 1) == [1]
    assert replicas_sharing_node(scn, 10) == [8] * 8 + [2] * 2  # 8 per node of 8 GPUs, the last node holds 2
    tp2 = scn.model_copy(update={"serving": scn.serving.model_copy(update={"tp_size": 2})})
    assert replicas_sharing_node(tp2, 5) == [4, 4, 4, 4, 1]
    fleet = Fleet(scn, "pulseinfer", 3)
    rates = [r.policy.hardware.h2d_bandwidth_gbps for r in fleet.replicas]
    assert rates == [27.5, 27.5, 27.5]  # three recalling GPUs, two per switch: the fullest switch halves the link
    alone = Fleet(scn, "pulseinfer", 1)
    assert alone.replicas[0].policy.hardware.h2d_bandwidth_gbps == 55
