"""The bill of a run: GPUs, GPU-hours and, when the user gives a price for the card, what the run costs.

No price is shipped as fact: ``cost.gpu_hour_usd`` (a scenario section) or ``pulseinfer simulate --gpu-hour-usd
CARD=PRICE`` gives one. Columns (:data:`BILL_COLUMNS`, then :data:`PRICED_COLUMNS` when the card has a price):

* ``gpus`` = replicas × ``tp_size`` decode GPUs, plus with ``serving.prefill: disaggregated`` each replica's
  prefill pool, replicas × ``num_prefill_gpus`` × ``tp_size`` (every replica simulated owns its pool;
  sim/serving/replica.py ``prefill_gpus``);
* ``gpu_hours`` = ``gpus`` × the simulated span (``duration_s``, first arrival to last finish or the horizon) / 3600;
* ``gpu_hour_usd`` = the card's price (US$ per GPU-hour); ``usd_per_hour`` = ``gpus`` × that price;
* ``usd_per_million_output_tokens`` = ``usd_per_hour`` / 3600 / ``decode_tokens_per_s`` × 1e6 (decode tokens, as
  ``decode_tokens_per_s`` counts them; NaN when none was decoded).
"""

from __future__ import annotations

import math

from sim.config import Scenario, ServingSpec

BILL_COLUMNS = ["gpus", "gpu_hours"]
PRICED_COLUMNS = ["gpu_hour_usd", "usd_per_hour", "usd_per_million_output_tokens"]


def deployment_gpus(serving: ServingSpec, replicas: int) -> int:
    """GPUs of ``replicas`` replicas (decode, plus each replica's prefill pool when disaggregated)."""
    per_replica = 1 + (serving.num_prefill_gpus if serving.prefill == "disaggregated" else 0)
    return replicas * per_replica * serving.tp_size


def usd_per_million(price_usd: float | None, gpus: int, tokens_per_s: float) -> float:
    """US$ per million output tokens of ``gpus`` GPUs at ``price_usd`` per GPU-hour producing ``tokens_per_s``;
    NaN without a price, GPUs or tokens."""
    if price_usd is None or not gpus or not tokens_per_s or math.isnan(tokens_per_s):
        return math.nan
    return price_usd * gpus / 3600.0 / tokens_per_s * 1e6


def card_price(scenario: Scenario) -> float | None:
    """The scenario's own card's price per GPU-hour (``cost.gpu_hour_usd``), or None."""
    return scenario.cost.gpu_hour_usd.get(scenario.hardware.name)


def bill(summary: dict, scenario: Scenario) -> dict:
    """The bill columns of one summary row of ``scenario`` (``serving.replicas`` replicas): ``gpus``,
    ``gpu_hours`` and, when the scenario prices its card, ``gpu_hour_usd``, ``usd_per_hour`` and
    ``usd_per_million_output_tokens`` (module docstring). ``duration_s`` NaN (nothing issued) gives NaN hours."""
    gpus = deployment_gpus(scenario.serving, scenario.serving.replicas)
    out = {"gpus": gpus, "gpu_hours": gpus * summary["duration_s"] / 3600.0}
    price = card_price(scenario)
    if price is not None:
        out.update(
            gpu_hour_usd=price,
            usd_per_hour=gpus * price,
            usd_per_million_output_tokens=usd_per_million(price, gpus, summary["decode_tokens_per_s"]),
        )
    return out
