"""Workload section: which requests arrive when (a trace, or seeded synthetic arrivals), and how a session
trace is replayed closed loop."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from sim.config.checks import synthetic_size_problem
from sim.config.spec import PositiveFloat, PositiveInt, Spec


class ColumnsSpec(Spec):
    """Which columns of a generic CSV / JSONL trace hold the arrival time and the token counts."""

    arrival: Annotated[str, Field(min_length=1)]
    arrival_unit: Literal["s", "ms", "us", "datetime"] = "s"  # datetime: seconds since the earliest row
    prompt_tokens: Annotated[str, Field(min_length=1)]
    output_tokens: Annotated[str, Field(min_length=1)]


class SessionsSpec(Spec):
    """Closed-loop replay of a session trace (``sim/serving/sessions.py``).

    Sessions start at seeded Poisson times (the first at 0 s, mean gap 1 / ``session_rate_per_s``), in the
    trace's session order; at most ``max_concurrent_sessions`` run at once (later starts wait for a free
    slot). Within a session, request k + 1 is issued its ``think_time_s`` after request k finished.
    ``max_sessions`` above the trace's session count replays its sessions again, in order (counted).
    """

    session_rate_per_s: PositiveFloat = 0.05
    max_concurrent_sessions: PositiveInt | None = None  # None = no cap
    max_sessions: PositiveInt | None = None  # first N sessions (more: replayed again); None = each once
    max_think_time_s: Annotated[float, Field(ge=0)] | None = None  # cap recorded pauses (counted); None = as recorded


class SyntheticSpec(Spec):
    """Poisson arrivals with lognormal prompt and output lengths (mean and coefficient of variation)."""

    num_requests: PositiveInt
    rate_per_s: PositiveFloat
    prompt_tokens_mean: Annotated[float, Field(gt=0, le=10_000_000)]
    output_tokens_mean: Annotated[float, Field(gt=0, le=10_000_000)]
    prompt_tokens_cv: Annotated[float, Field(ge=0, le=10)] = 1.0
    output_tokens_cv: Annotated[float, Field(ge=0, le=10)] = 0.5
    # At most this many requests in flight: an arrival waits for a finished one, as a benchmark client's
    # --max-concurrency does (vLLM `bench serve`, SGLang `bench_serving`); its arrival is when it is sent. With a
    # very high rate_per_s this is a closed loop at that concurrency. None: open loop.
    max_concurrency: PositiveInt | None = None

    @field_validator("num_requests")
    @classmethod
    def _fits_in_memory(cls, num_requests: int) -> int:
        problem = synthetic_size_problem(num_requests)  # refused with the estimate, before numpy allocates
        if problem:
            raise ValueError(problem)
        return num_requests


class ServeGenSpec(Spec):
    """Arrivals generated from a ServeGen slice (``traces.servegen``): per-client rate windows split a target
    rate, each client's gaps drawn from its window's fitted Gamma/Weibull, lengths from its own distributions.

    ``slice`` is a shipped slice name (``traces.SHIPPED_SERVEGEN_SLICES``) or a folder of ServeGen
    ``chunk-N-trace.csv`` / ``chunk-N-dataset.json`` files; ``start_s`` is where the generated stretch starts on
    ServeGen's clock (the shipped slice spans 14 days, 1,209,600 s); ``lengths`` is ``servegen`` (each client's
    own length distributions) or a shipped trace name / trace path whose (prompt, output) pairs are drawn instead
    (arrivals unchanged). Seeded from the scenario's seed on its own stream.
    """

    slice: Annotated[str, Field(min_length=1)] = "language_m_large"
    target_rate_per_s: PositiveFloat
    duration_s: PositiveFloat
    start_s: Annotated[float, Field(ge=0)] = 0.0
    lengths: Annotated[str, Field(min_length=1)] = "servegen"

    @model_validator(mode="after")
    def _fits_in_memory(self) -> ServeGenSpec:
        expected = self.target_rate_per_s * self.duration_s
        problem = synthetic_size_problem(max(1, math.ceil(expected)))
        if problem:
            raise ValueError(f"target_rate_per_s x duration_s = {expected:.3g} requests: {problem}")
        return self


class WorkloadSpec(Spec):
    """Which requests arrive when. ``trace`` is a shipped trace name or a file path; ``synthetic``
    generates Poisson arrivals instead, ``servegen`` ServeGen's per-client arrivals (exactly one of the three;
    with ``synthetic`` or ``servegen`` set ``trace: null``).

    ``format`` picks the reader (``traces.FORMATS``; ``auto`` guesses from the name, extension and first
    line); ``csv`` and ``jsonl`` read any file through ``columns``. A session trace (``kvcache_tester``) is
    replayed closed loop with ``sessions`` (defaults if absent); the window and time-scale keys do not apply
    to it (sessions have no shared clock), the prompt-length filter does.
    """

    trace: str | None = "mooncake_conversation"
    format: Literal["auto", "mooncake", "azure", "ragpulse", "kvcache_tester", "burstgpt", "csv", "jsonl"] = "auto"
    columns: ColumnsSpec | None = None  # column mapping for format csv / jsonl
    week: PositiveInt | None = None  # RAGPulse: which week of a multi-week file (each week has its own clock)
    sessions: SessionsSpec | None = None  # closed-loop replay of a session trace
    synthetic: SyntheticSpec | None = None
    servegen: ServeGenSpec | None = None
    start_s: Annotated[float, Field(ge=0)] | None = None  # window on the trace's own clock
    end_s: PositiveFloat | None = None
    max_requests: PositiveInt | None = None
    time_scale: PositiveFloat = 1.0  # > 1 stretches inter-arrival times (lower load)
    target_rate_per_s: PositiveFloat | None = None  # alternative to time_scale
    min_prompt_tokens: PositiveInt | None = None
    max_prompt_tokens: PositiveInt | None = None

    @model_validator(mode="after")
    def _one_source(self) -> WorkloadSpec:
        if self.servegen is not None:
            self._servegen_alone()
        elif (self.trace is None) == (self.synthetic is None):
            raise ValueError("give exactly one of workload.trace and workload.synthetic")
        if self.target_rate_per_s is not None and self.time_scale != 1.0:
            raise ValueError(
                f"give workload.time_scale or workload.target_rate_per_s, not both: time_scale is {self.time_scale} "
                f"(the scenario file's, unless set) and target_rate_per_s {self.target_rate_per_s}; add "
                "--set workload.time_scale=1 to use the target rate"
            )
        if self.start_s is not None and self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError(f"workload.end_s ({self.end_s}) must be > workload.start_s ({self.start_s})")
        if self.columns is not None and self.format not in ("auto", "csv", "jsonl"):
            raise ValueError(f"workload.columns applies to format csv or jsonl, not {self.format}")
        if self.format in ("csv", "jsonl") and self.columns is None:
            raise ValueError(f"workload.format {self.format} needs workload.columns (arrival, prompt_tokens, ...)")
        if self.synthetic is not None and (self.sessions is not None or self.columns is not None):
            raise ValueError("workload.sessions and workload.columns apply to a trace, not to workload.synthetic")
        return self

    def _servegen_alone(self) -> None:
        """workload.servegen excludes the other sources and the trace-only keys (one line naming them)."""
        others = [key for key, value in (("trace", self.trace), ("synthetic", self.synthetic)) if value is not None]
        if others:
            extra = f" (trace is {self.trace!r}, set workload.trace: null)" if self.trace is not None else ""
            raise ValueError(
                f"give one of workload.trace, workload.synthetic and workload.servegen, not "
                f"{' and '.join(f'workload.{k}' for k in [*others, 'servegen'])}{extra}"
            )
        trace_only = {
            "format": None if self.format == "auto" else self.format,
            "columns": self.columns,
            "week": self.week,
            "sessions": self.sessions,
            "start_s": self.start_s,
            "end_s": self.end_s,
            "time_scale": None if self.time_scale == 1.0 else self.time_scale,
            "target_rate_per_s": self.target_rate_per_s,
        }
        given = [key for key, value in trace_only.items() if value is not None]
        if given:
            raise ValueError(
                f"workload.{given[0]} ({trace_only[given[0]]}) applies to a trace, not to workload.servegen; use "
                "workload.servegen.target_rate_per_s, .start_s and .duration_s (and set workload.time_scale: 1)"
            )
