"""What is simulated: the scenario schema (pydantic), the shipped cards and presets, profiles, and loading.

``load_scenario(path_or_name, overrides) -> Scenario`` is the entry point; every problem with the input is a
one-line :class:`ScenarioError`. Submodules: ``base`` (frozen base model, units), ``cards`` (model and
hardware, engine), ``workload``, ``policy``, ``measured`` (selection statistics, calibrated profiles), ``scenario``
(the whole experiment), ``files`` (YAML reading, the error), ``profiles`` (profile files), ``loader``.
"""

from sim.config.cards import HardwareSpec, ModelSpec
from sim.config.engine import DEFAULT_ENGINE, EngineSpec
from sim.config.files import ScenarioError, format_validation_error, read_yaml, scenarios_dir
from sim.config.loader import dump_scenario, load_scenario
from sim.config.measured import ComputeProfile, Profile, RecallStatsSpec, SelectionProfile
from sim.config.policy import DensePolicy, OffloadPolicy, PolicySpec
from sim.config.scenario import RunSpec, Scenario, ServingSpec, SloSpec
from sim.config.spec import DTYPE_BYTES, GIB, NonNeg, PositiveFloat, PositiveInt, Spec
from sim.config.workload_spec import ColumnsSpec, SessionsSpec, SyntheticSpec, WorkloadSpec

__all__ = [
    "DEFAULT_ENGINE", "DTYPE_BYTES", "GIB", "ColumnsSpec", "ComputeProfile", "DensePolicy", "EngineSpec",
    "HardwareSpec", "ModelSpec", "NonNeg", "OffloadPolicy", "PolicySpec", "PositiveFloat", "PositiveInt", "Profile",
    "RecallStatsSpec", "RunSpec", "Scenario", "ScenarioError", "SelectionProfile", "ServingSpec", "SessionsSpec",
    "SloSpec", "Spec", "SyntheticSpec", "WorkloadSpec", "dump_scenario", "format_validation_error", "load_scenario",
    "read_yaml", "scenarios_dir",
]  # fmt: skip
