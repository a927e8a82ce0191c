"""Cross-validation of the compute model on the serving suite (``pulseinfer cases --suite serving --cv BY``).

The suite's cases are grouped by ``BY`` (:func:`group_of`): ``source`` (the publisher: a GitHub repository, an arXiv
paper, a web site — every document of one publisher is one group, so a table's rows and a repository's runs never sit
on both sides), ``card`` (the GPU), ``model`` (the model family) or ``engine`` (vLLM, SGLang, TensorRT-LLM,
generic). Each fold leaves whole groups out: the compute model's constants are fitted from :data:`PRIOR
<calibrate.serving_fit.PRIOR>` on the other cases only (:func:`calibrate.serving_fit.fit_serving`), and the left-out
cases are simulated with those values. With ``folds`` below the number of groups, groups are dealt into ``folds``
folds largest first, each to the fold with the fewest cases (deterministic), which leaves more out per fold than
leave-one-group-out: a stricter test. A value no training case informs (a GPU architecture or engine line only the
left-out group has) stays at the prior: the held-out error then shows what an unfitted card or engine gets.

Every left-out row carries its fold and left-out group (``cv_group``); :func:`cv_report` gives, per metric group,
MAPE, mean signed error and the worst case, over every fold's held-out rows.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pandas as pd

from calibrate.serving_cases import ServingCase, engine_card, load_suite, suite_table
from calibrate.serving_fit import FitResult, fit_serving, suite_rows_for

CV_BY = ("source", "card", "model", "engine")
FAMILY = {"lwm": "llama"}  # fine-tunes of another family's model
_ARXIV = re.compile(r"arxiv[: ]*(\d{4}\.\d{4,5})", re.IGNORECASE)
_GITHUB = re.compile(r"github\.com/([^/\s]+)", re.IGNORECASE)
_HOST = re.compile(r"https?://(?:www\.)?([^/\s]+)", re.IGNORECASE)


def source_group(url: str) -> str:
    """The publisher of a case's source: the owner of a GitHub URL (lower case: ``vllm-project`` for its code, issues
    and blog alike), ``arXiv:ID`` of a paper, else the web site's host."""
    if m := _GITHUB.search(url):
        return m.group(1).lower()
    if m := _ARXIV.search(url):
        return f"arXiv:{m.group(1)}"
    if m := _HOST.search(url):
        return m.group(1).lower()
    return url.strip().lower() or "unknown"


def model_family(model: str) -> str:
    """A model card's family: its name up to the first digit or dash (``qwen2.5-7b`` → ``qwen``), joined where one
    family re-trains another's architecture (:data:`FAMILY`)."""
    family = re.split(r"[-\d.]", model, maxsplit=1)[0] or model
    return FAMILY.get(family, family)


def group_of(case: ServingCase, by: str) -> str:
    """The case's group for ``by`` (one of :data:`CV_BY`)."""
    if by == "source":
        return source_group(case.source.url)
    if by == "card":
        return case.setup.hardware
    if by == "model":
        return model_family(case.setup.model)
    if by == "engine":
        return engine_card(case.engine).split("-")[0]
    raise ValueError(f"--cv {by!r}: expected one of {', '.join(CV_BY)}")


def make_folds(cases: list[ServingCase], by: str, folds: int | None = None) -> list[list[str]]:
    """Groups (by ``by``) dealt into ``folds`` folds (module docstring); ``None`` or more folds than groups: one
    group per fold. Returns each fold's group names, sorted."""
    sizes: dict[str, int] = {}
    for case in cases:
        group = group_of(case, by)
        sizes[group] = sizes.get(group, 0) + 1
    order = sorted(sizes, key=lambda g: (-sizes[g], g))
    if folds is None or folds >= len(order):
        return [[g] for g in order]
    dealt: list[list[str]] = [[] for _ in range(folds)]
    load = [0] * folds
    for group in order:
        i = min(range(folds), key=lambda k: (load[k], k))
        dealt[i].append(group)
        load[i] += sizes[group]
    return [sorted(f) for f in dealt]


