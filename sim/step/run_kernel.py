"""Compiled timing of a run of offloaded decode steps (skip-ahead, sim/serving/offload_run.py).

:func:`time_run` times k planned steps in order exactly as k calls of :func:`sim.step.timing.run_step` would: the
step's offload writes join the D2H queue (``StepDevices.queue_d2h``), its H2D times stretch by the D2H slowdown
(``LinkModel.d2h_slowdown``, ``timing.stretched``), the interruptible pipeline (sim/step/kernels.py) or the
sequential one (``run_closed_form``, ported line by line in :func:`_sequential`) runs from the link's state the
previous step left, and the clock advances as SimPy's timeouts advance it. Each line is the
reference's floating-point operation in the reference's order, so the times are equal bit for bit
(tests/sim/test_skip_ahead.py compares whole runs). The loop stops before the first step that ends at or after
the next event of another process, or that would be the ``stop_recall``-th step that recalls.
"""

from __future__ import annotations

import math

import numpy as np

from sim.step.kernels import HAVE_NUMBA, _interruptible

if HAVE_NUMBA:
    from numba import njit


def _sequential(t0, x, recall_s, gather_s, slow, link_free, stalls):  # noqa: PLR0913
    """:func:`sim.step.pipeline.run_closed_form` for one step whose layers all compute ``x`` seconds, recall
    ``recall_s`` (× ``slow``, as run_step stretches them) after gathering ``gather_s``; fills ``stalls``."""
    gpu_free = t0
    issue = t0
    host_free = t0
    stall = 0.0
    busy = 0.0
    gbusy = 0.0
    for layer in range(recall_s.shape[0]):
        r = recall_s[layer] * slow if slow != 1.0 else recall_s[layer]
        g = gather_s[layer]
        ready = gpu_free
        if r > 0.0:
            start = issue
            if g > 0.0:
                host_free = (issue if issue > host_free else host_free) + g
                gbusy += g
                start = host_free
            if link_free > start:
                start = link_free
            link_free = start + r
            busy += r
            if link_free > ready:
                stalls[layer] = link_free - ready
                stall += stalls[layer]
                ready = link_free
        issue = ready
        gpu_free = ready + x
    return gpu_free, stall, busy, link_free, gbusy


def _time_run(  # noqa: PLR0913
    now_s, layer_s, num_layers, has_recall, prefetch, correction, lookahead, chunk_bytes, overhead_s, head_s,
    d2h_s, coupling, has_d2h, link_free, d2h_free, d2h_busy, next_event_s, stop_recall, interruptible, recall_s,
    gather_s,
):  # fmt: skip
    k = layer_s.shape[0]
    times = np.empty(k + 1)
    stalls = np.zeros(k)
    busys = np.zeros(k)
    gathers = np.zeros(k)
    layer_stalls = np.zeros((k, num_layers))
    times[0] = now_s
    now = now_s
    recalled = 0
    done = 0
    for t in range(k):
        start = now
        x = layer_s[t]
        compute_sum = 0.0
        for _ in range(num_layers):  # sum([x] * L), left to right
            compute_sum += x
        step_free, step_busy = d2h_free, d2h_busy
        if d2h_s >= 0.0:  # StepDevices.queue_d2h
            step_free = (start if start > d2h_free else d2h_free) + d2h_s
            step_busy = d2h_busy + d2h_s
        slow = 1.0
        if has_d2h:  # LinkModel.d2h_slowdown
            busy_s = step_free - start
            if not (busy_s <= 0.0 or coupling == 0.0 or compute_sum <= 0.0):
                frac = busy_s / compute_sum
                if frac > 1.0:
                    frac = 1.0
                slow = 1.0 / (1.0 - coupling * frac)
        if has_recall[t]:
            if recalled + 1 >= stop_recall:
                break
            if interruptible:
                pre = prefetch[t].copy()
                cor = correction[t].copy()
                if slow != 1.0:  # timing.stretched
                    for jobs in (pre, cor):
                        for i in range(jobs.shape[0]):
                            extra = jobs[i, 2] * (slow - 1.0) if jobs[i, 1] > 0 else 0.0
                            jobs[i, 1] += extra
                            jobs[i, 2] += extra
                compute = np.full(num_layers, x)
                end_s, item_stalls, stall, busy, free, gbusy = _interruptible(
                    start + overhead_s, compute, pre, cor, lookahead, chunk_bytes, link_free
                )
            else:
                item_stalls = np.zeros(num_layers)
                end_s, stall, busy, free, gbusy = _sequential(
                    start + overhead_s, x, recall_s[t], gather_s[t], slow, link_free, item_stalls
                )
            end = start + (end_s + head_s - start)
            if end >= next_event_s:
                break
            recalled += 1
            link_free = free
            stalls[t], busys[t], gathers[t] = stall, busy, gbusy
            layer_stalls[t] = item_stalls
        else:
            end = start + (overhead_s + compute_sum + head_s)
            if end >= next_event_s:
                break
        d2h_free, d2h_busy = step_free, step_busy
        times[t + 1] = end
        now = end
        done = t + 1
    return done, times, stalls, busys, gathers, layer_stalls, link_free, d2h_free, d2h_busy


