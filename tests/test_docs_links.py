"""Every relative link in the README, the changelog, docs/*.md and the package READMEs points at a file of the repo,
every ``#anchor`` into a Markdown file names one of its headings (GitHub's heading slugs), and every repository
path they name in prose (``sim/step/recall.py``, ``scenarios/policies/``) exists, so a reader who follows a pointer
finds the code it names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(
    {ROOT / "README.md", ROOT / "CHANGELOG.md", *ROOT.glob("docs/*.md"), *ROOT.glob("*/README.md")}
    | set(ROOT.glob("traces/data/README.md"))
)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`[^`]*`")
# a path into one of the repository's own folders, as prose names it (globs allowed; placeholders like <name> skipped)
FOLDERS = "sim|study|workers|engine|calibrate|plots|traces|scenarios|scripts|tests|pulseinfer|docs"
REPO_PATH = re.compile(rf"(?<![\w./-])((?:{FOLDERS})/[\w./*-]*)")
HISTORY = ROOT / "CHANGELOG.md"  # names files as they were: its paths are not checked
# paths in other repositories that happen to start with one of our folder names (docs/sources.md, traces/data)
EXTERNAL = {"docs/advanced_features/hisparse_guide.md", "traces/trace_NNNN.json"}


def prose_lines(text: str, blank_code: bool = True) -> list[tuple[int, str]]:
    """(line number, line) of the Markdown outside fenced code blocks, inline code spans blanked if asked."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, CODE_SPAN.sub("", line) if blank_code else line))
    return out


def slugs(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces → '-', repeats -1, -2."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8"), blank_code=False):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
            n = seen.get(base, 0)
            out.add(f"{base}-{n}" if n else base)
            seen[base] = n + 1
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every relative link and image in ``path`` (web and mail links left out)."""
    return [
        (number, target)
        for number, line in prose_lines(path.read_text(encoding="utf-8"))
        for target in LINK.findall(line)
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I)
    ]


def repo_paths(path: Path) -> list[tuple[int, str]]:
    """(line number, path) of every path into the repository's folders named in ``path``'s text, links included."""
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for m in REPO_PATH.finditer(line):
            name = m.group(1).rstrip(".")
            last = name.rsplit("/", 1)[-1]
            # a folder (trailing /), a file (an extension) or a glob; "pulseinfer/sglang" is a ratio, not a path
            looks_like_path = name.endswith("/") or "." in last or "*" in last
            if looks_like_path and name not in EXTERNAL and line[m.end() : m.end() + 1] not in ("<", "{"):
                out.append((number, name))
    return out


def test_the_documents_exist():
    assert ROOT / "README.md" in DOCS and ROOT / "CHANGELOG.md" in DOCS
    assert all(path.exists() for path in DOCS), [str(p) for p in DOCS if not p.exists()]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path):
    broken = []
    for number, target in links(doc):
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            broken.append(f"{doc.relative_to(ROOT)}:{number}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in slugs(dest):
            broken.append(f"{doc.relative_to(ROOT)}:{number}: {target} (no heading #{anchor})")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("doc", [d for d in DOCS if d != HISTORY], ids=lambda p: str(p.relative_to(ROOT)))
def test_named_repository_paths_exist(doc: Path):
    missing = [
        f"{doc.relative_to(ROOT)}:{number}: {name}"
        for number, name in repo_paths(doc)
        if not any(ROOT.glob(name.rstrip("/"))) and not (ROOT / name).exists()
    ]
    assert not missing, "\n".join(missing)


def test_readme_is_a_front_door():
    """README.md stays short and dated-free: measurements (with their commits) live in docs/results.md."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    hashes = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"\d", w) and re.search(r"[a-f]", w)]
    assert not hashes, f"commit hashes in README.md: {hashes}"


def test_the_checker_sees_a_broken_link(tmp_path: Path):
    doc = tmp_path / "x.md"
    doc.write_text("# A title\n[ok](#a-title) [gone](missing.md) `[code](not-a-link.md)`\n```\n[f](fenced.md)\n```\n")
    assert links(doc) == [(2, "#a-title"), (2, "missing.md")]
    assert slugs(doc) == {"a-title"}
    doc.write_text("The link lives in `sim/step/link.py`; see sim/README.md. Not results/sim/x, nor a/sim/y.\n")
    assert repo_paths(doc) == [(1, "sim/step/link.py"), (1, "sim/README.md")]


def sim_readme_rows() -> dict[str, str]:
    """sim/README.md's module table: first cell (a backticked folder or file of sim/) → the rest of its row."""
    rows = {}
    for line in (ROOT / "sim" / "README.md").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\|\s*`([^`]+)`\s*\|(.*)\|\s*$", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def unnamed_sim_modules(rows: dict[str, str], modules: list[Path]) -> list[str]:
    """The modules of sim/ (paths relative to sim/) that the table does not name: a top-level ``x.py`` has a row
    of its own; ``folder/x.py`` is named as `` `x` `` in the row of `` `folder/` ``."""
    missing = []
    for rel in modules:
        if len(rel.parts) == 1:
            named = rel.name in rows
        else:
            folder = "/".join(rel.parts[:-1]) + "/"
            named = rel.stem == "__init__" or f"`{rel.stem}`" in rows.get(folder, "")
        if not named:
            missing.append(rel.as_posix())
    return missing


def test_sim_readme_names_every_module():
    """sim/README.md is the front door to sim/: every module has its line, and the test oracles' folder is named."""
    modules = sorted(p.relative_to(ROOT / "sim") for p in (ROOT / "sim").rglob("*.py"))
    assert len(modules) > 40
    missing = unnamed_sim_modules(sim_readme_rows(), modules)
    assert not missing, f"sim/README.md names no line for: {missing}"
    assert "tests/sim/oracles/" in (ROOT / "sim" / "README.md").read_text(encoding="utf-8")


def test_the_module_check_sees_an_unnamed_module():
    rows = {"run.py": " x ", "serving/": " `request` (Request), `kv` "}
    modules = [Path("run.py"), Path("workload.py"), Path("serving/kv.py"), Path("serving/prefix.py")]
    assert unnamed_sim_modules(rows, modules) == ["workload.py", "serving/prefix.py"]
