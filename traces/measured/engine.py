"""Which serving engine and release a benchmark file ran against, as the file records it (``MeasuredRun.engine``).

The names are the engines' own (``vllm``, ``sglang``, ``trtllm``); sim/config/engine.py resolves the result to a
release line. This package does not import the simulator, so the few spellings it recognises are listed here too.
"""

from __future__ import annotations

from typing import Any

ENGINE_NAMES = {
    "vllm": "vllm", "sglang": "sglang", "trtllm": "trtllm", "tensorrt-llm": "trtllm", "tensorrt_llm": "trtllm",
}  # fmt: skip
# Where benchmark files record the server's release: SGLang bench_serving's ``server_info`` (the server's
# /get_server_info, with ``version``), vLLM's ``--metadata KEY=VALUE`` pairs (saved as top-level keys), guidellm's and
# inference-perf's run metadata.
VERSION_KEYS = ("engine_version", "server_version", "vllm_version", "sglang_version", "trtllm_version")


def engine_from(backend: str | None, summary: dict[str, Any]) -> str | None:
    """``NAME-VERSION`` of the engine a benchmark file ran against (module docstring of sim/config/engine.py for the
    names): the name from the backend (``vllm``, ``sglang``, ``trtllm``; an OpenAI-compatible backend names none)
    or an ``engine`` key, the version from ``server_info.version`` or one of :data:`VERSION_KEYS` at the top level,
    under ``server_info`` or under ``metadata`` (a bare ``version`` elsewhere is a tool's or schema's, not the
    engine's). None when the file names no engine."""
    places = [summary, summary.get("server_info"), summary.get("metadata")]
    places = [p for p in places if isinstance(p, dict)]
    name = None
    for text in [backend, *(p.get("engine") for p in places), *(p.get("backend") for p in places)]:
        if isinstance(text, str):
            head = text.strip().lower().split()[0] if text.strip() else ""
            for prefix, engine in ENGINE_NAMES.items():
                if head.startswith(prefix):
                    name = engine
                    break
        if name:
            break
    if name is None:  # an OpenAI-compatible backend: an engine-specific version key names the engine
        name = next((n for n in ENGINE_NAMES.values() for p in places if p.get(f"{n}_version") is not None), None)
    if name is None:
        return None
    info = summary.get("server_info")
    candidates = [info.get("version")] if isinstance(info, dict) else []
    keys = [key for key in VERSION_KEYS if key.split("_")[0] in (name, "engine", "server")]  # not another engine's
    candidates += [place.get(key) for place in places for key in keys]
    for value in candidates:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            version = str(value).strip().lstrip("vV")
            if version[:1].isdigit():
                return f"{name}-{version}"
    return name