if HAVE_NUMBA:
    _sequential = njit(cache=True)(_sequential)
    _time_run = njit(cache=True)(_time_run)


def time_run(
    now_s: float,
    layer_s: np.ndarray,
    num_layers: int,
    has_recall: np.ndarray,
    plan: tuple[np.ndarray, np.ndarray] | None,
    lookahead_items: int,
    chunk_bytes: float,
    overhead_s: float,
    head_s: float,
    d2h: tuple[float, float, bool],
    link_state: tuple[float, float, float],
    next_event_s: float,
    stop_recall: float = math.inf,
    sequential: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple:
    """Time up to k planned offloaded steps from ``now_s`` (module docstring).

    Args:
        layer_s: float64 [k] GPU seconds of each layer per step; has_recall: bool [k].
        plan: (prefetch, correction), float64 [k, L, 4] each, the steps' interruptible plans (sim/step/cost.py
            ``InterruptPlan``); None with ``sequential``.
        d2h: (seconds of one step's offload writes, −1 when it queues none; the card's D2H coupling; whether D2H is
            modelled).
        link_state: (link queue end, D2H queue end, D2H seconds queued so far) before the run.
        stop_recall: the run stops before its ``stop_recall``-th recalling step (the timeline's step).
        sequential: (link seconds, gather seconds), float64 [k, L] each, to time the steps with the sequential
            pipeline (``run_closed_form``) instead of the interruptible one (``plan`` None).

    Raises:
        ValueError: neither or both of ``plan`` and ``sequential`` given.

    Returns:
        (j steps timed, times float64 [k + 1] of which the first j + 1 are the boundaries, stall, link busy and
        gather busy float64 [k], layer stalls float64 [k, L], then the link state after the j steps).
    """
    if (plan is None) == (sequential is None):
        raise ValueError("time_run needs an interruptible plan or the sequential pipeline's times, not both")
    link_free, d2h_free, d2h_busy = link_state
    unused_jobs, unused_times = np.zeros((1, 1, 4)), np.zeros((1, 1))  # the kernel's arguments of the other pipeline
    prefetch, correction = plan if plan is not None else (unused_jobs, unused_jobs)
    recall_s, gather_s = sequential if sequential is not None else (unused_times, unused_times)
    return _time_run(
        float(now_s), np.ascontiguousarray(layer_s, dtype=np.float64), int(num_layers),
        np.ascontiguousarray(has_recall, dtype=np.bool_), np.ascontiguousarray(prefetch, dtype=np.float64),
        np.ascontiguousarray(correction, dtype=np.float64), int(lookahead_items), float(chunk_bytes),
        float(overhead_s), float(head_s), float(d2h[0]), float(d2h[1]), bool(d2h[2]), float(link_free),
        float(d2h_free), float(d2h_busy), float(next_event_s), float(stop_recall), sequential is None,
        np.ascontiguousarray(recall_s, dtype=np.float64), np.ascontiguousarray(gather_s, dtype=np.float64),
    )  # fmt: skip
