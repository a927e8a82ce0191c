"""`pulseinfer validate`: run the engine's decode loop and the simulator on the same requests, compare.

For each policy (calibrate/harness.py ``ENGINE_POLICIES``: ``sglang``, ``pulseinfer``, ``headwise``):

1. The engine decodes the workload's requests on the profile's model (pre-filled random KV; every request
   starts decoding at once; a request leaves the batch when it has its output tokens). This runs
   ``repeats`` times and each step's time is the fastest over repeats (the step sequence is the same in
   every repeat; contention only adds time, and calibration takes the fastest repeat as well), which keeps
   a shared machine's noise out of the comparison.
2. The simulator runs the same requests (arrival 0, ``serving.prefill: none``) with the policy's mirror
   (``EnginePolicy.sim_policy``) on the profile's hardware and compute.
3. Metrics, from both step sequences the same way: per-request TPOT = the request's decode time / (output
   tokens − 1); mean and p99 over requests; decode throughput = tokens decoded / decode time.

Outputs: ``validation.csv`` (``policy, metric, simulated, measured, error_pct`` with error_pct =
(simulated − measured) / measured · 100), ``validation_steps.csv`` (policy, step, batch_size, measured_s,
simulated_s) and ``validation_steps.png`` (simulated vs measured step times).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from calibrate.bench import bench_compute
from calibrate.harness import build_decoder, engine_policy, pool_blocks, run_decode
from calibrate.run import decoder_config
from engine.model import init_weights
from sim.config import Profile
from sim.config.checks import available_memory_bytes
from sim.config.loader import validate_scenario
from sim.run import simulate_policy
from sim.step.compute import ComputeModel

VALIDATION_COLUMNS = ["policy", "metric", "simulated", "measured", "error_pct"]
STEP_COLUMNS = ["policy", "step", "batch_size", "measured_s", "simulated_s"]
METRICS = ("tpot_mean_ms", "tpot_p99_ms", "decode_tokens_per_s")


@dataclass(frozen=True)
class ValidationWorkload:
    """The requests both sides decode: one per context, with its output tokens (same length lists)."""

    contexts: tuple[int, ...] = (2048, 4096, 6144, 8192, 10240, 12288, 14336, 16384)
    output_tokens: tuple[int, ...] = (64, 60, 56, 52, 48, 44, 40, 36)  # batch shrinks: TPOT p99 ≠ mean

    def __post_init__(self) -> None:
        if len(self.contexts) != len(self.output_tokens) or not self.contexts:
            raise ValueError(
                f"contexts ({len(self.contexts)}) and output_tokens ({len(self.output_tokens)}) must be equal, "
                "non-empty lists"
            )
        if min(self.contexts) < 1 or min(self.output_tokens) < 2:
            raise ValueError("contexts must be >= 1 token and output_tokens >= 2 (TPOT needs two tokens)")

    def requests(self) -> pd.DataFrame:
        """The simulator's workload table (arrival 0)."""
        n = len(self.contexts)
        return pd.DataFrame(
            {
                "request_id": np.arange(n),
                "arrival_s": np.zeros(n),
                "prompt_tokens": np.array(self.contexts, dtype=np.int64),
                "output_tokens": np.array(self.output_tokens, dtype=np.int64),
            }
        )


def request_metrics(step_s: np.ndarray, batch: np.ndarray, outputs: list[int]) -> dict[str, float]:
    """TPOT mean / p99 (ms) and decode throughput from a step sequence.

    Args:
        step_s: float [S] seconds of each decode step, in order.
        batch: int [S] requests in each step.
        outputs: output tokens of each request; request i runs in the first outputs[i] − 1 steps.
    """
    ends = np.cumsum(step_s)
    tpot = np.array([ends[o - 2] / (o - 1) for o in outputs])
    return {
        "tpot_mean_ms": float(tpot.mean() * 1e3),
        "tpot_p99_ms": float(np.percentile(tpot, 99) * 1e3),
        "decode_tokens_per_s": float(batch.sum() / step_s.sum()),
    }


