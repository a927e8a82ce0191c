"""PulseInfer's discrete-event simulator (SimPy) of decode serving with sparse KV offloading.

Never imports torch, ``engine``, ``calibrate`` or ``plots`` (tested in ``tests/test_layering.py``).

Typical use::

    from sim import load_scenario, simulate
    result = simulate(load_scenario("default", ["workload.max_requests=200"]))
    print(result.summary)
"""

from sim.config import ScenarioError, load_scenario
from sim.run import SimResult, simulate

__all__ = ["ScenarioError", "SimResult", "load_scenario", "simulate"]
