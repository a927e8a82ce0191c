"""Per-step recall volume: how much it varies on the real engine and in the simulator, at the same budget and context.

Reads the engine's selection statistics (`pulseinfer calibrate selection --out DIR` writes DIR/selection_stats.csv
and DIR/profile.yaml), then simulates one request of the same context with the fitted recall statistics
(SoloHead, per-request LRU buffer of twice the budget, block 16, sink 16, recent 64 — the measurement's layout),
several seeds, and prints the coefficient of variation of recalled blocks across steps (sum over layers, after
the first working_set_steps steps) and across layers (sum over steps), engine vs simulator.

    python scripts/recall_variation.py results/calibration [--budget 512] [--seeds 8]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from sim.config import load_scenario
from sim.run import simulate

SMOLLM2 = {  # SmolLM2-135M's shape (engine/weights.py reads the same from its GGUF)
    "name": "smollm2-135m", "num_layers": 30, "hidden_size": 576, "num_heads": 9, "num_kv_heads": 3, "head_dim": 64,
    "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True, "max_seq_len": 16384, "dtype": "fp32",
}  # fmt: skip


LAYER_BIN_S = 1e-5  # far below a decode step, so the step-w boundary falls within one bin


def cv(x: np.ndarray) -> float:
    """Coefficient of variation (population sd / mean)."""
    return float(np.std(x) / np.mean(x)) if np.mean(x) else float("nan")


def engine_cvs(stats: pd.DataFrame, budget: int) -> tuple[float, float, int, int]:
    """(CV across steps, CV across layers, steps, context) of the engine's missing blocks at ``budget``."""
    df = stats[stats["budget_tokens"] == budget]
    w = int(df["working_set_steps"].iloc[0])
    df = df[df["step"] >= w]
    return (
        cv(df.groupby("step")["missing_blocks"].sum().to_numpy()),
        cv(df.groupby("layer")["missing_blocks"].sum().to_numpy()),
        int(df["step"].max()) + 1,
        int(stats["context_tokens"].min()),
    )


def simulated_cvs(recall_stats: dict, budget: int, steps: int, context: int, seed: int, w: int) -> tuple[float, float]:
    """(CV across steps, CV across layers) of recalled fragments for one simulated request."""
    policy = {
        "preset": "pulseinfer", "selection": "solohead", "block_size": 16, "budget_tokens": budget, "sink_tokens": 16,
        "recent_tokens": 64, "recall_buffer_blocks": 2 * budget // 16, "offload_threshold_tokens": 16,
        "admission": "static", "scheduling": "sequential",
    }  # fmt: skip
    overrides = [
        "policies=pulseinfer", "serving.prefill=none", "workload.trace=null", "workload.time_scale=1",
        "workload.synthetic.num_requests=1", "workload.synthetic.rate_per_s=1",
        f"workload.synthetic.prompt_tokens_mean={context}", "workload.synthetic.prompt_tokens_cv=0",
        f"workload.synthetic.output_tokens_mean={steps + 1}", "workload.synthetic.output_tokens_cv=0",
        f"model={yaml.safe_dump(SMOLLM2, default_flow_style=True).strip()}", f"seed={seed}", "run.progress=false",
        f"policy.pulseinfer={yaml.safe_dump(policy, default_flow_style=True).strip()}",
        f"recall_stats={yaml.safe_dump(recall_stats, default_flow_style=True).strip()}",
    ]  # fmt: skip
    result = simulate(load_scenario("default", [*overrides, f"run.layer_bin_s={LAYER_BIN_S}"])).policies["pulseinfer"]
    decode = result.steps[result.steps["phase"] == "decode"].iloc[w:]
    # per-layer totals over the same steps as the engine's (from step w on: the cold first step recalls the whole
    # selection in every layer, which the engine's statistics leave out), from the fine layer x time bins
    binned = result.layer_recall[result.layer_recall["time_s"] >= decode["start_s"].iloc[0] - LAYER_BIN_S / 2]
    return cv(decode["num_fragments"].to_numpy()), cv(binned.groupby("layer")["recall_bytes"].sum().to_numpy())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("calibration", type=Path, help="folder written by `pulseinfer calibrate selection --out`")
    parser.add_argument("--budget", type=int, default=512)
    parser.add_argument("--seeds", type=int, default=8)
    args = parser.parse_args()
    stats = pd.read_csv(args.calibration / "selection_stats.csv")
    recall_stats = yaml.safe_load((args.calibration / "profile.yaml").read_text())["recall_stats"]
    w = int(recall_stats.get("working_set_steps", 12))
    e_steps, e_layers, steps, context = engine_cvs(stats, args.budget)
    sims = np.array([simulated_cvs(recall_stats, args.budget, steps, context, s, w) for s in range(args.seeds)])
    print(f"budget {args.budget}, context {context}, {steps} steps, {args.seeds} simulated seeds")
    print("source     CV across steps   CV across layers")
    print(f"engine     {e_steps:15.2f}   {e_layers:16.2f}")
    m, s = sims.mean(axis=0), sims.std(axis=0)
    print(f"simulator  {m[0]:9.2f} ± {s[0]:.2f}   {m[1]:10.2f} ± {s[1]:.2f}")


if __name__ == "__main__":
    main()
