"""Measured inputs: selection statistics of a real model and calibrated profiles (``pulseinfer calibrate``)."""

from __future__ import annotations

from typing import Annotated

import numpy as np
from pydantic import Field, model_validator

from sim.config.cards import HardwareSpec, ModelSpec
from sim.config.files import short_repr
from sim.config.spec import NonNeg, PositiveFloat, PositiveInt, Spec


class RecallStatsSpec(Spec):
    """How selections change from step to step, per layer and per request (docs/design.md §7).

    The fraction of a (request, layer)'s selected blocks that changes from one step to the next is drawn per
    (request, layer, step) from a Kumaraswamy(a, b) distribution on [0, 1] whose mean follows
    ``change_mean_by_depth`` (piecewise linear in normalised depth l / (num_layers − 1), so statistics of a
    30-layer model transfer to a 40-layer one), times factors that persist:

    * a per-request factor exp(request_sigma · z_r) and a per-(request, layer) factor exp(layer_sigma · z_rl),
      drawn when the request joins the batch (variation across requests and layers that lasts);
    * a per-request drift exp(drift_sigma · x_t), x an AR(1) process with lag-1 correlation ``drift_corr``
      (a request whose attention drifts keeps drifting for a while; it moves every layer of the step together);
    * topic shifts: with probability ``burst_prob`` per request and step a shift starts and lasts a geometric
      number of steps of mean ``burst_steps``, during which ``burst_change_frac`` of every layer's selection
      changes to blocks never selected before.

    Factors are mean-corrected (E = 1) and the product is capped at 1. Of the changed-in blocks outside a shift,
    ``returning_frac`` were selected within the last ``working_set_steps`` steps and hit the recall buffer (or
    the shared recall cache) when it holds that working set; the rest are new and always recalled. Head-wise
    selection (each KV head its own set) changes ``headwise_miss_ratio`` times as much as SoloHead's shared set.

    Defaults are measured (`pulseinfer calibrate selection`, SmolLM2-135M over the shipped text; docs/sources.md
    §8): the depth curve, a, returning fraction and working set are the 8K-context fit at budget 512
    (scenarios/profiles/smollm2-8k-selection.yaml, Gaussian-smoothed to 5 knots); the head-wise ratio is the 8K LRU
    miss 0.072 / 0.029; fresh_block_frac, layer_sigma, drift_sigma and drift_corr are the 2K fit at budget 512
    (calibrate/selection_structure.py: 87 % of layers select a block the moment it leaves the recent window; the
    layers' misses vary with a coefficient of variation of 0.80, which a per-layer factor of log-sd 0.69 reproduces
    over the measured depth curve and over the 5-knot default alike; steps co-move with a log-sd of 0.44 and a
    lag-1 correlation of 0.35); no topic shift was measured on that text (burst_prob 0). request_sigma has no
    measurement (one text) and is set at layer_sigma's level, a model assumption. Published priors they agree
    with: fewer than 25 % of blocks change per step (NOSA), adjacent-step top-k overlap of 95 % or more
    (DeepSeek-V4 sparse attention), a 12-step working set (SparseServe) — docs/sources.md §2.2, §7.
    """

    change_mean_by_depth: Annotated[list[tuple[float, float]], Field(min_length=1)] = [
        (0.0, 0.184),
        (0.25, 0.125),
        (0.5, 0.194),
        (0.75, 0.213),
        (1.0, 0.178),
    ]
    change_shape_a: PositiveFloat = 2.88  # Kumaraswamy a; b follows from the mean
    returning_frac: Annotated[float, Field(ge=0, le=1)] = 0.83
    working_set_steps: PositiveInt = 12
    # Measured W / k: distinct blocks selected over the last working_set_steps steps per selected block
    # (`pulseinfer calibrate selection`). None: the model assumption W = k (1 + w · m_l). Selections that flicker
    # among a few blocks have a far smaller working set (SmolLM2, 2K context, budget 512: 1.54 vs 2.7).
    working_set_ratio: Annotated[float, Field(ge=1)] | None = 1.75
    headwise_union_ratio: Annotated[float, Field(ge=1)] | None = None  # measured |∪_h S_h| / k; informational
    headwise_miss_ratio: Annotated[float, Field(ge=1)] = 2.48  # head-wise change / SoloHead change (measured)
    request_sigma: Annotated[float, Field(ge=0, le=3)] = 0.5  # log-sd of the per-request factor
    layer_sigma: Annotated[float, Field(ge=0, le=3)] = 0.69  # log-sd of the per-(request, layer) factor
    drift_sigma: Annotated[float, Field(ge=0, le=3)] = 0.44  # log-sd of the per-request AR(1) drift
    drift_corr: Annotated[float, Field(ge=0, lt=1)] = 0.35  # lag-1 correlation of the drift between steps
    burst_prob: Annotated[float, Field(ge=0, le=1)] = 0.0  # per request and step: a topic shift starts
    burst_steps: Annotated[float, Field(ge=1)] = 4.0  # mean length of a topic shift in steps
    burst_change_frac: Annotated[float, Field(gt=0, le=1)] = 0.5  # change fraction during a shift
    # Share of layers whose selection takes the block that has just left the recent window (every block_size
    # steps); it was never recalled, so it misses (the engine frees its device block on offload).
    fresh_block_frac: Annotated[float, Field(ge=0, le=1)] = 0.87

    @model_validator(mode="after")
    def _check_knots(self) -> RecallStatsSpec:
        depths = [d for d, _ in self.change_mean_by_depth]
        if depths != sorted(depths) or depths[0] < 0 or depths[-1] > 1:
            raise ValueError(f"change_mean_by_depth depths must rise within [0, 1], got {short_repr(depths)}")
        for _, mean in self.change_mean_by_depth:
            if not 0 < mean < 1:
                raise ValueError(f"change_mean_by_depth means must be in (0, 1), got {mean}")
        return self


