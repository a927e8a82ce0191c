"""traces/servegen.py: reading a ServeGen slice and generating a request table from it."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import traces
from traces.schema import REQUEST_COLUMNS, TraceError
from traces.servegen import DATA_DIR, read_servegen
from traces.servegen_traffic import servegen_requests

SHIPPED_CLIENTS = {20, 28, 34, 50, 57, 61, 116, 118, 143}
DAY_S = 86400.0


@pytest.fixture(scope="module")
def shipped():
    return read_servegen()


def expected_counts(sg, target: float, start: float, duration: float) -> np.ndarray:
    """Per client: target x sum over windows of overlap x (client's rate / window's total rate)."""
    rates = sg.window_rates()
    out = np.zeros(len(sg.clients))
    for w in range(len(sg.window_start_s)):
        lo, hi = max(sg.window_start_s[w], start), min(sg.window_end_s[w], start + duration)
        total = rates[:, w].sum()
        if hi > lo and total > 0:
            out += target * (hi - lo) * rates[:, w] / total
    return out


def test_reads_the_shipped_slice(shipped):
    assert {c.client_id for c in shipped.clients} == SHIPPED_CLIENTS
    assert len(shipped.window_start_s) == 2016 and shipped.span_s == 14 * DAY_S
    assert np.all(np.diff(shipped.window_start_s) == 600)
    assert shipped.window_end_s[-1] - shipped.window_start_s[-1] == 600
    by_id = {c.client_id: c for c in shipped.clients}
    c61 = by_id[61]  # first row of chunk-61-trace.csv
    assert c61.rate[0] == pytest.approx(87.20333333333333) and c61.pattern[0] == 1  # Gamma
    assert c61.shape[0] == pytest.approx(0.22817488816828171) and c61.scale[0] == pytest.approx(0.05025247140363936)
    for c in shipped.clients:
        assert np.all(c.rate >= 0) and set(np.unique(c.pattern)) <= {0, 1, 2}
        assert np.array_equal(c.rate > 0, c.pattern > 0)  # ServeGen: a window has a pattern iff it has traffic
        assert c.lengths, c.client_id
        for lw in c.lengths:
            assert lw.input_cdf[-1] == 1.0 and np.all(np.diff(lw.input_cdf) >= 0) and np.all(lw.input_values >= 0)
            assert lw.start_s % 21600 == 0
    assert len(by_id[61].lengths) == 56 and by_id[61].num_empty_length_windows == 0
    assert shipped.notes["num_clients_without_lengths"] == 0


def test_shipped_files_are_servegens_bytes():
    """The attribution README's sha256 of each uncompressed file matches what is shipped (data unmodified)."""
    folder = DATA_DIR / "language_m_large"
    rows = re.findall(r"\| `(chunk-[\w.-]+)` \| [\d,]+ \| `[0-9a-f]{40}` \| `([0-9a-f]{64})` \|", _readme())
    assert len(rows) == 18 and (DATA_DIR / "LICENSE").read_text().lstrip().startswith("Apache License")
    for name, sha in rows:
        assert hashlib.sha256(gzip.decompress((folder / f"{name}.gz").read_bytes())).hexdigest() == sha, name
    assert sum(p.stat().st_size for p in DATA_DIR.rglob("*") if p.is_file()) < 2_000_000


def _readme() -> str:
    return (DATA_DIR / "README.md").read_text()


def _slice(tmp_path: Path, trace_rows: list[str], dataset: dict | str | None = None, client: int = 0) -> Path:
    """A one-client slice folder in tmp_path; default lengths: input 100 or 300, output 10."""
    if dataset is None:
        dataset = {"0": {"input_tokens": "{100: 0.5, 300: 0.5}", "output_tokens": "{10: 1.0}"}}
    (tmp_path / f"chunk-{client}-trace.csv").write_text("\n".join(trace_rows) + "\n")
    text = dataset if isinstance(dataset, str) else json.dumps(dataset, indent=2)
    (tmp_path / f"chunk-{client}-dataset.json").write_text(text)
    return tmp_path


