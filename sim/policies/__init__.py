"""Serving policies: what is resident, what is recalled, and what a decode step costs.

A scenario names policies (``policies: [sglang, headwise, pulseinfer]``); each resolves to knobs with a
``kind`` (``scenarios/policies/*.yaml`` presets, see ``sim.config.loader.resolve_policies``). ``POLICY_KINDS``
maps a kind to the class that serves it; the scheduler (``sim/serving/replica.py``) is shared.
"""

from __future__ import annotations

from sim.config import Scenario
from sim.policies.base import Policy
from sim.policies.dense import DenseServing
from sim.policies.offload import OffloadServing

POLICY_KINDS: dict[str, type[Policy]] = {"dense": DenseServing, "offload": OffloadServing}


def make_policy(scenario: Scenario, name: str) -> Policy:
    """The policy object for ``scenario.policy[name]``."""
    params = scenario.policy[name]
    return POLICY_KINDS[params.kind](scenario, name, params)


__all__ = ["POLICY_KINDS", "DenseServing", "OffloadServing", "Policy", "make_policy"]