class ComputeProfile(Spec):
    """Measured decode compute of one model on one device (a linear fit of microbenchmarks).

    Per decoder layer and decode step, for a batch of B requests attending T KV tokens in total::

        layer_s(B, T) = (layer_base_us + layer_per_request_us · B) · 1e-6 + layer_per_token_ns · T · 1e-9

    and after the last layer (embedding, final norm, LM head, sampling, per-step bookkeeping)::

        head_s(B) = (head_base_us + head_per_request_us · B) · 1e-6

    The form is the decode roofline of sim/step/compute.py made linear: the base is reading the layer's
    weights, the per-token term reading KV, the per-request term the activations. It holds for dense
    models; MoE expert reads (which grow with B non-linearly) are not covered. ``mape_pct`` is the mean
    absolute percentage error of the fit over its ``points`` measurements (calibrate/fit.py).
    """

    model: str  # name of the ModelSpec the measurements ran on; a scenario must use that model
    layer_base_us: NonNeg
    layer_per_request_us: NonNeg
    layer_per_token_ns: NonNeg
    head_base_us: NonNeg
    head_per_request_us: NonNeg
    mape_pct: NonNeg = 0.0
    head_mape_pct: NonNeg = 0.0
    points: Annotated[int, Field(ge=0)] = 0

    @model_validator(mode="after")
    def _check_positive(self) -> ComputeProfile:
        if self.layer_base_us + self.layer_per_request_us + self.layer_per_token_ns <= 0:
            raise ValueError(
                "layer_base_us, layer_per_request_us and layer_per_token_ns are all 0: a layer would take no time"
            )
        return self


class SelectionProfile(Spec):
    """Measured cost of block selection (Quest scores over summaries, top-k), per layer and decode step::

        select_s(C) = (base_us + per_block_ns · C · 1e-3) · 1e-6

    with C the candidate (offloaded) blocks summed over the batch's offloaded requests (of one micro-batch group).
    One mechanism with the policy's default model: without a profile, an offload policy's ``selection_launch_us``
    and ``selection_per_block_ns`` are its ``base_us`` and ``per_block_ns`` (the top-k kernel; the summaries'
    read stays in the attended tokens). When a profile has this section, its measured figures replace them and
    the block summaries stop counting as attended tokens (the measurement read them).
    """

    base_us: NonNeg
    per_block_ns: NonNeg
    mape_pct: NonNeg = 0.0
    points: Annotated[int, Field(ge=0)] = 0

    def seconds(self, candidate_blocks: float) -> float:
        """Selection seconds of one layer for ``candidate_blocks`` blocks in total (0 when there are none)."""
        if candidate_blocks <= 0:
            return 0.0
        return self.base_us * 1e-6 + self.per_block_ns * 1e-9 * candidate_blocks

    def seconds_array(self, candidate_blocks: np.ndarray) -> np.ndarray:
        """:meth:`seconds` elementwise (float64 [k] for int64 [k] candidate blocks; bit for bit the scalar form)."""
        return np.where(candidate_blocks > 0, self.base_us * 1e-6 + self.per_block_ns * 1e-9 * candidate_blocks, 0.0)


class Profile(Spec):
    """A calibrated profile (format and use: sim/config/profiles.py); sections left out fall back to cards and
    defaults."""

    name: str = "profile"
    source: str = "unspecified"
    metadata: dict[str, str | int | float | bool | None] = {}
    hardware: HardwareSpec | None = None
    model: ModelSpec | None = None
    compute: ComputeProfile | None = None
    selection: SelectionProfile | None = None
    recall_stats: RecallStatsSpec | None = None
    recall_stats_source: str | None = None
    # host costs fitted for one engine release line (``calibrate --from-measured``): a card without tiers, laid over
    # the line its ``name`` resolves to (sim/config/engine.py ``engine_card``; applied by sim/config/profiles.py)
    engine: dict[str, str | int | float | bool | None] | None = None

    @model_validator(mode="after")
    def _check_model(self) -> Profile:
        if self.compute is not None and self.model is not None and self.compute.model != self.model.name:
            raise ValueError(
                f"compute.model {short_repr(self.compute.model)} differs from model.name "
                f"{short_repr(self.model.name)}: the compute "
                "section must describe the profile's own model"
            )
        return self
