"""`pulseinfer calibrate`: run the microbenchmarks, fit them, write the raw tables and ``profile.yaml``.

Output folder::

    copy.csv recall.csv compute.csv selection.csv matmul.csv   raw measurements (bench.py, bench_recall.py)
    metadata.yaml                                               device, torch version, pinned, commit, date, grid
    profile.yaml                                                the fitted profile (sim/config/profiles.py)

Hardware fields of the profile that are not measured here take documented stand-ins (``hardware_card``):
on a CPU the "device" is host memory (half the machine's RAM is offered as its "HBM"), and its copies run
on the computing thread (``io_overlaps_compute: false``).
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import torch
import yaml

from calibrate import bench, fit
from calibrate.bench_recall import bench_recall
from calibrate.harness import engine_policy
from calibrate.scale import scaled_card
from engine.model import DecoderConfig
from sim.config import GIB, HardwareSpec, ModelSpec, Profile
from sim.config.loader import load_card
from sim.config.profiles import read_profile, write_profile

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class CalibrationSettings:
    """What to calibrate. ``device`` None picks cuda when available; ``layers``/``scale`` None: calibrate/scale.py."""

    device: str | None = None
    quick: bool = False
    model: str = "qwen3-14b"
    layers: int | None = None
    scale: int | None = None
    threads: int | None = None  # torch CPU threads (default 1 on a CPU)
    seed: int = 0

    def resolved_device(self) -> str:
        """``device``, or "cuda" when None and torch sees one, else "cpu"."""
        if self.device is not None:
            return self.device
        return "cuda" if torch.cuda.is_available() else "cpu"


def decoder_config(card: ModelSpec) -> DecoderConfig:
    """The engine's DecoderConfig for a (scaled) card. Raises ValueError for a dtype torch lacks here (fp8)."""
    if card.dtype not in TORCH_DTYPES:
        raise ValueError(f"model.dtype {card.dtype!r}: the engine runs {', '.join(TORCH_DTYPES)}")
    return DecoderConfig(
        num_layers=card.num_layers,
        hidden_size=card.hidden_size,
        num_heads=card.num_heads,
        num_kv_heads=card.num_kv_heads,
        head_dim=card.head_dim,
        intermediate_size=card.intermediate_size,
        vocab_size=card.vocab_size,
        dtype=TORCH_DTYPES[card.dtype],
    )


