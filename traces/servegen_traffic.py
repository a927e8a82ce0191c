"""ServeGen traffic: a request table generated from a ServeGen slice (traces/servegen.py reads the slice).

How ServeGen samples (`construct.py`): in each window a client gets target x (its rate / the window's total
rate); it draws ceil(that x window) gaps from its fitted distribution, rescales them to sum to the window, starts
at the window start, and draws input and output lengths by inverse CDF with one uniform shared by both fields.

How this module samples (our code, same data): for each window of [start_s, start_s + duration_s) the target
rate is split among the clients active in it (rate > 0) by their share of the window's total rate; each client's
arrivals are a renewal process whose gaps follow its window's distribution (Gamma or Weibull with the window's
shape, the scale set so the mean gap is 1 / its share of the target; exponential when the cv is 1 or the
pattern is absent), started in equilibrium (the first arrival a forward-recurrence time), so the expected count
in a window is exactly share x window and bursts carry their natural count variance; input and output lengths
are drawn independently by inverse CDF from the client's own length distribution. Clients are merged in time
order. Nothing is collapsed to a peak window. `lengths_from=` keeps the arrivals and draws (prompt, output)
pairs from another request table instead (e.g. Mooncake's, for long-context studies).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from traces._checks import check_non_negative, check_positive
from traces.schema import REQUEST_COLUMNS, TraceError, require_request_columns
from traces.servegen import GAMMA, NO_PATTERN, WEIBULL, ServeGenClient, ServeGenSlice, read_servegen

_CV_ONE = 1e-9  # a cv this close to 1 is exponential


def servegen_requests(
    slice_: ServeGenSlice | str | Path,
    target_rate_per_s: float,
    duration_s: float,
    rng: np.random.Generator,
    *,
    start_s: float = 0.0,
    lengths_from: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Generate a request table from a ServeGen slice at a target aggregate rate (module docstring).

    Args:
        slice_: a `ServeGenSlice`, or a shipped slice name / folder for `read_servegen`.
        target_rate_per_s: mean aggregate arrival rate, > 0, in every window that has an active client.
        duration_s: length of the generated stretch, > 0.
        rng: the only source of randomness: two child streams are drawn from it, one for arrivals and one for
            lengths, each used window by window, client by client (so `lengths_from` keeps a seed's arrivals).
        start_s: where the stretch starts on ServeGen's clock (s from the slice's first window), >= 0; the
            stretch must lie inside the slice's span.
        lengths_from: a request table whose (prompt_tokens, output_tokens) pairs are drawn uniformly with
            replacement instead of ServeGen's length distributions (arrivals unchanged); its hash_ids are not
            kept (resampled rows would share prefixes by accident).

    Returns:
        The request table (`REQUEST_COLUMNS` + `client_id` int64), `arrival_s` from `start_s` (so 0.0 is the
        stretch's start), request_id 0..n-1 in time order. `df.attrs`: `source` "servegen", `slice`, `start_s`,
        `duration_s`, `target_rate_per_s`, `lengths` ("servegen" or the other table's `source`), `num_clients`
        (active in the stretch), `num_windows`, `num_idle_windows` (no active client: no requests there),
        `num_clients_without_lengths` (active clients skipped: no length distribution), `num_length_fallbacks`
        (client-windows drawn from the client's first later length window because none is at or before),
        `num_floored_prompt` (prompt 0 raised to 1).

    Raises:
        TypeError / ValueError: bad arguments (named). TraceError: the stretch is outside the slice, the slice
            cannot be read, or `lengths_from` is empty.
    """
    target = check_positive("target_rate_per_s", target_rate_per_s)
    duration = check_positive("duration_s", duration_s)
    start = check_non_negative("start_s", start_s)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    sg = slice_ if isinstance(slice_, ServeGenSlice) else read_servegen(slice_)
    end = start + duration
    if end > sg.span_s + 1e-9:
        raise TraceError(
            f"ServeGen slice {sg.name!r} covers [0, {sg.span_s:.10g}) s; start_s {start:.10g} + "
            f"duration_s {duration:.10g} = {end:.10g} s runs past it"
        )
    pool = None
    if lengths_from is not None:
        require_request_columns(lengths_from, "lengths_from")
        if lengths_from.empty:
            raise TraceError("lengths_from has no rows; expected a request table to draw lengths from")
        pool = (
            lengths_from["prompt_tokens"].to_numpy(dtype=np.int64),
            lengths_from["output_tokens"].to_numpy(dtype=np.int64),
        )
    # Two child streams, so `lengths_from` (which draws differently) leaves the arrivals of a seed unchanged.
    arrival_rng = np.random.default_rng(rng.integers(2**63))
    length_rng = np.random.default_rng(rng.integers(2**63))
    usable = [c for c in sg.clients if pool is not None or c.lengths]
    skipped = {c.client_id for c in sg.clients if pool is None and not c.lengths}
    rates = np.stack([c.rate for c in usable]) if usable else np.zeros((0, len(sg.window_start_s)))
    first = int(np.searchsorted(sg.window_end_s, start, side="right"))
    last = int(np.searchsorted(sg.window_start_s, end, side="left"))
    times, prompts, outputs, ids = [], [], [], []
    num_idle = num_fallback = 0
    active_ids: set[int] = set()
    skipped_active: set[int] = set()
    for w in range(first, last):
        lo, hi = max(sg.window_start_s[w], start), min(sg.window_end_s[w], end)
        if hi <= lo:
            continue
        skipped_active.update(c.client_id for c in sg.clients if c.client_id in skipped and c.rate[w] > 0)
        total = rates[:, w].sum()
        if total <= 0:
            num_idle += 1
            continue
        for row, client in enumerate(usable):
            if rates[row, w] <= 0:
                continue
            active_ids.add(client.client_id)
            share = target * rates[row, w] / total
            t = _renewal_arrivals(arrival_rng, client, w, share, lo, hi)
            if not len(t):
                continue
            if pool is None:
                p, o, fell_back = _draw_lengths(length_rng, client, sg.window_start_s[w], len(t))
                num_fallback += fell_back
            else:
                pick = length_rng.integers(len(pool[0]), size=len(t))
                p, o = pool[0][pick], pool[1][pick]
            times.append(t)
            prompts.append(p)
            outputs.append(o)
            ids.append(np.full(len(t), client.client_id, dtype=np.int64))
    arrival = np.concatenate(times) if times else np.zeros(0)
    order = np.argsort(arrival, kind="stable")
    prompt = np.concatenate(prompts)[order] if times else np.zeros(0, dtype=np.int64)
    n = len(arrival)
    df = pd.DataFrame(
        {
            "request_id": np.arange(n, dtype=np.int64),
            "arrival_s": (arrival[order] - start).astype(np.float64),
            "prompt_tokens": np.maximum(prompt, 1).astype(np.int64),
            "output_tokens": (np.concatenate(outputs)[order] if times else np.zeros(0)).astype(np.int64),
            "hash_ids": pd.Series([[] for _ in range(n)], dtype=object),
            "client_id": (np.concatenate(ids)[order] if times else np.zeros(0)).astype(np.int64),
        },
        columns=[*REQUEST_COLUMNS, "client_id"],
    )
    df.attrs.update(
        source="servegen",
        format="servegen",
        slice=sg.name,
        start_s=start,
        duration_s=duration,
        target_rate_per_s=target,
        lengths="servegen" if pool is None else str(lengths_from.attrs.get("source", "lengths_from")),
        num_clients=len(active_ids),
        num_windows=max(last - first, 0),
        num_idle_windows=num_idle,
        num_clients_without_lengths=len(skipped_active),
        num_length_fallbacks=num_fallback,
        num_floored_prompt=int(np.count_nonzero(prompt < 1)),
    )
    return df


