"""Write an engine card's defaults into a scenario being loaded (sim/config/loader.py), where it does not set them.

The engine owns the scheduler. Its card (sim/config/engine.py :func:`engine_defaults`) fills ``serving.mixed_prefill``
(colocated prefill), each policy's ``chunked_prefill_tokens``, ``max_running_requests``, ``new_token_ratio_init/min``,
``retract`` and ``preempt_victim`` (a dense policy's ``block_size`` and ``prefix_cache`` too), ``hardware.reserve_gib``
(HBM per GPU that is neither weights nor KV) and ``engine.cuda_graph_max_batch``. The reserve and the graphs follow the
scenario's own budget and running cap where every policy sets the same one (the server's), else the card's. Order: a
policy preset < the engine < the scenario file, its profile and ``--set``. The resolved ``scenario.yaml`` shows them.
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
    entries = {n: e for n, e in (raw.get("policy") or {}).items() if isinstance(e, dict)}
    own = [{k: e[k] for k in ("chunked_prefill_tokens", "max_running_requests") if k in given.get(f"policy.{n}", ())}
           for n, e in entries.items()]  # fmt: skip
    budget, running = (_shared(own, key) for key in ("chunked_prefill_tokens", "max_running_requests"))
    args = (engine, hardware.hbm_gib, hardware.name, tp, weight_gib, model.max_seq_len, str(usage), budget, running)
    defaults = engine_defaults(*args)
    if "mixed_prefill" not in given.get("serving", set()) and serving.get("prefill", "colocated") == "colocated":
        serving["mixed_prefill"] = defaults.mixed_prefill
    if raw["hardware"].get("reserve_gib") is None:  # unset (a shipped card) or null (a profile's dump)
        raw["hardware"]["reserve_gib"] = round(defaults.reserve_gib, 4)
    if model.is_mla and not engine.mla_cache and "mla_cache" not in raw["model"]:  # a --set wins
        raw["model"]["mla_cache"] = False
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
    for name, entry in entries.items():
        mine = given.get(f"policy.{name}", set())
        for key, value in knobs.items():
            if key in mine or (key in DENSE_ONLY and entry.get("kind", "dense") != "dense"):
                continue
            if key == "prefix_cache" and entry.get("hicache"):
                continue  # HiCache is a tier of the prefix cache: the preset that asks for it keeps the cache on
            if key == "max_running_requests" and engine.running_within_budget:
                value = min(value, entry.get("chunked_prefill_tokens", value))  # this policy's budget
            entry[key] = value


def _shared(own: list[dict[str, Any]], key: str) -> int | None:
    """The value every policy sets itself for ``key`` (an int), else None (the card's default then)."""
    values = {d.get(key) for d in own}
    value = values.pop() if len(values) == 1 else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
