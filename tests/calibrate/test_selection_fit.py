"""Selection statistics -> recall_stats: the fit recovers known parameters from synthetic draws; the profile
merge keeps other sections; the whole calibration runs end to end on the tiny seeded decoder."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from calibrate.selection_fit import CLIP, fit_recall_stats, kumaraswamy_std, selection_summary
from sim.config import Profile, RecallStatsSpec
from sim.step.distributions import kumaraswamy_b
from tests.sim.oracles import recall_step

REPO = Path(__file__).resolve().parents[2]
MEANS = [0.35, 0.25, 0.2, 0.15, 0.12, 0.1]


def _kumaraswamy(rng: np.random.Generator, a: float, mean: float, n: int) -> np.ndarray:
    """Inverse-CDF draws of Kumaraswamy(a, b) with b tied to mean (as the simulator draws them)."""
    b = kumaraswamy_b(mean, a)
    return (1 - (1 - rng.random(n)) ** (1 / b)) ** (1 / a)


def _table(change: list[np.ndarray], k: int = 32, returning_frac: float = 0.4, w: int = 12) -> pd.DataFrame:
    """A selection stats table (the columns the fit reads) from per-layer change fractions."""
    rng = np.random.default_rng(1)
    frames = []
    for layer, frac in enumerate(change):
        changed = np.round(frac * k)
        frames.append(
            pd.DataFrame({
                "budget_tokens": k * 16, "buffer_blocks": 2 * k, "working_set_steps": w, "layer": layer,
                "step": np.arange(len(frac)), "change_frac": frac, "changed_blocks": changed,
                "returning_blocks": rng.binomial(changed.astype(int), returning_frac).astype(float),
                "miss_frac": frac * 0.8, "headwise_miss_frac": frac * 0.9, "union_ratio": 1.5,
                "solohead_fragments": changed, "headwise_fragments": 2 * changed, "selected_blocks": k,
                "working_set_blocks": k * (1 + 12 * frac),
            })
        )  # fmt: skip
    return pd.concat(frames, ignore_index=True)


@pytest.mark.parametrize("a", [0.8, 2.0, 5.0])
def test_fit_recovers_the_shape_and_per_layer_means(a):
    rng = np.random.default_rng(0)
    stats = fit_recall_stats(_table([_kumaraswamy(rng, a, m, 3000) for m in MEANS]), num_layers=len(MEANS))
    assert stats["change_shape_a"] == pytest.approx(a, rel=0.1)
    assert [m for _, m in stats["change_mean_by_depth"]] == pytest.approx(MEANS, abs=0.01)


def test_fit_recovers_the_returning_fraction():
    rng = np.random.default_rng(0)
    stats = fit_recall_stats(_table([_kumaraswamy(rng, 2.0, m, 3000) for m in MEANS]), num_layers=len(MEANS))
    assert stats["returning_frac"] == pytest.approx(0.4, abs=0.02)
    assert stats["working_set_steps"] == 12


def test_depth_is_normalised_so_knots_span_zero_to_one():
    rng = np.random.default_rng(0)
    stats = fit_recall_stats(_table([_kumaraswamy(rng, 2.0, m, 200) for m in MEANS]), num_layers=len(MEANS))
    assert [d for d, _ in stats["change_mean_by_depth"]] == pytest.approx(np.linspace(0, 1, len(MEANS)).tolist())
    RecallStatsSpec.model_validate(stats)
    yaml.safe_dump(stats)  # plain lists and numbers


def test_model_std_matches_sampled_std():
    rng = np.random.default_rng(3)
    draws = _kumaraswamy(rng, 1.5, 0.2, 200_000)
    assert kumaraswamy_std(0.2, 1.5) == pytest.approx(draws.std(), rel=0.01)


def test_a_layer_that_never_changes_is_clipped_with_a_warning_and_reported():
    rng = np.random.default_rng(0)
    change = [_kumaraswamy(rng, 2.0, m, 500) for m in MEANS[:3]] + [np.zeros(500)]
    table = _table(change)
    with pytest.warns(UserWarning, match=r"layers \[3\] clipped"):
        stats = fit_recall_stats(table, num_layers=4)
    assert stats["change_mean_by_depth"][3] == [1.0, CLIP]
    assert stats["change_shape_a"] == pytest.approx(2.0, rel=0.25)  # fitted on the unclipped layers
    assert selection_summary(table, num_layers=4)["clipped_layers"] == [3]


def test_fit_refuses_several_budgets_another_window_and_missing_layers():
    rng = np.random.default_rng(0)
    table = _table([_kumaraswamy(rng, 2.0, m, 50) for m in MEANS[:2]])
    two = pd.concat([table, table.assign(budget_tokens=1024)])
    with pytest.raises(ValueError, match="budgets"):
        fit_recall_stats(two, num_layers=2)
    with pytest.raises(ValueError, match="working_set_steps"):
        fit_recall_stats(table, num_layers=2, working_set_steps=8)
    with pytest.raises(ValueError, match="num_layers=3"):
        fit_recall_stats(table, num_layers=3)


def test_summary_reports_per_layer_miss_fractions_and_union_ratio():
    rng = np.random.default_rng(0)
    table = _table([_kumaraswamy(rng, 2.0, m, 100) for m in MEANS])
    summary = selection_summary(table, num_layers=len(MEANS))
    assert len(summary["per_layer_miss_frac"]) == len(MEANS)
    assert summary["union_ratio"] == pytest.approx(1.5)
    assert summary["budget_tokens"] == 512 and summary["buffer_blocks"] == 64
    assert len(summary["per_layer_closed_form_miss_frac"]) == len(MEANS)
    assert 0 < summary["closed_form_miss_frac"] < max(MEANS)
    yaml.safe_dump(summary)


def test_selection_fit_imports_no_torch():
    code = "import json, sys; import calibrate.selection_fit; print(json.dumps('torch' in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) is False


def test_merge_keeps_other_profile_sections(tmp_path):
    from calibrate.selection import merge_recall_stats

    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump({"name": "cpu", "source": "bench", "recall_stats": {"returning_frac": 0.1}}))
    stats = RecallStatsSpec().model_dump(mode="json")
    merge_recall_stats(path, stats, "measured on X")
    data = yaml.safe_load(path.read_text())
    assert data["name"] == "cpu" and data["source"] == "bench"
    assert data["recall_stats"] == stats and data["recall_stats_source"] == "measured on X"


def test_merge_creates_a_named_profile(tmp_path):
    from calibrate.selection import merge_recall_stats

    path = merge_recall_stats(tmp_path / "new" / "profile.yaml", RecallStatsSpec().model_dump(mode="json"), "X")
    data = yaml.safe_load(path.read_text())
    assert set(data) == {"name", "recall_stats", "recall_stats_source"}
    Profile.model_validate(data)


class _CharTokenizer:
    """Stand-in tokenizer for the tiny decoder: one id per character."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [ord(c) % self.vocab_size for c in text]