def git_commit() -> str:
    """The repository's HEAD commit, or 'unknown' outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


def device_name(device: str) -> str:
    """The GPU's name for a CUDA device, else the CPU model name (/proc/cpuinfo, then platform)."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def host_ram_gib() -> float:
    """Physical memory of this machine in GiB (sysconf)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB


def hardware_card(
    device: str,
    link: fit.LinkFit,
    gather: fit.GatherFit,
    compute_kv_gbps: float,
    matmul_tflops: float,
    source: str,
    call_us: float = 0.0,
    gpu_gather: fit.GpuGatherFit | None = None,
) -> HardwareSpec:
    """The profile's hardware: measured link, gather and peaks; stand-ins for what is not measured.

    Not measured (stand-ins, named in the card's source): D2H rate (= H2D), D2H coupling (0), HBM size
    (the GPU's total memory; on a CPU half the RAM), host DRAM (the machine's RAM), reserve (0). The
    HBM bandwidth is the attention's KV read rate from the compute fit, and the FLOP/s peak the GEMM rate,
    both as achieved (efficiency 1); only prefill uses them and prefill is not validated. ``call_us`` is the
    per-copy call floor (`fit.fit_call_us`); ``gpu_gather``, when recall.csv has gpu_gather rows (CUDA), sets the
    card's ``gpu_gather_*`` terms, else they keep the schema's defaults.
    """
    gg = (
        {
            "gpu_gather_gbps": gpu_gather.gbps,
            "gpu_gather_launch_us": gpu_gather.launch_us,
            "gpu_gather_half_bytes": gpu_gather.half_bytes,
        }
        if gpu_gather is not None
        else {}
    )
    cuda = torch.device(device).type == "cuda"
    ram = host_ram_gib()
    hbm_gib = torch.cuda.get_device_properties(torch.device(device)).total_memory / GIB if cuda else ram / 2
    return HardwareSpec(
        name=f"{device_name(device)} (calibrated)",
        source=source,
        measured=True,
        hbm_gib=hbm_gib,
        hbm_bandwidth_gbps=max(compute_kv_gbps, 1e-3),
        bf16_tflops=max(matmul_tflops, 1e-6),
        h2d_bandwidth_gbps=link.bandwidth_gbps,
        d2h_bandwidth_gbps=link.bandwidth_gbps,
        h2d_latency_us=link.latency_us,
        h2d_call_us=call_us,
        h2d_size_table=link.size_table,
        d2h_coupling=0.0,
        host_gather_threads=1,
        host_gather_gbps_per_thread=gather.gbps,
        host_gather_fragment_us=gather.fragment_us,
        host_dram_gib=ram,
        reserve_gib=0.0,
        hbm_efficiency=1.0,
        prefill_mfu=1.0,
        decode_step_overhead_us=0.0,
        io_overlaps_compute=cuda,
        **gg,
    )


def run_calibration(
    settings: CalibrationSettings,
    out_dir: Path,
    grid: bench.BenchGrid | None = None,
    progress: Callable[[str], None] | None = None,
) -> Profile:
    """Run every microbenchmark, fit, and write the tables, ``metadata.yaml`` and ``profile.yaml`` to ``out_dir``.

    Args:
        settings: device, model card, scaling, quick grid or not.
        out_dir: created if missing; existing files of the same names are replaced (a ``recall_stats``
            section already in ``profile.yaml``, from ``calibrate selection``, is kept).
        grid: the points to measure (default: quick or full grid for the device).
        progress: called with a stage name as each stage starts.

    Returns:
        The fitted profile, as written to ``out_dir/profile.yaml``.

    Raises:
        ValueError: unknown or MoE model card, bad scale or layers.
        ScenarioError: unknown model card name.
    """
    device = settings.resolved_device()
    cuda = torch.device(device).type == "cuda"
    threads = settings.threads or (1 if not cuda else torch.get_num_threads())
    torch.set_num_threads(threads)
    grid = grid or (bench.quick_grid(cuda) if settings.quick else bench.full_grid(cuda))
    card = scaled_card(
        ModelSpec.model_validate(load_card("model", settings.model)), cuda, settings.layers, settings.scale
    )
    config = decoder_config(card)
    out_dir.mkdir(parents=True, exist_ok=True)
    note = progress or (lambda stage: None)
    started = dt.datetime.now(dt.timezone.utc)
    tables = measure(grid, config, device, settings.seed, note)
    for name, table in tables.items():
        table.to_csv(out_dir / f"{name}.csv", index=False)
    note("fit")
    run_info = {
        "device": device,
        "device_name": device_name(device),
        "torch_version": str(torch.__version__),
        "pinned": cuda,
        "threads": threads,
        "commit": git_commit(),
        "date": started.isoformat(timespec="seconds"),
        "quick": settings.quick,
        "model_card": settings.model,
        "measured_model": card.name,
        "seed": settings.seed,
    }
    existing = out_dir / "profile.yaml"
    profile = fit_profile(tables, card, grid, run_info, read_profile(existing) if existing.is_file() else None)
    (out_dir / "metadata.yaml").write_text(yaml.safe_dump({**profile.metadata, "grid": asdict(grid)}, sort_keys=False))
    write_profile(profile, existing)
    return profile


def measure(
    grid: bench.BenchGrid, config: DecoderConfig, device: str, seed: int, note: Callable[[str], None]
) -> dict[str, pd.DataFrame]:
    """Every microbenchmark of ``grid``, in order; ``note(stage)`` as each starts.

    Returns:
        Raw tables by name: copy, recall, compute, selection, matmul (columns: calibrate/bench.py).
    """
    note("copy")
    copy = bench.bench_copy(grid.copy_sizes_bytes, grid.copy_buffer_bytes, grid.repeats, device)
    note("recall")
    points = [(f, n) for f in grid.fragment_bytes for n in grid.fragment_counts]
    recall = bench_recall(points, grid.host_pool_bytes, grid.repeats, device, seed)
    note("compute")
    compute = bench.bench_compute(config, grid.compute_batches, grid.compute_contexts, grid.compute_steps, device, seed)
    note("selection")
    policy = engine_policy("pulseinfer")
    selection = bench.bench_selection(
        config, policy, grid.selection_batches, grid.selection_contexts, grid.repeats, device, seed
    )
    note("matmul")
    matmul = bench.bench_matmul(grid.matmul_size, config.dtype, grid.repeats, device)
    return {"copy": copy, "recall": recall, "compute": compute, "selection": selection, "matmul": matmul}


def fit_profile(
    tables: dict[str, pd.DataFrame],
    card: ModelSpec,
    grid: bench.BenchGrid,
    run_info: dict,
    old: dict | None = None,
) -> Profile:
    """Fit the raw tables of `measure` into a Profile.

    Args:
        tables: raw tables by name (`measure`).
        card: the measured (scaled) model card.
        grid: the grid measured; its middle compute point becomes the speed reference.
        run_info: device, device_name, date, commit and other run facts copied into the metadata.
        old: an existing profile's mapping (`read_profile`), whose ``recall_stats`` and ``recall_stats_source``
            are kept; None when there is none.

    Raises:
        ValueError: if a fit has nothing to fit (calibrate/fit.py).
    """
    link = fit.fit_link(tables["copy"])
    gather = fit.fit_gather(tables["recall"], link.size_table)
    compute_fit = fit.fit_compute(tables["compute"], card.name)
    selection_fit = fit.fit_selection(tables["selection"])
    kv_gbps = (
        card.kv_bytes_per_token_per_layer / (compute_fit.layer_per_token_ns * 1e-9) / 1e9
        if compute_fit.layer_per_token_ns
        else 1e3
    )
    metadata = {
        **_speed_reference(tables["compute"], grid),
        **run_info,
        "link_mape_pct": round(link.mape_pct, 2),
        "gather_scatter_mape_pct": round(gather.mape_pct, 2),
        "per_fragment_model_mape_pct": round(gather.per_fragment_mape_pct, 2),
    }
    device = run_info["device"]
    source = (
        f"pulseinfer calibrate on {metadata['device_name']} ({device}), {metadata['date']}, "
        f"commit {metadata['commit'][:10]}"
    )
    gpu_gather = fit.fit_gpu_gather(tables["recall"])
    if gpu_gather is not None:
        metadata["gpu_gather_mape_pct"] = round(gpu_gather.mape_pct, 2)
    hardware = hardware_card(
        device,
        link,
        gather,
        kv_gbps,
        float(tables["matmul"]["tflops"].max()),
        source,
        call_us=fit.fit_call_us(tables["recall"]),
        gpu_gather=gpu_gather,
    )
    keep = {k: old[k] for k in ("recall_stats", "recall_stats_source") if k in old} if old else {}
    return Profile(
        name=f"{device}-{card.name}",
        source=source,
        metadata=metadata,
        hardware=hardware,
        model=card,
        compute=compute_fit,
        selection=selection_fit,
        **keep,
    )


def _speed_reference(compute: pd.DataFrame, grid: bench.BenchGrid) -> dict:
    """The speed reference entries of the metadata: batch, context and fastest layer time of one grid point."""
    # One measured grid point (middle batch, middle context) kept so `validate` can re-measure it and report how
    # much faster or slower the machine runs than during calibration (calibrate/validate.py speed_drift). Not the
    # largest point: on this project's VMs its layer time varied up to 2x between processes minutes apart (the
    # memory behind a fresh multi-hundred-MB pool, it seems), which says nothing about the machine's speed.
    ref_batch = sorted(grid.compute_batches)[len(grid.compute_batches) // 2]
    ref_context = sorted(grid.compute_contexts)[len(grid.compute_contexts) // 2]
    at_ref = compute[(compute["batch_size"] == ref_batch) & (compute["context_tokens"] == ref_context)]
    return {
        "speed_ref_batch": int(ref_batch),
        "speed_ref_context": int(ref_context),
        "speed_ref_layer_s": float(at_ref["layer_s"].min()),
    }


def summary_table(profile: Profile) -> pd.DataFrame:
    """The fitted numbers a user checks first, one row each: quantity, value, unit, fit error."""
    h, c, s = profile.hardware, profile.compute, profile.selection
    meta = profile.metadata
    rows = [
        ("link bandwidth (fit)", h.h2d_bandwidth_gbps, "GB/s", meta.get("link_mape_pct")),
        ("link per-copy cost t0 (fit)", h.h2d_latency_us, "us", meta.get("link_mape_pct")),
        ("copy call floor (per_fragment loop)", h.h2d_call_us, "us", None),
        ("gather per fragment", h.host_gather_fragment_us, "us", meta.get("gather_scatter_mape_pct")),
        ("gather rate", h.host_gather_gbps_per_thread, "GB/s", meta.get("gather_scatter_mape_pct")),
        ("layer base", c.layer_base_us, "us", c.mape_pct),
        ("layer per request", c.layer_per_request_us, "us", c.mape_pct),
        ("layer per attended token", c.layer_per_token_ns, "ns", c.mape_pct),
        ("head base (LM head, sampling, bookkeeping)", c.head_base_us, "us", c.head_mape_pct),
        ("head per request", c.head_per_request_us, "us", c.head_mape_pct),
        ("selection base", s.base_us, "us", s.mape_pct),
        ("selection per candidate block", s.per_block_ns, "ns", s.mape_pct),
        ("GEMM peak (achieved)", h.bf16_tflops, "TFLOP/s", None),
    ]
    return pd.DataFrame(rows, columns=["quantity", "value", "unit", "fit_mape_pct"])
