"""The figures of a report page: the figure files a command wrote, and, for a ``simulate`` folder without them,
every figure ``pulseinfer plot`` draws from its tables (drawn into a temporary folder; the results folder is left
as it is). Each figure gets a caption: what it shows and what to look for.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from pulseinfer.page.folder import Folder
from pulseinfer.page.html import Figure, png_size

MAX_FIGURE_BYTES = 8 << 20  # a PNG larger than this is not embedded (a note says so): a page should stay sendable
MAX_FIGURE_PIXELS = 100_000_000  # as plots/render.py draws at most; a PNG claiming more is not one pulseinfer wrote
REPORT_DPI = 90  # figures the report draws itself: sharp on a screen, ~40-120 KB each

# Figures the commands write (file stem, or a stem's prefix ending in "_") → caption. The figures `pulseinfer
# plot` draws carry their own captions (plots/render.py FIGURES).
CAPTIONS = {
    "pareto": "Decode tokens per second per GPU against tokens per second per user (1 / mean TPOT), one marker per "
    "configuration and load; filled markers met the SLO. The line marks the Pareto front: no configuration beats a "
    "point on it in both. Right of the SLO line is where the p99 TPOT bound can hold.",
    "compare_": "The ratio A/B of the compared metric in each cell of the two grid keys (sweep --compare): above 1 "
    "A's value is the higher, which is better for goodput or throughput and worse for a latency.",
    "validation_cdfs": "Per-request TTFT, TPOT and ITL distributions: the real server's run (measured) and its "
    "simulated replay. Curves that lie on each other mean the simulator reproduces the server.",
    "validation_sweep": "Each run of a sweep file, measured and simulated, against the swept load: where the two "
    "curves part is where the model stops holding.",
    "validation_scatter": "Each request's simulated TTFT, TPOT and E2E against its measured one, matched by request "
    "id (the diagonal is exact agreement; above it the replay is slower): a band along the diagonal is noise, a "
    "tilt is a wrong per-token cost. Drawn only where the replay sends each request at its recorded time.",
    "validation_steps": "Decode step time, simulator against the torch engine, per step and over the run.",
    "step_check": "Each recorded batch's step time against the simulator's step functions, per kind of step.",
    "trials": "The search: each trial's goodput in trial order with the best feasible so far (a flat line means "
    "more trials stopped paying), and decode tokens/s against p99 TPOT per trial with the SLO's bound.",
    "serving_scatter": "The serving suite: simulated against measured on log axes, per metric group, with a ±10 % "
    "band.",
}


def caption_for(stem: str, drawn: dict[str, str]) -> str:
    """The caption of the figure file ``stem``: a drawn figure's own, else :data:`CAPTIONS` (by stem, then by a
    ``prefix_``), else a plain line naming the file."""
    if stem in drawn:
        return drawn[stem]
    if stem in CAPTIONS:
        return CAPTIONS[stem]
    for key, caption in CAPTIONS.items():
        if key.endswith("_") and stem.startswith(key):
            return caption
    return f"{stem}.png, as the command wrote it."


def plot_captions() -> dict[str, str]:
    """Caption of each figure ``pulseinfer plot`` draws (plots/render.py ``FIGURES``; {} if they carry none)."""
    from plots.render import FIGURES

    return {spec.name: getattr(spec, "caption", "") or "" for spec in FIGURES}


def collect_figures(folder: Folder, draw: bool) -> list[Figure]:
    """Every figure of ``folder``: its PNG files (top level and ``plots/``), and with ``draw`` (a simulate
    folder without a ``plots/`` folder) the figures ``pulseinfer plot`` draws from its tables; skipped ones and
    oversized files become notes in ``folder.notes``."""
    drawn_captions = plot_captions()
    figures: list[Figure] = []
    order = {name: i for i, name in enumerate(drawn_captions)}  # pulseinfer plot's order: latency first
    files = sorted(folder.figure_files(), key=lambda p: (p.parent != folder.path, order.get(p.stem, len(order))))
    if draw and not any(p.parent != folder.path for p in files):  # no figure of these results in plots/
        figures += _draw(folder, drawn_captions)
    for path in files:
        rel = path.relative_to(folder.path).as_posix()
        size = path.stat().st_size
        if size > MAX_FIGURE_BYTES:
            folder.notes.append(f"{rel}: {size / 2**20:.0f} MiB, too large to embed")
            continue
        png = path.read_bytes()
        width, height = png_size(png)
        if not (0 < width * height <= MAX_FIGURE_PIXELS and _whole_png(png)):
            folder.notes.append(f"{rel}: not a whole PNG a browser shows ({width} x {height} pixels); left out")
            continue
        figures.append(Figure(path.stem, png, caption_for(path.stem, drawn_captions), rel))
    return figures


def _draw(folder: Folder, captions: dict[str, str]) -> list[Figure]:
    """The figures ``pulseinfer plot`` would draw for ``folder``, as PNG bytes (in a temporary folder)."""
    from plots.render import plot_results

    with tempfile.TemporaryDirectory(prefix="pulseinfer-report-") as tmp:
        skipped: list[str] = []
        try:
            written = plot_results(folder.path, Path(tmp), ("png",), dpi=REPORT_DPI, note=skipped.append)
        except FileNotFoundError:  # none of the tables the figures read
            return []
        folder.notes += [line for line in skipped if not _expected_skip(line)]
        return [
            Figure(
                p.stem,
                p.read_bytes(),
                captions.get(p.stem) or f"{p.stem} (drawn from the tables)",
                "drawn from the tables",
            )
            for p in written
        ]


def _expected_skip(line: str) -> bool:
    """A skipped figure a folder of its kind never has (a fleet's per-step figures, a single replica's fleet
    figures, ablation bars of fewer than three policies): not worth a note on the page."""
    return any(word in line for word in ("not in", "policies; ablation", "fleet", "replica"))


def _whole_png(png: bytes) -> bool:
    """Whether ``png`` decodes as a PNG to its end (Pillow, matplotlib's own image library: chunks and checksums)."""
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(png)) as image:
            image.verify()
    except Exception:  # noqa: BLE001 - Pillow raises many kinds for a broken file; each means "not a PNG"
        return False
    return True