def _renewal_arrivals(
    rng: np.random.Generator, client: ServeGenClient, w: int, rate: float, lo: float, hi: float
) -> np.ndarray:
    """Arrival times in [lo, hi) of a stationary renewal process with mean gap 1 / rate and window w's shape."""
    mean = 1.0 / rate
    kind, k = int(client.pattern[w]), float(client.shape[w])
    if kind == NO_PATTERN or abs(client.cv[w] - 1.0) < _CV_ONE:
        kind = NO_PATTERN
    if kind == GAMMA:
        theta = mean / k
        first = rng.random() * rng.gamma(k + 1.0, theta)  # forward recurrence: U x length-biased gap

        def gaps(size: int) -> np.ndarray:
            return rng.gamma(k, theta, size)
    elif kind == WEIBULL:
        lam = mean / math.gamma(1.0 + 1.0 / k)
        first = rng.random() * lam * rng.gamma(1.0 + 1.0 / k) ** (1.0 / k)

        def gaps(size: int) -> np.ndarray:
            return lam * rng.weibull(k, size)
    else:
        first = rng.exponential(mean)

        def gaps(size: int) -> np.ndarray:
            return rng.exponential(mean, size)

    t = lo + first
    if t >= hi:
        return np.zeros(0)
    out = [np.array([t])]
    while True:
        expected = (hi - t) * rate
        batch = int(expected + 4.0 * math.sqrt(expected) + 16)
        more = t + np.cumsum(gaps(batch))
        inside = more[more < hi]
        out.append(inside)
        if len(inside) < batch:
            break
        t = float(more[-1])
    return np.concatenate(out)


def _draw_lengths(
    rng: np.random.Generator, client: ServeGenClient, window_start: float, size: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """(input, output) token draws from the client's length window for a rate window; 1 if it fell back."""
    starts = [lw.start_s for lw in client.lengths]
    at = int(np.searchsorted(starts, window_start, side="right")) - 1
    fell_back = int(at < 0)
    lw = client.lengths[max(at, 0)]
    u_in, u_out = rng.random(size), rng.random(size)
    p = lw.input_values[np.minimum(np.searchsorted(lw.input_cdf, u_in, side="right"), len(lw.input_cdf) - 1)]
    o = lw.output_values[np.minimum(np.searchsorted(lw.output_cdf, u_out, side="right"), len(lw.output_cdf) - 1)]
    return p, o, fell_back
