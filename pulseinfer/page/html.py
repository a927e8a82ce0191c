"""HTML pieces of the report page: escaped text, tables from DataFrames, inline figures, the page itself.

The page is one file that loads nothing: figures are PNG data URIs, tables are HTML, the style sheet is inline,
and there is no script and no external font (the system's sans-serif), so it opens offline, from an e-mail
attachment or a chat upload, exactly as written.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field

import pandas as pd

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 2rem auto;
       max-width: 1320px; padding: 0 1rem; color: #1d2433; line-height: 1.45; }
h1 { font-size: 1.45rem; margin-bottom: .2rem; }
h2 { font-size: 1.15rem; margin-top: 2rem; border-bottom: 1px solid #d8dde6; padding-bottom: .2rem; }
.subtitle { color: #5a6478; margin-top: 0; }
.verdict { font-size: 1.1rem; background: #eef4ff; border-left: 4px solid #2f6fde; padding: .7rem 1rem;
           margin: 1rem 0; }
.verdict.warn { background: #fff5e6; border-left-color: #d98a00; }
table { border-collapse: collapse; font-size: .86rem; margin: .5rem 0 1rem; }
th, td { border: 1px solid #d8dde6; padding: .25rem .55rem; text-align: right; white-space: nowrap; }
th { background: #f3f5f9; }
td.text, th.text { text-align: left; white-space: normal; }
.scroll { overflow-x: auto; }
#figure-grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(540px, 1fr)); gap: 0 1.5rem; }
figure { margin: 1.2rem 0; }
figure.wide { grid-column: 1 / -1; }
figure img { max-width: 100%; height: auto; border: 1px solid #e3e7ee; }
figcaption { font-size: .9rem; color: #3c4558; margin-top: .3rem; }
figcaption b { color: #1d2433; }
ul.notes li { margin: .2rem 0; }
pre { background: #f6f8fa; padding: .7rem; overflow-x: auto; font-size: .8rem; max-height: 32rem; }
dl.prov { display: grid; grid-template-columns: max-content 1fr; gap: .2rem 1rem; font-size: .9rem; }
dl.prov dt { color: #5a6478; } dl.prov dd { margin: 0; font-family: ui-monospace, monospace; word-break: break-all; }
footer { margin-top: 2.5rem; color: #7a8498; font-size: .8rem; }
"""


@dataclass
class Figure:
    """One figure of the page: a PNG (bytes), where it came from (a file of the folder, or drawn from a table) and
    a caption saying what it shows and what to look for."""

    name: str
    png: bytes
    caption: str
    source: str = ""


@dataclass
class Table:
    """One table of the page: a title, display-ready cells (strings; ``text_columns`` left-aligned) and a note."""

    title: str
    frame: pd.DataFrame
    note: str = ""
    text_columns: tuple[str, ...] = ()


@dataclass
class Page:
    """What a report page says, top to bottom."""

    title: str
    subtitle: str
    verdict: str
    warn: bool = False  # the verdict is a warning (nothing met the SLO, an error above its target, ...)
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    texts: list[tuple[str, str]] = field(default_factory=list)  # (file name, content): the scenario, the profile
    provenance: dict = field(default_factory=dict)


def esc(text: object) -> str:
    """``text`` as HTML text (``&``, ``<``, ``>`` and quotes escaped; a path that is not UTF-8 shown with "?")."""
    return html.escape(str(text).encode("utf-8", "replace").decode("utf-8"), quote=True)


def table_html(table: Table) -> str:
    """A :class:`Table` as an HTML ``<table>`` inside a horizontally scrolling box, its note below."""
    frame = table.frame
    text = set(table.text_columns)

    def cell(tag: str, column: str, value: object) -> str:
        cls = ' class="text"' if column in text else ""
        blank = value is None or (isinstance(value, float) and pd.isna(value))
        return f"<{tag}{cls}>{esc('' if blank else value)}</{tag}>"

    head = "".join(cell("th", c, c) for c in frame.columns)
    rows = "".join(
        "<tr>" + "".join(cell("td", c, v) for c, v in zip(frame.columns, r)) + "</tr>"
        for r in frame.itertuples(index=False)
    )
    note = f'<p class="subtitle">{esc(table.note)}</p>' if table.note else ""
    body = f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
    return f'<h3>{esc(table.title)}</h3><div class="scroll">{body}</div>{note}'


WIDE_ASPECT = 1.9  # a figure wider than this (width / height) takes the page's whole width
WIDE_PIXELS = 1000  # so does one drawn this wide (a big multi-panel figure would be unreadable at half width)


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's IHDR chunk; (0, 0) if ``png`` is not a PNG."""
    if png[:8] != b"\x89PNG\r\n\x1a\n" or len(png) < 24:
        return 0, 0
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def figure_html(figure: Figure) -> str:
    """A :class:`Figure` as ``<figure>`` with the PNG inline (a base64 data URI) and its caption; a wide figure
    (several panels side by side) spans the page."""
    data = base64.b64encode(figure.png).decode("ascii")
    source = f" <i>({esc(figure.source)})</i>" if figure.source else ""
    width, height = png_size(figure.png)
    wide = ' class="wide"' if height and (width / height > WIDE_ASPECT or width >= WIDE_PIXELS) else ""
    return (
        f'<figure id="fig-{esc(figure.name)}"{wide}><img src="data:image/png;base64,{data}" alt="{esc(figure.name)}">'
        f"<figcaption><b>{esc(figure.name)}</b> — {esc(figure.caption)}{source}</figcaption></figure>"
    )


PROVENANCE_LABELS = {
    "command_line": "command",
    "version": "pulseinfer version",
    "written_at": "results written (UTC)",
    "commit": "commit",
    "uncommitted": "uncommitted changes",
    "python": "Python",
    "report_written_at": "report written (UTC)",
    "folder": "results folder",
}


def render(page: Page) -> str:
    """The whole HTML document of ``page`` (UTF-8 text)."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(page.title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{esc(page.title)}</h1>",
        f'<p class="subtitle">{esc(page.subtitle)}</p>',
        f'<p class="verdict{" warn" if page.warn else ""}" id="verdict">{esc(page.verdict)}</p>',
    ]
    if page.tables:
        parts.append('<section id="tables"><h2>Key table</h2>')
        parts += [table_html(t) for t in page.tables]
        parts.append("</section>")
    if page.notes:
        parts.append('<section id="notes"><h2>Notes</h2><ul class="notes">')
        parts += [f"<li>{esc(n)}</li>" for n in dict.fromkeys(page.notes)]  # each note once
        parts.append("</ul></section>")
    if page.figures:
        parts.append('<section id="figures"><h2>Figures</h2><div id="figure-grid">')
        parts += [figure_html(f) for f in page.figures]
        parts.append("</div></section>")
    if page.texts:
        parts.append('<section id="inputs"><h2>Scenario and inputs</h2>')
        for name, content in page.texts:
            parts.append(f"<details><summary>{esc(name)}</summary><pre>{esc(content)}</pre></details>")
        parts.append("</section>")
    parts.append('<section id="provenance"><h2>Provenance</h2><dl class="prov">')
    for key, label in PROVENANCE_LABELS.items():
        value = page.provenance.get(key)
        shown = "not recorded" if value is None else ("yes" if value is True else "no" if value is False else value)
        parts.append(f"<dt>{esc(label)}</dt><dd>{esc(shown)}</dd>")
    parts.append("</dl></section>")
    parts.append("<footer>Written by pulseinfer report: one file, no network, no script.</footer></body></html>")
    return "\n".join(parts) + "\n"