def cross_validate(
    by: str,
    folds: int | None = None,
    iterations: int = 4,
    jobs: int = 1,
    on_fold: Callable[[int, list[str], FitResult], None] | None = None,
    only: list[str] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Fit without each fold and simulate the fold with those values (module docstring).

    Args:
        by: one of :data:`CV_BY`.
        folds: at most this many folds (None: one per group).
        iterations: least-squares iterations of each fold's fit.
        jobs: worker processes simulating cases.
        on_fold: called after each fold with its index, its groups and its fit.
        only: the suite's cases to use (names; default every case).

    Returns:
        (rows, params): the held-out rows of every fold (:data:`SERVING_COLUMNS
        <calibrate.serving_cases.SERVING_COLUMNS>` plus ``fold`` and ``cv_group``, the left-out group), and one row
        per fold and fitted value (fold, groups, parameter, value, at_bound, uninformed, fit_loss).

    Raises:
        ValueError: an unknown ``by``, or fewer than two groups.
        ServingCaseError: a bad case file.
    """
    cases = [c for c in load_suite(only) if not c.not_modelled]
    dealt = make_folds(cases, by, folds)
    if len(dealt) < 2:
        raise ValueError(f"--cv {by}: the cases form {len(dealt)} group; cross-validation needs two or more")
    held_rows: list[dict] = []
    param_rows: list[dict] = []
    for i, groups in enumerate(dealt):
        left = [c for c in cases if group_of(c, by) in groups]
        kept = [c for c in cases if group_of(c, by) not in groups]
        fit = fit_serving(iterations, jobs, cases=kept)
        for row in suite_rows_for(left, fit.params, jobs):
            held_rows.append(
                {**row, "fold": i, "cv_group": group_of(next(c for c in left if c.name == row["case"]), by)}
            )
        for name, value in fit.params.items():
            param_rows.append({
                "fold": i, "groups": ",".join(groups), "parameter": name, "value": value,
                "at_bound": name in fit.at_bound, "uninformed": name in fit.uninformed, "fit_loss": fit.loss,
            })  # fmt: skip
        if on_fold is not None:
            on_fold(i, groups, fit)
    rows = suite_table(held_rows)
    rows["fold"] = [r["fold"] for r in held_rows]
    rows["cv_group"] = [r["cv_group"] for r in held_rows]
    return rows, pd.DataFrame(param_rows)


def cv_report(rows: pd.DataFrame, offloaded: set[str] | None = None) -> pd.DataFrame:
    """Per metric group (``per_token_moe`` and ``per_token_32k`` added for the MoE and ≥ 32K-prompt cases' per-token
    rows, ``any_32k`` for every non-tail row of the ≥ 32K cases, ``offloaded`` for offloaded cases' rows), over
    every fold's held-out compared rows: compared, MAPE (%), mean signed error (%), the worst case and its error."""
    t = rows[(rows["verdict"] == "compared") & np.isfinite(rows["error_pct"])].copy()
    t.loc[t["case"].isin(offloaded or set()), "group"] = "offloaded"
    extra = []
    names = set(t["case"])
    cases = {c.name: c for c in load_suite(sorted(names))} if names else {}
    moe = {n for n, c in cases.items() if _is_moe(c.setup.model)}
    long = {n for n, c in cases.items() if c.setup.input_tokens >= 32_768}
    per_token = t[t["group"] == "per_token"]
    for label, names_in in (("per_token_moe", moe), ("per_token_32k", long)):
        part = per_token[per_token["case"].isin(names_in)].copy()
        part["group"] = label
        extra.append(part)
    whole = t[t["case"].isin(long) & ~t["group"].str.endswith("_tail")].copy()  # ≥ 32K runs mostly time a whole run
    whole["group"] = "any_32k"
    extra.append(whole)
    t = pd.concat([t, *extra], ignore_index=True)
    out = []
    for group, part in t.groupby("group", sort=True):
        worst = part.loc[part["error_pct"].abs().idxmax()]
        out.append({
            "group": group, "compared": len(part), "cases": part["case"].nunique(),
            "mape_pct": float(part["error_pct"].abs().mean()), "mean_signed_pct": float(part["error_pct"].mean()),
            "worst_case": f"{worst['case']} ({worst['metric']})", "worst_pct": float(worst["error_pct"]),
        })  # fmt: skip
    return pd.DataFrame(out)


def _is_moe(model: str) -> bool:
    from sim.config.loader import load_card

    return bool(load_card("model", model).get("num_experts"))


__all__ = ["CV_BY", "cross_validate", "cv_report", "group_of", "make_folds", "model_family", "source_group"]
