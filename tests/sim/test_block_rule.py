"""A policy's block rule is one definition for one request and for a batch: ``device_blocks`` (held, and with
``held=False`` the growth) of an int (plain Python, as admission's checks call it) equals the same call on int64
arrays, element by element, for every policy kind (dense, full offload, head-wise, PulseInfer) and block size."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import load_scenario
from sim.policies import make_policy

POLICIES = ("sglang", "full_offload", "headwise", "pulseinfer")


def _policies(block_size: int) -> list:
    scenario = load_scenario("default", [*(f"policy.{p}.block_size={block_size}" for p in POLICIES)])
    return [make_policy(scenario, name) for name in POLICIES]


POLICY_OBJECTS = {bs: _policies(bs) for bs in (16, 64)}


@settings(max_examples=60, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 2_000_000), min_size=1, max_size=12),
    offloaded=st.lists(st.booleans(), min_size=12, max_size=12),
    steps=st.integers(1, 3),
    block_size=st.sampled_from((16, 64)),
)
def test_scalar_and_array_forms_agree(tokens, offloaded, steps, block_size):
    n = len(tokens)
    off = np.array(offloaded[:n])
    ctx = np.array(tokens, dtype=np.int64)[None, :] + np.arange(steps)[:, None]  # [steps, n], as block growth
    for pol in POLICY_OBJECTS[block_size]:
        for held in (True, False):
            many = pol.device_blocks(ctx, off, held)
            one = [
                [pol.device_blocks(int(c), bool(o), held) for c, o in zip(row.tolist(), off.tolist())] for row in ctx
            ]
            assert np.array_equal(many, np.array(one)), (pol.name, held)
            assert all(type(x) is int for row in one for x in row)  # the scalar form stays plain Python


def test_an_offloaded_request_holds_fewer_blocks_than_dense_and_grows_by_its_summaries():
    pol = make_policy(load_scenario("default"), "pulseinfer")
    ctx, bs = 100_000, pol.block_size
    assert pol.device_blocks(ctx, True) < pol.device_blocks(ctx, False) == -(-ctx // bs)
    grow = 10 * bs * bs
    assert pol.device_blocks(grow, True, held=False) == 10 and pol.device_blocks(grow, False, held=False) == 10 * bs


@pytest.mark.parametrize("name", POLICIES)
def test_block_rule_is_what_admission_asks(name):
    from sim.serving.policy_admission import admission_of

    pol = make_policy(load_scenario("default"), name)
    params = admission_of(pol).params
    tokens, offloaded = np.array([[0, 5_000, 90_000]]), np.array([False, True, True])
    assert params.device_blocks == pol.device_blocks
    assert np.array_equal(params.growth_blocks(tokens, offloaded), pol.device_blocks(tokens, offloaded, held=False))