GOOD_ROWS = ["0,1.0,2.0,Gamma,0.25,4.0", "600,0,0,,0,0", "1200,2.0,1.0,Weibull,1.0,0.5"]


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ("600,abc,0,,0,0", "line 2: field 'rate': expected a non-negative number, got 'abc'"),
        ("600,-1,0,,0,0", "line 2: field 'rate'"),
        ("600,1,2,Lognormal,1,1", "line 2: field 'pattern': expected Gamma, Weibull or empty, got 'Lognormal'"),
        ("600,1,2,Gamma,0,1", "line 2: field 'shape': expected > 0 for pattern Gamma"),
        ("600,1,2,Gamma,1", "line 2: expected 6 fields timestamp,rate,cv,pattern,shape,scale, got 5"),
        ("0,1,2,Gamma,1,1", "line 2: field 'timestamp': expected a value above the previous row's"),
    ],
)
def test_bad_trace_rows_give_one_line_errors(tmp_path, row, expected):
    folder = _slice(tmp_path, [GOOD_ROWS[0], row, GOOD_ROWS[2]])
    with pytest.raises(TraceError) as err:
        read_servegen(str(folder))
    message = str(err.value)
    assert "\n" not in message and "chunk-0-trace.csv" in message and expected in message


@pytest.mark.parametrize(
    ("output_pdf", "expected"),
    [
        ("{10: 0.5, x: 0.5}", "field 'output_tokens': entry 'x: 0.5': expected 'tokens: probability'"),
        ("{10: 0.5, 20: 0.1}", "field 'output_tokens': probabilities sum to 0.6, expected 1"),
        ("{10: -1.0, 20: 2.0}", "field 'output_tokens': entry"),
        ("[10, 20]", "field 'output_tokens': expected a dict literal"),
    ],
)
def test_bad_length_pdfs_name_file_line_and_field(tmp_path, output_pdf, expected):
    dataset = {
        "0": {"input_tokens": "{100: 1.0}", "output_tokens": "{10: 1.0}"},
        "21600": {"input_tokens": "{100: 1.0}", "output_tokens": output_pdf},
    }
    folder = _slice(tmp_path, GOOD_ROWS, dataset)
    with pytest.raises(TraceError) as err:
        read_servegen(str(folder))
    message = str(err.value)
    assert "\n" not in message and "chunk-0-dataset.json line 8:" in message and expected in message


def test_slice_level_errors(tmp_path):
    with pytest.raises(TraceError, match="no chunk-N-trace.csv files"):
        read_servegen(str(tmp_path))
    with pytest.raises(TraceError, match="no such ServeGen slice folder or shipped slice name 'nope'"):
        read_servegen("nope")
    _slice(tmp_path, GOOD_ROWS)
    (tmp_path / "chunk-1-trace.csv").write_text("0,1,1,,0,0\n700,0,0,,0,0\n1200,0,0,,0,0\n")
    with pytest.raises(TraceError, match=r"chunk-1-trace.csv line 2: field 'timestamp': window clock differs"):
        read_servegen(str(tmp_path))
    (tmp_path / "chunk-1-trace.csv").unlink()
    (tmp_path / "chunk-2-dataset.json").write_text("{}")
    with pytest.raises(TraceError, match="no trace file chunk-2-trace.csv"):
        read_servegen(str(tmp_path))


def test_mean_rate_matches_the_target_over_a_day(shipped):
    target, start = 2.0, DAY_S
    df = servegen_requests(shipped, target, DAY_S, np.random.default_rng(0), start_s=start)
    assert list(df.columns) == [*REQUEST_COLUMNS, "client_id"]
    assert len(df) / (target * DAY_S) == pytest.approx(1.0, abs=0.03)  # measured: 0.981-1.012 over 20 seeds
    assert df["arrival_s"].is_monotonic_increasing and df["arrival_s"].between(0, DAY_S).all()
    assert df["request_id"].tolist() == list(range(len(df)))
    assert (df["prompt_tokens"] >= 1).all() and (df["output_tokens"] >= 0).all()
    assert df.attrs["source"] == "servegen" and df.attrs["num_windows"] == 144 and df.attrs["num_idle_windows"] == 0


def test_per_client_shares_follow_the_window_rates(shipped):
    target, start = 2.0, DAY_S
    df = servegen_requests(shipped, target, DAY_S, np.random.default_rng(1), start_s=start)
    expected = expected_counts(shipped, target, start, DAY_S)
    counts = df["client_id"].value_counts()
    for client, exp in zip(shipped.clients, expected):
        got = int(counts.get(client.client_id, 0))
        if exp == 0:
            assert got == 0, client.client_id  # inactive all day
        elif exp > 5000:  # measured within 0.91-1.05 of expected over 20 seeds
            assert got / exp == pytest.approx(1.0, abs=0.15), client.client_id
    assert df.attrs["num_clients"] == int(np.count_nonzero(expected))


