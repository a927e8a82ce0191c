"""Write an engine card's defaults into a scenario being loaded (sim/config/loader.py), where it does not set them.

The engine owns the scheduler: what its card gives (sim/config/engine.py :func:`engine_defaults`) fills

* ``serving.mixed_prefill`` (colocated prefill only) and ``serving``'s nothing else;
* each policy's ``chunked_prefill_tokens`` (the token budget), ``max_running_requests``, ``new_token_ratio_init``
  and ``new_token_ratio_min`` (how much of the running requests' remaining output admission reserves), ``retract``
  (recompute or swap) and ``preempt_victim``; a dense policy's ``block_size`` (the pool's page) and
  ``prefix_cache``;
* ``hardware.reserve_gib``: the HBM per GPU that is neither weights nor KV pool, from the card's memory rule;
* ``engine.cuda_graph_max_batch``: the largest captured decode batch on this GPU.

Order: a policy preset < the engine's defaults < what the scenario file, its profile or ``--set`` gives (those keys
are kept as given). The values land in the resolved ``scenario.yaml`` a run writes.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from sim.config.cards import HardwareSpec, ModelSpec
from sim.config.engine import EngineSpec, engine_defaults
from sim.config.parallel import shard_model
from sim.config.spec import GIB

DEFAULT_ENGINE_NAME = "sglang"  # a scenario without an engine key: the newest SGLang line
DENSE_ONLY = ("block_size", "prefix_cache")  # offload policies choose their own block and run no prefix cache


def apply_engine(raw: dict[str, Any], given: dict[str, set[str]]) -> None:
    """Fill ``raw`` (a scenario dict with its cards expanded and its policies resolved) with the engine's defaults
    where ``given`` (section → keys the scenario sets itself) does not have them. A section that does not validate
    is left alone: :func:`~sim.config.loader.validate_scenario` then names the bad key."""
    try:
        engine = EngineSpec.model_validate(raw.get("engine"))
        hardware = HardwareSpec.model_validate({"reserve_gib": 0.0, **raw.get("hardware")})
        model = ModelSpec.model_validate(raw.get("model"))
        serving = raw.setdefault("serving", {})
        tp = serving.get("tp_size", 1)
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            return  # validation names serving.tp_size
        weight_gib = shard_model(model, tp).weight_bytes / GIB
    except (ValidationError, ValueError, TypeError, AttributeError):
        return
    usage = serving.get("usage_context", "serve")
    defaults = engine_defaults(engine, hardware.hbm_gib, hardware.name, tp, weight_gib, model.max_seq_len, str(usage))
    if "mixed_prefill" not in given.get("serving", set()) and serving.get("prefill", "colocated") == "colocated":
        serving["mixed_prefill"] = engine.mixed_prefill
    if raw["hardware"].get("reserve_gib") is None:  # unset (a shipped card) or null (a profile's dump)
        raw["hardware"]["reserve_gib"] = round(defaults.reserve_gib, 4)
    if engine.cuda_graph_max_batch is None:
        raw["engine"] = {**raw["engine"], "cuda_graph_max_batch": defaults.cuda_graph_max_batch}
    knobs = {
        "chunked_prefill_tokens": defaults.token_budget,
        "max_running_requests": defaults.max_running_requests,
        "new_token_ratio_init": engine.new_token_ratio_init,
        "new_token_ratio_min": engine.new_token_ratio_min,
        "retract": engine.preemption,
        "preempt_victim": engine.preempt_victim,
        "block_size": engine.block_tokens,
        "prefix_cache": engine.prefix_cache,
    }
    for name, entry in (raw.get("policy") or {}).items():
        if not isinstance(entry, dict):
            continue
        mine = given.get(f"policy.{name}", set())
        for key, value in knobs.items():
            if key in mine or (key in DENSE_ONLY and entry.get("kind", "dense") != "dense"):
                continue
            if key == "prefix_cache" and entry.get("hicache"):
                continue  # HiCache is a tier of the prefix cache: the preset that asks for it keeps the cache on
            entry[key] = value