def test_calibration_runs_end_to_end_on_the_tiny_decoder(tmp_path):
    torch = pytest.importorskip("torch")
    from calibrate.selection import run_selection_calibration
    from engine.model import init_weights, tiny_cpu_config
    from engine.weights import LoadedModel

    torch.set_num_threads(1)
    config = tiny_cpu_config()
    model = LoadedModel(config, init_weights(config, seed=0), _CharTokenizer(config.vocab_size))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the random model may leave a layer without change at some budget
        result = run_selection_calibration(
            budgets=(64, 32, 128), context_tokens=384, steps=30, out_dir=tmp_path, model=model
        )
    assert result.fit_budget == 64  # the middle of the sorted budgets
    stats = pd.read_csv(tmp_path / "selection_stats.csv")
    assert sorted(stats["budget_tokens"].unique()) == [32, 64, 128]
    profile = Profile.model_validate(yaml.safe_load((tmp_path / "profile.yaml").read_text()))
    assert profile.recall_stats is not None and len(profile.recall_stats.change_mean_by_depth) == config.num_layers
    assert "budget 64 tokens" in profile.recall_stats_source
    summary = yaml.safe_load((tmp_path / "selection_summary.yaml").read_text())
    assert set(summary["budgets"]) == {32, 64, 128}


def test_a_selection_profile_drives_the_simulators_recall_volume(tmp_path):
    """`calibrate selection` output, named by a scenario, sets the recall model: the sampled recall bytes follow
    the profile's expected miss fractions, and differ from the default statistics' volume."""
    torch = pytest.importorskip("torch")
    import numpy as np

    from calibrate.selection import run_selection_calibration
    from engine.model import init_weights, tiny_cpu_config
    from engine.weights import LoadedModel
    from sim.config import load_scenario
    from sim.step.link import LinkModel
    from sim.step.recall import RecallModel

    torch.set_num_threads(1)
    config = tiny_cpu_config()
    model = LoadedModel(config, init_weights(config, seed=0), _CharTokenizer(config.vocab_size))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_selection_calibration(budgets=(32, 64), context_tokens=384, steps=30, out_dir=tmp_path, model=model)
    scenario = load_scenario("default", [f"profile={tmp_path}", "run.progress=false"])
    profile = Profile.model_validate(yaml.safe_load((tmp_path / "profile.yaml").read_text()))
    assert scenario.recall_stats == profile.recall_stats
    assert scenario.hardware.name == load_scenario("default").hardware.name  # a stats-only profile keeps the card
    policy, link = scenario.policy["pulseinfer"], LinkModel(scenario.hardware)
    n, k = 3000, policy.budget_tokens // policy.block_size
    # off a block boundary: no block is leaving the recent window (those fresh misses come every block_size steps)
    ctx, warm = np.full(n, 100_007), np.zeros(n, dtype=bool)
    volumes = {}
    for name, stats in (("profile", scenario.recall_stats), ("default", RecallStatsSpec())):
        recall = RecallModel(scenario.model, policy, stats, link)
        fragments = recall_step.step(recall, ctx, warm, np.random.default_rng(0)).fragments.sum()
        expected = n * scenario.model.num_layers * recall.expected_layer_fragments(cold=False)
        assert fragments == pytest.approx(expected, rel=0.03)
        volumes[name] = fragments / (n * scenario.model.num_layers * k)
    assert volumes["profile"] != pytest.approx(volumes["default"], rel=0.1)
