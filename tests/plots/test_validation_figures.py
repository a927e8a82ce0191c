"""The validation figures say what they compare: the measured file, model, card and engine in their titles, an ITL
panel beside TTFT and TPOT, and the per-request scatter only where the replay sent each request at its recorded
time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from plots.validation import NO_ITL, measured_cdfs, measured_scatter, validation_steps
from pulseinfer.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "traces" / "fixtures" / "measured"
SETS = ["--set", "model=llama-3.1-8b", "--set", "hardware=h100-sxm", "--set", "serving.prefill=colocated"]
SUBJECT = "bench_run.json (vllm_bench_serve) vs its replay\nmodel llama-3.1-8b · card h100-sxm ×1 · engine vllm-0.11"


def _per_request(itl: bool = True) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for source, scale in (("measured", 1.0), ("simulated", 0.8)):
        for i in range(20):
            gaps = rng.lognormal(np.log(12 * scale), 0.2, 30) if itl else None
            rows.append({"source": source, "request_id": i, "ttft_ms": 50 * scale + i, "tpot_ms": 12 * scale + i / 10,
                         "e2e_ms": (50 + 12 * 30) * scale + i, "itl_ms": gaps})  # fmt: skip
    return pd.DataFrame(rows)


def _texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def test_the_cdf_figure_has_three_panels_and_names_what_it_compares():
    fig = measured_cdfs(_per_request(), SUBJECT)
    axes = fig.get_axes()
    assert len(axes) == 3
    title = fig.get_suptitle()
    for part in ("bench_run.json", "llama-3.1-8b", "h100-sxm", "vllm-0.11"):
        assert part in title, title
    assert "ITL" in axes[2].get_xlabel() and len(axes[2].get_lines()) == 2  # measured and simulated
    assert NO_ITL not in " ".join(_texts(axes[2]))


def test_the_itl_panel_says_so_when_no_itl_was_recorded():
    fig = measured_cdfs(_per_request(itl=False), SUBJECT)
    itl = fig.get_axes()[2]
    assert _texts(itl) == [NO_ITL] and not itl.get_lines()
    # no itl_ms column at all (a requests.csv read back) is the same; the other panels are drawn
    fig = measured_cdfs(_per_request().drop(columns="itl_ms"), SUBJECT)
    assert _texts(fig.get_axes()[2]) == [NO_ITL] and len(fig.get_axes()[0].get_lines()) == 2
    # one side without ITL (a chunked stream, a tool that records none): the other drawn, the missing one named
    one = _per_request()
    one.loc[one["source"] == "measured", "itl_ms"] = None
    itl = measured_cdfs(one, SUBJECT).get_axes()[2]
    assert _texts(itl) == [f"{NO_ITL} (measured)"] and len(itl.get_lines()) == 1


def test_a_long_subject_is_wrapped_under_the_title():
    name = "x" * 150 + ".json"
    title = measured_cdfs(_per_request(), f"{name} vs its replay\nmodel m · card c · engine e").get_suptitle()
    lines = title.splitlines()
    assert len(lines) <= 4 and max(map(len, lines)) < 180 and "engine e" in title


def test_a_file_name_that_is_not_utf8_is_drawn(tmp_path):
    import os

    fig = measured_cdfs(_per_request(), f"{os.fsdecode(b'caf' + bytes([0xE9]) + b'.json')} vs its replay")
    fig.savefig(tmp_path / "x.png")  # matplotlib cannot draw a lone surrogate: shown as "?"
    assert "caf?.json" in fig.get_suptitle()


def test_the_scatter_matches_requests_and_gives_the_median_error():
    fig = measured_scatter(_per_request(), SUBJECT)
    axes = fig.get_axes()
    assert len(axes) == 3 and "h100-sxm" in fig.get_suptitle()
    labels = [t.get_text() for t in axes[0].get_legend().get_texts()]
    assert any("n=20" in t and "median error" in t for t in labels), labels
    # TTFT 0.8 · (50 + i) + ... : simulated 50·0.8 + i against 50 + i, median error about -15 %
    error = next(t for t in labels if "median error" in t).split("median error ")[1].split(" %")[0]
    assert -20 < float(error) < -10


def test_validation_steps_names_its_subject():
    steps = pd.DataFrame({"policy": "sglang", "step": range(5), "batch_size": 4, "measured_s": 0.01,
                          "simulated_s": 0.011})  # fmt: skip
    assert validation_steps(steps).get_suptitle() == ""
    title = validation_steps(steps, "model smollm2 · card cpu · device cpu · profile p.yaml").get_suptitle()
    assert "smollm2" in title and "device cpu" in title


@pytest.mark.parametrize(
    ("name", "scatter"),
    [("vllm_bench_serve.json", True), ("mlcommons_result_summary.json", False), ("sglang_bench_serving.jsonl", False)],
)
def test_validate_measured_draws_the_scatter_only_when_arrivals_are_reproduced(tmp_path, capsys, name, scatter):
    out = tmp_path / "v"
    assert main(["validate", "--measured", str(FIXTURES / name), *SETS, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert (out / "validation_cdfs.png").is_file()
    assert (out / "validation_scatter.png").is_file() == scatter
    assert ("note: no validation_scatter.png" in printed) != scatter
    assert "warning" not in printed.split("note: no validation_scatter.png")[-1]
    requests = pd.read_csv(out / "requests.csv")
    assert {"ttft_ms", "tpot_ms", "e2e_ms", "itl_p50_ms"} <= set(requests.columns)


def test_validate_measured_titles_name_the_file_model_card_engine_and_profile(tmp_path, monkeypatch):
    import plots.validation

    drawn = {}

    def keep(draw):
        def wrapped(*args, **kwargs):
            drawn[draw.__name__] = fig = draw(*args, **kwargs)
            return fig

        return wrapped

    for draw in (plots.validation.measured_cdfs, plots.validation.measured_sweep):
        monkeypatch.setattr(plots.validation, draw.__name__, keep(draw))
    argv = ["validate", "--measured", str(FIXTURES / "sglang_bench_serving.jsonl"), "--run", "all", *SETS,
            "--set", "engine=sglang-0.4.6", "--out", str(tmp_path / "v")]  # fmt: skip
    assert main(argv) == 0
    for name in ("measured_cdfs", "measured_sweep"):
        title = drawn[name].get_suptitle()
        for part in ("sglang_bench_serving.jsonl runs 0–1", "llama-3.1-8b", "h100-sxm", "sglang-0.4", "0.4.6"):
            assert part in title, (name, title)
    assert "fixtures" not in drawn["measured_cdfs"].get_suptitle()  # the base name, not the path
    argv = ["validate", "--measured", str(FIXTURES / "sglang_bench_serving.jsonl"), "--run", "1", *SETS,
            "--out", str(tmp_path / "w")]  # fmt: skip
    assert main(argv) == 0
    assert "sglang_bench_serving.jsonl run 1 " in drawn["measured_cdfs"].get_suptitle()
    # a profile given is named (its folder and file: calibrate writes every profile as profile.yaml)
    import yaml

    from calibrate.measured import measured_scenario

    hardware = measured_scenario(None, SETS[1::2], "sglang").hardware.model_dump(mode="json")
    (tmp_path / "cal").mkdir()
    (tmp_path / "cal" / "profile.yaml").write_text(yaml.safe_dump({"name": "p", "hardware": hardware}))
    argv = ["validate", "--measured", str(FIXTURES / "vllm_bench_serve.json"), *SETS, "--profile",
            str(tmp_path / "cal" / "profile.yaml"), "--out", str(tmp_path / "x")]  # fmt: skip
    assert main(argv) == 0
    assert "profile cal/profile.yaml" in drawn["measured_cdfs"].get_suptitle()