def test_count_does_not_explode_like_peak_collapse(shipped):
    """Collapsing each client to its peak window would give far more requests than the target asks for."""
    target, start = 2.0, DAY_S
    df = servegen_requests(shipped, target, DAY_S, np.random.default_rng(2), start_s=start)
    rates = shipped.window_rates()[:, 144:288]
    totals = rates.sum(axis=0)
    peak_share = (rates / totals).max(axis=1)  # each client at its largest share all day, then normalised
    collapsed_share = target * DAY_S * peak_share.sum()
    collapsed_rates = DAY_S * rates.max(axis=1).sum()  # each client at its peak recorded rate all day
    assert len(df) < collapsed_share / 1.5 and len(df) < collapsed_rates / 20
    assert len(df) == pytest.approx(target * DAY_S, rel=0.03)


def test_bursty_and_exponential_clients_keep_their_mean_rate(tmp_path):
    rows = [f"{600 * i},1.0,3.0,Gamma,0.1,10.0" for i in range(40)] + [f"{600 * i},1.0,1.0,,0,0" for i in range(40, 80)]
    sg = read_servegen(str(_slice(tmp_path, rows)))
    assert sg.clients[0].rate[50] == 1.0 and sg.clients[0].pattern[50] == 0  # no pattern: drawn exponential
    gamma = servegen_requests(sg, 10.0, 40 * 600, np.random.default_rng(3))
    poisson = servegen_requests(sg, 10.0, 40 * 600, np.random.default_rng(3), start_s=40 * 600)
    assert len(gamma) == pytest.approx(240_000, rel=0.05) and len(poisson) == pytest.approx(240_000, rel=0.01)
    gaps = np.diff(gamma["arrival_s"].to_numpy())
    assert gaps.std() / gaps.mean() > 2.5  # Gamma shape 0.1: cv ~3.2, far burstier than Poisson
    assert set(gamma["prompt_tokens"]) == {100, 300} and set(gamma["output_tokens"]) == {10}


def test_seeded_and_rebased(shipped):
    a = servegen_requests(shipped, 1.0, 600.0, np.random.default_rng(5), start_s=3600.0)
    b = servegen_requests(shipped, 1.0, 600.0, np.random.default_rng(5), start_s=3600.0)
    c = servegen_requests(shipped, 1.0, 600.0, np.random.default_rng(6), start_s=3600.0)
    pd.testing.assert_frame_equal(a, b)
    assert not a["arrival_s"].equals(c["arrival_s"])
    assert a["arrival_s"].min() >= 0 and a["arrival_s"].max() < 600


def test_lengths_from_keeps_arrivals_and_swaps_lengths(shipped):
    other = traces.load_trace("mooncake_conversation")
    own = servegen_requests(shipped, 2.0, 3600.0, np.random.default_rng(7))
    swapped = servegen_requests(shipped, 2.0, 3600.0, np.random.default_rng(7), lengths_from=other)
    np.testing.assert_array_equal(own["arrival_s"], swapped["arrival_s"])
    np.testing.assert_array_equal(own["client_id"], swapped["client_id"])
    pairs = set(zip(other["prompt_tokens"], other["output_tokens"]))
    assert set(zip(swapped["prompt_tokens"], swapped["output_tokens"])) <= pairs
    assert swapped["prompt_tokens"].mean() > 5 * own["prompt_tokens"].mean()  # Mooncake's prompts are long
    assert swapped.attrs["lengths"] == other.attrs["source"] and all(h == [] for h in swapped["hash_ids"])


def test_argument_errors(shipped):
    rng = np.random.default_rng(0)
    with pytest.raises(TraceError, match=r"covers \[0, 1209600\) s; start_s 1209000 \+ duration_s 1200"):
        servegen_requests(shipped, 1.0, 1200.0, rng, start_s=1209000.0)
    with pytest.raises(ValueError, match="target_rate_per_s must be > 0"):
        servegen_requests(shipped, 0.0, 10.0, rng)
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        servegen_requests(shipped, 1.0, 10.0, 0)
    with pytest.raises(TraceError, match="lengths_from has no rows"):
        servegen_requests(shipped, 1.0, 10.0, rng, lengths_from=traces.load_trace("mooncake_conversation").iloc[:0])