def measure_engine(
    profile: Profile, policy_name: str, workload: ValidationWorkload, device: str, repeats: int, seed: int = 0
) -> pd.DataFrame:
    """Fastest step times of the engine over ``repeats`` runs: columns step, batch_size, measured_s."""
    policy = engine_policy(policy_name)
    config = decoder_config(profile.model)
    weights = init_weights(config, seed, device)
    runs = []
    for _ in range(repeats):
        decoder = build_decoder(
            config, policy, list(workload.contexts), max(workload.output_tokens) + 2, device, seed, weights
        )
        runs.append(run_decode(decoder, list(workload.output_tokens)))
        del decoder
    base = runs[0][["step", "batch_size"]].copy()
    base["measured_s"] = np.min(np.stack([r["step_s"].to_numpy() for r in runs]), axis=0)
    return base


def simulate_steps(profile: Profile, policy_name: str, workload: ValidationWorkload, seed: int = 0) -> pd.DataFrame:
    """The simulator's decode steps for the same requests: columns step, batch_size, simulated_s.

    Raises:
        ScenarioError: if the profile lacks hardware, model or compute.
    """
    from sim.config import ScenarioError

    missing = [k for k in ("hardware", "model", "compute") if getattr(profile, k) is None]
    if missing:
        raise ScenarioError(f"profile: validation needs sections {missing}; run `pulseinfer calibrate` first")
    raw = {
        "name": f"validate-{policy_name}",
        "seed": seed,
        "model": profile.model.model_dump(),
        # the project's own engine keeps no HBM back beyond what it measured (calibrate/run.py writes 0)
        "hardware": {**profile.hardware.model_dump(), "reserve_gib": profile.hardware.reserve_gib or 0.0},
        "profile": profile.model_dump(),
        "serving": {"prefill": "none"},
        "policies": [policy_name],
        "policy": {policy_name: engine_policy(policy_name).sim_policy()},
        "run": {"progress": False},
    }
    if profile.recall_stats is not None:
        raw["recall_stats"] = profile.recall_stats.model_dump()
    scenario = validate_scenario(raw)
    result = simulate_policy(scenario, workload.requests(), policy_name)
    refused = result.requests[~result.requests["finished"].astype(bool)]
    if len(refused):
        row = refused.iloc[0]
        raise ValueError(
            f"--contexts: the simulator cannot run request {int(row['request_id'])} ({int(row['prompt_tokens'])} "
            f"context + {int(row['output_tokens'])} output tokens) of {policy_name}: "
            f"{row['unfinished_reason'] or 'unfinished'} (model.max_seq_len {profile.model.max_seq_len}, "
            f"{profile.hardware.hbm_gib} GiB HBM in the profile); use shorter --contexts"
        )
    steps = result.steps[result.steps["phase"] == "decode"].reset_index(drop=True)
    return pd.DataFrame(
        {"step": np.arange(len(steps)), "batch_size": steps["batch_size"], "simulated_s": steps["duration_s"]}
    )


def engine_memory_bytes(profile: Profile, policy_name: str, workload: ValidationWorkload) -> tuple[int, int]:
    """Estimated (device, host) bytes one engine run of ``policy_name`` allocates: weights and device pool on
    the device; host pool plus the largest request's float32 random K and V while it is stored, on the host.

    Pools hold ``pool_blocks`` blocks per layer of 2 × block_size × num_kv_heads × head_dim elements
    (engine/pools.py); the estimate adds 10 % for block summaries, indices and allocator slack.
    """
    model, policy = profile.model, engine_policy(policy_name)
    num_device, num_host = pool_blocks(policy, list(workload.contexts), max(workload.output_tokens) + 2)
    block_bytes = policy.block_size * model.kv_bytes_per_token  # K and V of every layer
    staging = 2 * max(workload.contexts) * model.num_kv_heads * model.head_dim * 4 * 2  # randn, then the cast
    return int(model.weight_bytes + 1.1 * num_device * block_bytes), int(1.1 * num_host * block_bytes + staging)


def check_engine_fits(profile: Profile, policies: list[str], workload: ValidationWorkload, device: str) -> None:
    """Refuse, before allocating, an engine run that cannot fit in this machine's free memory.

    Raises:
        ValueError: naming the policy, the estimate (:func:`engine_memory_bytes`) and the memory available
            (``MemAvailable`` of /proc/meminfo on the host; ``torch.cuda.mem_get_info`` on a GPU).
    """
    host_free = available_memory_bytes()
    device_free = torch.cuda.mem_get_info(torch.device(device))[0] if device.startswith("cuda") else None
    gib = 2**30
    for name in policies:
        dev, host = engine_memory_bytes(profile, name, workload)
        checks = [("this machine's memory", dev + host, host_free)] if device_free is None else [
            (f"{device} memory", dev, device_free), ("host memory", host, host_free)
        ]  # fmt: skip
        for where, need, have in checks:
            if need > have:
                raise ValueError(
                    f"--contexts: the engine run of {name} on contexts up to {max(workload.contexts)} tokens "
                    f"({len(workload.contexts)} requests) needs about {need / gib:,.1f} GiB but {where} has "
                    f"{have / gib:,.1f} GiB free; use shorter or fewer --contexts"
                )


