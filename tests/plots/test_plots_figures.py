"""Each figure function draws from a small fixture table: labelled axes, one artist per policy, fixed colours."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
from matplotlib.collections import QuadMesh
from matplotlib.container import BarContainer
from matplotlib.figure import Figure

import plots
from plots.style import KNOWN_POLICIES, MissingData, nice_step, policy_styles

matplotlib.use("Agg")


def _data_lines(ax) -> dict[str, object]:
    """Lines labelled with a policy name (reference lines such as the SLO are labelled otherwise)."""
    return {line.get_label().split(" (")[0]: line for line in ax.get_lines() if not line.get_label().startswith("_")}


def _legend_title(fig) -> str:
    (legend,) = fig.legends  # legends sit under the axes, never over a line
    return legend.get_title().get_text()


def _assert_labelled(ax) -> None:
    assert ax.get_xlabel() and ax.get_ylabel(), "both axes need a label"


@pytest.mark.parametrize("draw", [plots.tpot_cdf, plots.ttft_cdf])
def test_latency_cdf_one_line_per_policy_with_slo_line(requests_df, draw):
    fig = draw(requests_df, slo_s=0.1)
    ax = fig.axes[0]
    _assert_labelled(ax)
    lines = _data_lines(ax)
    assert [p for p in lines if not p.startswith("SLO")] == ["sglang", "headwise", "pulseinfer"]
    assert any(label.startswith("SLO") for label in lines)
    assert ax.get_title()


def test_latency_cdf_title_says_when_all_policies_coincide(requests_df):
    assert plots.ttft_cdf(requests_df).axes[0].get_title().endswith("; the same for every policy")
    assert plots.tpot_cdf(requests_df).axes[0].get_title() == "Time per output token (TPOT)"


def test_tpot_cdf_uses_log_axis_when_values_span_decades_and_notes_missing(requests_df):
    fig = plots.tpot_cdf(requests_df)
    assert fig.axes[0].get_xscale() == "log"
    assert "1 of 30 requests per policy have no TPOT" in _legend_title(fig)


def test_throughput_and_batch_panels_have_one_line_per_policy(steps_df):
    fig = plots.throughput_over_time(steps_df, bin_s=5.0)
    assert len(fig.axes) == 2
    for ax in fig.axes:
        assert ax.get_ylabel()
        assert [line.get_color() for line in ax.get_lines()] == ["tab:blue", "tab:orange", "tab:red"]
    assert list(_data_lines(fig.axes[0])) == ["sglang", "headwise", "pulseinfer"]
    assert fig.axes[-1].get_xlabel() == "simulated time [s]"


def test_throughput_bins_sum_decode_tokens_per_second(steps_df):
    # pulseinfer decode steps: 54 of 60 (every 10th is prefill), batch 10 + i % 3; run ends at 29.9 s
    ax = plots.throughput_over_time(steps_df, bin_s=30.0).axes[0]
    decode = steps_df[(steps_df["policy"] == "pulseinfer") & (steps_df["phase"] == "decode")]
    (y,) = _data_lines(ax)["pulseinfer"].get_ydata()
    assert y == pytest.approx(decode["batch_size"].sum() / 29.9)


def test_link_utilisation_leaves_out_policies_without_link_traffic(steps_df):
    fig = plots.link_utilisation(steps_df, bin_s=10.0)
    ax = fig.axes[0]
    _assert_labelled(ax)
    assert list(_data_lines(ax)) == ["headwise", "pulseinfer"]
    assert _legend_title(fig) == "no link traffic: sglang"
    # 0.3 s busy in each 0.4 s step, one step every 0.5 s -> 60 %; the last bin covers 20 - 29.9 s only
    assert _data_lines(ax)["pulseinfer"].get_ydata() == pytest.approx([60.0, 60.0, 6 / 9.9 * 100])


def test_time_series_spread_a_long_step_over_the_bins_it_overlaps(steps_df):
    one = steps_df[steps_df["policy"] == "pulseinfer"].head(1).assign(start_s=5.0, duration_s=10.0, link_busy_s=10.0)
    (line,) = plots.link_utilisation(one, bin_s=10.0).axes[0].get_lines()
    assert line.get_ydata() == pytest.approx([50.0, 100.0])  # [0, 10): 5 s busy; [10, 15): 5 s over 5 s


def test_until_s_cuts_the_time_axis_and_names_policies_that_run_past_it(steps_df):
    longer = steps_df.copy()
    longer.loc[longer["policy"] == "headwise", "start_s"] *= 10  # headwise runs to ~295 s
    fig = plots.throughput_over_time(longer, until_s=40.0)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["sglang", "headwise (runs to 295 s)", "pulseinfer"]
    assert fig.axes[0].get_xlim()[1] == pytest.approx(40.0 * 1.02)
    assert "first 40 s shown" in fig.axes[0].get_title()


def test_memory_over_time_draws_hbm_capacity(steps_df):
    fig = plots.memory_over_time(steps_df, hbm_gib=140.4)
    for ax in fig.axes:
        assert ax.get_ylabel()
        assert [line.get_color() for line in ax.get_lines()][:3] == ["tab:blue", "tab:orange", "tab:red"]
    assert list(_data_lines(fig.axes[0])) == ["sglang", "headwise", "pulseinfer", "HBM 140.4 GiB"]
    assert fig.axes[0].get_lines()[1].get_ydata() == pytest.approx(70.0)  # headwise: 70 GiB throughout


def test_recall_per_step_skips_policies_that_never_recall(steps_df):
    fig = plots.recall_per_step(steps_df)
    ax = fig.axes[0]
    _assert_labelled(ax)
    assert list(_data_lines(ax)) == ["headwise", "pulseinfer"]
    assert _legend_title(fig) == "no recall: sglang"
    assert ax.get_xscale() == "linear"  # 0.2-2 GB: one decade


def test_recall_per_step_goes_log_when_policies_differ_by_decades(steps_df):
    wide = steps_df.copy()
    wide.loc[wide["policy"] == "pulseinfer", "recall_bytes"] *= 1000
    assert plots.recall_per_step(wide).axes[0].get_xscale() == "log"


def test_recall_per_step_with_no_recall_at_all_is_missing_data(steps_df):
    with pytest.raises(MissingData, match="no policy recalls"):
        plots.recall_per_step(steps_df.assign(recall_bytes=0))


def test_layer_recall_heatmap_one_panel_per_recalling_policy(layer_recall_df):
    fig = plots.layer_recall_heatmap(layer_recall_df)
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert [ax.get_title() for ax in panels] == ["headwise", "pulseinfer"]
    for ax in panels:
        assert ax.get_ylabel() == "layer" and len(ax.collections) == 1
        assert isinstance(ax.collections[0], QuadMesh)
    assert panels[-1].get_xlabel() == "simulated time [s]"
    colourbars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert [ax.get_ylabel() for ax in colourbars] == ["GB per 10 s"] * 2
    assert "no recall: sglang" in fig.get_suptitle()


def test_layer_recall_heatmap_merges_bins_cuts_time_and_blanks_after_the_end(layer_recall_df):
    shorter = layer_recall_df[~((layer_recall_df["policy"] == "pulseinfer") & (layer_recall_df["time_s"] >= 60))]
    fig = plots.layer_recall_heatmap(shorter, until_s=80.0, max_columns=4)
    headwise, pulseinfer = (ax.collections[0].get_array() for ax in fig.axes if ax.get_label() != "<colorbar>")
    assert headwise.shape == (8, 4)  # 80 s in 20 s columns (two 10 s bins each)
    assert float(headwise[0, 0]) == pytest.approx((0 + 1) * 0.1)  # layer 0: 0.0 + 0.1 GB
    assert pulseinfer.mask[:, 3].all() and not pulseinfer.mask[:, 2].any()  # ended at 60 s
    assert "headwise (runs to 120 s)" in [ax.get_title() for ax in fig.axes]


def test_ablation_bars_one_bar_group_per_policy_with_ratio_labels(summary_df):
    ax = plots.ablation_bars(summary_df).axes[0]
    _assert_labelled(ax)
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    assert [b.get_label() for b in bars] == list(summary_df["policy"])
    labels = [t.get_text() for t in ax.texts]
    assert labels == ["1.00\u00d7", "1.20\u00d7", "0.80\u00d7", "1.50\u00d7"]


def test_layer_pipeline_gantt_one_panel_per_policy_with_preempted_pieces(timeline_df):
    fig = plots.layer_pipeline_gantt(timeline_df, step_id=1)
    assert [ax.get_title() for ax in fig.axes] == ["headwise, step 1", "pulseinfer, step 1"]
    for ax in fig.axes:
        assert ax.get_xlabel() == "time since step start [ms]"
        kinds = [c.get_label() for c in ax.containers]
        assert kinds[:2] == ["transfer", "compute"] and len(ax.containers) == 3  # + the pre-empted pieces
        assert ax.get_xlim()[0] == 0
    assert fig.axes[0].get_ylabel() == "layer"


def test_layer_pipeline_gantt_picks_the_median_length_step_by_default(timeline_df):
    shorter_step_0 = ~((timeline_df["step_id"] == 0) & (timeline_df["layer"] == 7))
    timeline = timeline_df[shorter_step_0].copy()
    timeline.loc[timeline["step_id"] == 2, "end_s"] += 0.01  # step 2 longest
    fig = plots.layer_pipeline_gantt(timeline)
    assert [ax.get_title() for ax in fig.axes] == ["headwise, step 1", "pulseinfer, step 1"]


def test_missing_column_names_the_table_and_column(steps_df):
    with pytest.raises(MissingData, match="steps.csv lacks column.*link_busy_s"):
        plots.link_utilisation(steps_df.drop(columns="link_busy_s"))


def test_policy_colours_are_fixed_and_shared_across_figures(steps_df, requests_df):
    assert policy_styles(["pulseinfer", "sglang"])["sglang"]["color"] == KNOWN_POLICIES["sglang"][0]
    others = policy_styles(["sglang", "variant_a", "variant_b"])
    assert others["variant_a"]["color"] != others["variant_b"]["color"]
    colours = [
        _data_lines(fig.axes[0])["pulseinfer"].get_color()
        for fig in (plots.tpot_cdf(requests_df), plots.recall_per_step(steps_df), plots.link_utilisation(steps_df))
    ]
    assert colours == [KNOWN_POLICIES["pulseinfer"][0]] * 3


def test_figures_are_pyplot_free_figures(requests_df):
    fig = plots.ttft_cdf(requests_df)
    assert type(fig) is Figure and fig.canvas.manager is None


@pytest.mark.parametrize(("span", "step"), [(1523.0, 20.0), (29.9, 0.5), (1.0, 0.01), (100.0, 1.0)])
def test_nice_step_gives_at_most_100_bins(span, step):
    assert nice_step(span) == pytest.approx(step)


def test_layer_recall_heatmap_keeps_time_bins_without_rows_as_zero(layer_recall_df):
    gappy = layer_recall_df[~layer_recall_df["time_s"].isin([30.0, 40.0])]
    fig = plots.layer_recall_heatmap(gappy)
    mesh = fig.axes[0].collections[0]
    assert mesh.get_array().shape == (8, 12)  # still 12 ten-second bins
    assert mesh.get_array()[:, 3:5].sum() == 0


def test_layer_recall_heatmap_shares_one_colour_scale_across_policies(layer_recall_df):
    scaled = layer_recall_df.assign(
        recall_bytes=np.where(layer_recall_df["policy"] == "headwise", 10, 1) * layer_recall_df["recall_bytes"]
    )
    fig = plots.layer_recall_heatmap(scaled)
    meshes = [ax.collections[0] for ax in fig.axes if ax.get_label() != "<colorbar>"]
    limits = {mesh.get_clim() for mesh in meshes}
    assert len(meshes) == 2 and len(limits) == 1
    assert limits.pop() == (0.0, pytest.approx(max(float(np.nanmax(m.get_array())) for m in meshes)))
