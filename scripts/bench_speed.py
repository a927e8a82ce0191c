"""Simulation speed on the workload peer simulators are timed on: wall s, engine steps, µs per step and per request,
peak memory, per case and policy, each run a fresh ``python -m pulseinfer simulate`` process timed whole.

Workload: request lengths resampled (seeded) from the shipped Azure 2023 conversation slice's (prompt, output)
pairs with prompt + output <= 4,096 tokens, Poisson arrivals at 2 req/s (seeded), colocated prefill; written as a
CSV trace (``workload.format=csv``) into a temporary folder, with one scenario YAML per (case, policy).

Cases: ``8b`` (Llama-3.1-8B on H100-SXM), ``70b`` (Llama-3.1-70B, TP 2 on H100-SXM: its weights do not fit
one card), ``offloaded`` (Llama-3.1-8B / H100-SXM, pulseinfer with ``offload_threshold_tokens=16`` so every
request is offloaded; 500 requests, or ``--requests`` if smaller), ``offloaded_5k`` (the same at ``--requests``,
5,000 by default: the skip-ahead path over recalling steps at scale). Policies: sglang and pulseinfer (offloaded:
pulseinfer only). ``--repeats N`` runs each N times; the table reports medians.

``--baseline REV`` also runs every case on git revision REV (checked out with ``git worktree add`` into a
temporary folder, run with the same Python and ``PYTHONPATH`` pointing there), interleaved with the current
tree (current, baseline, current, baseline, ...), and reports the ratios current / baseline: benchmarks report
ratios measured side by side in one run.

Each tree's packages are byte-compiled before the runs (``compileall``), as an installed package is.

Columns: ``wall_s`` (whole process, start-up and table writing included), ``steps`` (prefill forwards + decode
steps, rows of the steps table), ``us_per_step`` = wall / steps, ``loop_s`` (seconds inside the SimPy event loop,
``Fleet.run``: start-up, trace loading and table writing excluded), ``loop_us_per_step`` = loop / steps (the
per-step cost of the simulation itself), ``us_per_request`` = wall / requests, ``peak_rss_mib`` (the child's own
``ru_maxrss``). Peers' figures are the ones recorded for them on this
machine class, not measured here; they are printed as ratios for the 8b / 70b rows at 5,000 requests only.

    python scripts/bench_speed.py [--requests 5000] [--repeats 3] [--cases 8b,70b,offloaded]
                                  [--baseline REV] [--out DIR] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
TRACE = "azure_conv_2023"
RATE_PER_S = 2.0
MAX_TOTAL_TOKENS = 4096
OFFLOADED_REQUESTS = 500


@dataclass(frozen=True)
class Case:
    """One benchmark case: model, card, scenario keys, policies and a request cap (None = ``--requests``)."""

    model: str
    hardware: str
    policies: tuple[str, ...]
    extra: dict = field(default_factory=dict)  # nested scenario keys merged into the YAML
    max_requests: int | None = None


CASES = {
    "8b": Case("llama-3.1-8b", "h100-sxm", ("sglang", "pulseinfer")),
    "70b": Case("llama-3.1-70b", "h100-sxm", ("sglang", "pulseinfer"), {"serving": {"tp_size": 2}}),
    "offloaded": Case(
        "llama-3.1-8b",
        "h100-sxm",
        ("pulseinfer",),
        {"policy": {"pulseinfer": {"offload_threshold_tokens": 16}}},
        OFFLOADED_REQUESTS,
    ),
    "offloaded_5k": Case(
        "llama-3.1-8b", "h100-sxm", ("pulseinfer",), {"policy": {"pulseinfer": {"offload_threshold_tokens": 16}}}
    ),
}
# Recorded for the peers (same workload, same machine class), NOT measured by this script: case → {peer: wall s}.
PEERS_S = {
    "8b": {"BLIS (Go)": 9.2, "Vidur": 29.9, "DistServe-sim": 24.3, "Splitwise-sim": 15.6},
    "70b": {"BLIS (Go, TP2)": 2.0},
}
PEER_REQUESTS = 5000
COLUMNS = [
    "case", "policy", "tree", "requests", "wall_s", "steps", "us_per_step", "loop_s", "loop_us_per_step",
    "us_per_request", "peak_rss_mib",
]  # fmt: skip

# Runs ``python -m pulseinfer ARGS...`` in this process, then writes its own peak RSS (KiB on Linux) to RSS_FILE.
CHILD = """
import resource, runpy, sys, time
rss_file = sys.argv[1]
sys.argv = ["pulseinfer", *sys.argv[2:]]
loop_s = [0.0]
try:  # time the event loop (Fleet.run); a tree without it reports nan
    from sim.serving.fleet import Fleet
    real_run = Fleet.run
    def timed_run(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return real_run(self, *args, **kwargs)
        finally:
            loop_s[0] += time.perf_counter() - started
    Fleet.run = timed_run
except Exception:
    loop_s[0] = float("nan")
try:
    runpy.run_module("pulseinfer", run_name="__main__", alter_sys=True)
finally:
    with open(rss_file, "w") as f:
        f.write(f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss} {loop_s[0]}")
"""


def bench_workload(num_requests: int, seed: int = 0, rate_per_s: float = RATE_PER_S) -> pd.DataFrame:
    """The benchmark's request table: ``request_id, arrival_s, prompt_tokens, output_tokens``.

    Lengths are drawn with replacement from the Azure 2023 conversation slice's (prompt, output) pairs with
    prompt + output <= 4,096 tokens; arrivals are a Poisson process at ``rate_per_s`` (first at the first gap).
    Same ``seed`` → same table.

    Raises:
        ValueError: ``num_requests`` < 1 or ``rate_per_s`` <= 0.
    """
    if num_requests < 1 or rate_per_s <= 0:
        raise ValueError(f"need num_requests >= 1 and rate_per_s > 0, got {num_requests}, {rate_per_s}")
    from traces import load_trace

    slice_ = load_trace(TRACE)
    pairs = slice_.loc[
        slice_["prompt_tokens"] + slice_["output_tokens"] <= MAX_TOTAL_TOKENS, ["prompt_tokens", "output_tokens"]
    ].to_numpy()
    rng = np.random.default_rng([seed, 0xBE9C])
    picked = pairs[rng.integers(0, len(pairs), num_requests)]
    arrival_s = np.cumsum(rng.exponential(1.0 / rate_per_s, num_requests))
    return pd.DataFrame(
        {
            "request_id": np.arange(num_requests),
            "arrival_s": arrival_s,
            "prompt_tokens": picked[:, 0].astype(np.int64),
            "output_tokens": picked[:, 1].astype(np.int64),
        }
    )


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def write_scenario(folder: Path, case_name: str, policy: str, trace_csv: Path, seed: int) -> Path:
    """Write the scenario YAML of one (case, policy) run into ``folder``; returns its path."""
    case = CASES[case_name]
    raw = {
        "name": f"bench-{case_name}-{policy}",
        "seed": seed,
        "model": case.model,
        "hardware": case.hardware,
        "workload": {
            "trace": str(trace_csv),
            "format": "csv",
            "columns": {"arrival": "arrival_s", "prompt_tokens": "prompt_tokens", "output_tokens": "output_tokens"},
        },
        "serving": {"prefill": "colocated"},
        "policies": [policy],
        "run": {"progress": False},
    }
    path = folder / f"{case_name}-{policy}.yaml"
    path.write_text(yaml.safe_dump(_merge(raw, case.extra), sort_keys=False))
    return path


def count_steps(out_dir: Path) -> int:
    """Rows of the steps table a run wrote (steps.parquet or steps.csv); 0 when it wrote none (summary only)."""
    from plots.tables import table_path

    path = table_path(out_dir, "steps")
    if path is None:
        return 0
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    with open(path, "rb") as f:
        return sum(1 for _ in f) - 1


def run_once(tree: Path, scenario: Path, out_dir: Path, extra_args: list[str]) -> tuple[float, int, float, float]:
    """One fresh process ``python -m pulseinfer simulate SCENARIO`` with ``tree`` first on the path.

    Returns:
        (wall seconds of the whole process, steps in its steps table, its peak RSS in MiB, seconds in the event
        loop).

    Raises:
        RuntimeError: the run failed (its stderr's tail in the message).
    """
    rss_file = out_dir.with_suffix(".rss")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-c", CHILD, str(rss_file), "simulate", str(scenario), "--out", str(out_dir)]
    cmd += ["--no-progress", *extra_args]
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=out_dir.parent, env=env, capture_output=True, text=True)
    wall_s = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[3:])} (tree {tree}) failed:\n{proc.stderr[-2000:]}")
    rss_kib, loop_s = rss_file.read_text().split()
    return wall_s, count_steps(out_dir), int(rss_kib) / 1024, float(loop_s)


def compile_tree(tree: Path) -> None:
    """Write the bytecode caches of the tree's packages (``python -m compileall``), so no timed run compiles
    sources: pip compiles a package it installs, and an editable install writes them on first import unless
    ``PYTHONDONTWRITEBYTECODE`` is set (as on some CI machines)."""
    packages = [str(tree / p) for p in ("sim", "pulseinfer", "traces", "plots") if (tree / p).is_dir()]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *packages], check=True, capture_output=True)


def _worktree(rev: str, folder: Path) -> Path:
    """Check out ``rev`` (detached) into ``folder`` with ``git worktree add``; returns the tree."""
    done = subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(folder), rev],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode:
        raise BaselineError(f"--baseline {rev}: not a git revision of {REPO} ({done.stderr.strip().splitlines()[-1]})")
    return folder


class BaselineError(ValueError):
    """``--baseline`` names no revision git can check out."""


def bench(
    cases: list[str],
    num_requests: int,
    repeats: int,
    seed: int,
    baseline: str | None,
    work: Path,
    extra_args: list[str],
) -> pd.DataFrame:
    """Run every (case, policy, repeat) — on the current tree and, with ``baseline``, interleaved on it — and
    return one row per (case, policy, tree) with medians over the repeats (:data:`COLUMNS`)."""
    trees = {"current": REPO}
    if baseline:
        trees["baseline"] = _worktree(baseline, work / "baseline-tree")
    for tree in trees.values():  # bytecode first, as an installed package has it (PYTHONDONTWRITEBYTECODE or not)
        compile_tree(tree)
    traces_by_n: dict[int, Path] = {}
    jobs = []
    for case in cases:
        n = min(num_requests, CASES[case].max_requests or num_requests)
        if n not in traces_by_n:
            traces_by_n[n] = work / f"trace-{n}.csv"
            bench_workload(n, seed).to_csv(traces_by_n[n], index=False)
        for policy in CASES[case].policies:
            scenario = write_scenario(work, case, policy, traces_by_n[n], seed)
            jobs.extend((case, policy, n, scenario, r, tree) for r in range(repeats) for tree in trees)
    samples: dict[tuple, list] = {}
    for i, (case, policy, n, scenario, _repeat, tree) in enumerate(tqdm(jobs, desc="bench", unit="run")):
        out = work / f"run-{i}"
        samples.setdefault((case, policy, tree, n), []).append(
            run_once(trees[tree], scenario, out, extra_args if tree == "current" else [])
        )
    rows = []
    for (case, policy, tree, n), runs in samples.items():
        wall_s = statistics.median(w for w, *_ in runs)
        loop_s = statistics.median(run[3] for run in runs)
        steps = runs[0][1]
        rows.append(
            {
                "case": case,
                "policy": policy,
                "tree": tree,
                "requests": n,
                "wall_s": wall_s,
                "steps": steps,
                "us_per_step": wall_s / steps * 1e6 if steps else np.nan,
                "loop_s": loop_s,
                "loop_us_per_step": loop_s / steps * 1e6 if steps else np.nan,
                "us_per_request": wall_s / n * 1e6,
                "peak_rss_mib": max(run[2] for run in runs),
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def ratios(table: pd.DataFrame) -> pd.DataFrame:
    """current / baseline of wall s, µs per step and peak RSS per (case, policy) (empty without a baseline)."""
    if "baseline" not in set(table["tree"]):
        return pd.DataFrame()
    key = ["case", "policy"]
    cur = table[table["tree"] == "current"].set_index(key)
    base = table[table["tree"] == "baseline"].set_index(key)
    out = pd.DataFrame(
        {
            "wall_vs_baseline": cur["wall_s"] / base["wall_s"],
            "us_per_step_vs_baseline": cur["us_per_step"] / base["us_per_step"],
            "loop_vs_baseline": cur["loop_s"] / base["loop_s"],
            "peak_rss_vs_baseline": cur["peak_rss_mib"] / base["peak_rss_mib"],
        }
    )
    return out.reset_index()


def peer_ratios(table: pd.DataFrame) -> pd.DataFrame:
    """Current tree's wall s / each peer's recorded wall s, for 8b / 70b rows at 5,000 requests."""
    rows = []
    for row in table[(table["tree"] == "current") & (table["requests"] == PEER_REQUESTS)].itertuples():
        for peer, peer_s in PEERS_S.get(row.case, {}).items():
            rows.append({"case": row.case, "policy": row.policy, "peer": peer, "peer_wall_s_recorded": peer_s,
                         "wall_vs_peer": row.wall_s / peer_s})  # fmt: skip
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Example: python scripts/bench_speed.py --cases 8b --requests 1000 --repeats 1 --baseline HEAD~1",
    )
    parser.add_argument("--requests", type=int, default=5000, help="requests per case (offloaded: at most 500)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per (case, policy, tree); the median is kept")
    parser.add_argument("--cases", default="8b,70b,offloaded", help=f"comma list of {', '.join(CASES)}")
    parser.add_argument("--seed", type=int, default=0, help="seed of the workload generator and the scenario")
    parser.add_argument("--baseline", metavar="REV", help="git revision to run side by side (ratios current/REV)")
    parser.add_argument("--out", type=Path, help="write DIR/bench.csv (and ratios.csv with --baseline)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (scenarios, run outputs)")
    parser.add_argument(
        "--simulate-arg", action="append", default=[], metavar="ARG",
        help="extra argument for the current tree's `pulseinfer simulate` (repeatable), "
        "e.g. --simulate-arg=--summary-only; the steps column then reads 0",
    )  # fmt: skip
    args = parser.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown or not cases:
        parser.error(f"--cases {args.cases}: unknown {unknown} (known: {', '.join(CASES)})")
    for flag, value in (("--requests", args.requests), ("--repeats", args.repeats)):
        if value < 1:
            parser.error(f"{flag} {value}: expected an integer >= 1")
    work = Path(tempfile.mkdtemp(prefix="pulseinfer-bench-"))
    try:
        table = bench(cases, args.requests, args.repeats, args.seed, args.baseline, work, args.simulate_arg)
    except BaselineError as exc:
        parser.exit(2, f"error: {exc}\n")
    finally:
        if args.baseline and (work / "baseline-tree").exists():
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(work / "baseline-tree")],
                           capture_output=True)  # fmt: skip
        if not args.keep:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    with pd.option_context("display.width", 160, "display.float_format", "{:.2f}".format):
        print(f"\nmedian of {args.repeats} (whole process; {sys.executable}):")
        print(table.to_string(index=False))
        side = ratios(table)
        if len(side):
            print(f"\ncurrent / {args.baseline} (measured side by side in this run):")
            print(side.to_string(index=False))
        peers = peer_ratios(table)
        if len(peers):
            print("\npeers: RECORDED figures (same workload, machine class), not measured (< 1: faster than the peer)")
            print(peers.to_string(index=False))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out / "bench.csv", index=False)
        if len(side):
            side.to_csv(args.out / "ratios.csv", index=False)
        print(f"\ntables in {args.out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
