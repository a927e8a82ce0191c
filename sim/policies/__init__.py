"""Serving policies: what is resident, what is recalled, and what a decode step costs.

Each policy is one class; the scheduler (``sim/scheduler.py``) is shared. ``POLICIES`` maps the names
used in scenarios (``policies: [sglang, pulseinfer]``) to the classes.
"""

from __future__ import annotations

from sim.policies.base import Policy, StepCost
from sim.policies.pulseinfer import PulseInfer
from sim.policies.sglang_like import SglangLike

POLICIES: dict[str, type[Policy]] = {"sglang": SglangLike, "pulseinfer": PulseInfer}

__all__ = ["POLICIES", "Policy", "PulseInfer", "SglangLike", "StepCost"]