def speed_drift(profile: Profile, device: str, seed: int = 0) -> float:
    """Layer time of one dense decode point measured now / measured at calibration (1.0 = same speed).

    A shared machine can run tens of percent slower or faster than it did during calibration; validation
    errors then include that drift. The profile's metadata names the point (``speed_ref_batch``,
    ``speed_ref_context``) and its calibrated time (``speed_ref_layer_s``); this re-measures it the same way
    (fastest of 3 rounds, about a second of engine time on a CPU). Profiles without the reference compare with
    the compute fit at batch 4, context 4096 instead (less exact: the fit's own error at that point counts).
    """
    meta = profile.metadata
    batch, context = int(meta.get("speed_ref_batch") or 4), int(meta.get("speed_ref_context") or 4096)
    table = bench_compute(decoder_config(profile.model), [batch], [context], 3, device, seed)
    row = table.loc[table["layer_s"].idxmin()]
    reference = meta.get("speed_ref_layer_s") or ComputeModel(
        profile.model, profile.hardware, profile.compute
    ).decode_layer_s(batch, int(row["attended_tokens"]))
    return float(row["layer_s"] / float(reference))


def prepare(
    profile: Profile, policies: list[str], workload: ValidationWorkload, device: str, seed: int = 0
) -> dict[str, pd.DataFrame]:
    """Everything :func:`validate` checks before the engine runs; returns the simulated steps per policy.

    Simulates first, so an unknown policy, a profile the simulator refuses or a request it cannot finish fails
    before any engine time is spent; then refuses an engine run that cannot fit in memory (with the estimate).

    Raises:
        ValueError: as :func:`validate`.
    """
    simulated = {name: simulate_steps(profile, name, workload, seed) for name in policies}
    check_engine_fits(profile, policies, workload, device)  # refused with the estimate, not killed for memory
    return simulated


def validate(
    profile: Profile,
    policies: list[str],
    workload: ValidationWorkload,
    device: str,
    repeats: int = 3,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    simulated: dict[str, pd.DataFrame] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Measure and simulate every policy; return (validation table, per-step table).

    ``simulated``: the result of :func:`prepare` when the caller ran it already (its checks come first).

    Raises:
        ValueError: unknown policy; ScenarioError (a ValueError) or CapacityError if the simulator refuses the
            profile; a request the simulator cannot finish; an engine run that cannot fit in memory — all
            before the engine runs.
        RuntimeError: if the engine and the simulator disagree on the step sequence (batch sizes), which
            would make the comparison meaningless.
    """
    rows, step_tables = [], []
    simulated_by_policy = simulated or prepare(profile, policies, workload, device, seed)
    for name in policies:
        if progress:
            progress(name)
        measured = measure_engine(profile, name, workload, device, repeats, seed)
        simulated = simulated_by_policy[name]
        if (
            len(measured) != len(simulated)
            or (measured["batch_size"].to_numpy() != simulated["batch_size"].to_numpy()).any()
        ):
            raise RuntimeError(
                f"{name}: engine ran {len(measured)} steps, simulator {len(simulated)}, or their batch sizes differ"
            )
        steps = measured.merge(simulated[["step", "simulated_s"]], on="step")
        steps.insert(0, "policy", name)
        step_tables.append(steps[STEP_COLUMNS])
        outputs = list(workload.output_tokens)
        batch = steps["batch_size"].to_numpy()
        meas = request_metrics(steps["measured_s"].to_numpy(), batch, outputs)
        sim = request_metrics(steps["simulated_s"].to_numpy(), batch, outputs)
        for metric in METRICS:
            err = (sim[metric] - meas[metric]) / meas[metric] * 100
            rows.append((name, metric, sim[metric], meas[metric], err))
    return pd.DataFrame(rows, columns=VALIDATION_COLUMNS), pd.concat(step_tables, ignore_index=True)


def default_device() -> str:
    """The default torch device: cuda when torch sees one, else cpu."""
    return "cuda" if torch.cuda.is_available() else "cpu"
