"""The report pages in a real browser: headless Chromium (Debian's ``chromium``, driven by Playwright) opens the
report of each kind of results folder; a page fails on a console error, an uncaught script error, a failed request,
an image that does not load, or a missing or empty verdict line. A screenshot of each page is kept (in
``$PULSEINFER_SCREENSHOTS`` when set, as .ci/run sets it, else in the test's temporary folder).

Skipped without Chromium or Playwright (``pip install -e '.[browser]'`` and ``apt-get install chromium``); .ci/run
installs both and sets PULSEINFER_CI=1, under which their absence fails instead.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.page.conftest import COMMANDS

CHROMIUM = os.environ.get("PULSEINFER_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# Chromium flags for a closed network and a root user (no sandbox): no background connections, no GPU.
FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
]  # fmt: skip


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed (pip install -e '.[browser]')"
    if not Path(CHROMIUM).is_file():
        return f"Chromium not found at {CHROMIUM} (apt-get install chromium)"
    return None


@pytest.fixture(scope="module")
def browser():
    missing = _missing()
    if missing:
        if os.environ.get("PULSEINFER_CI"):  # .ci/run installs both: there, a missing one is a failure
            pytest.fail(f"{missing} under PULSEINFER_CI", pytrace=False)
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("PULSEINFER_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def page_problems(browser, html: Path, screenshot: Path) -> list[str]:
    """Open ``html`` (a file URL) in a fresh page and return what is wrong with it: console errors, uncaught script
    errors, failed requests, images that did not load, a missing or empty ``#verdict``; saves a full-page
    screenshot to ``screenshot``."""
    page = browser.new_page(viewport={"width": 1320, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"script error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url[:120]}"))
    try:
        page.goto(html.resolve().as_uri(), wait_until="load")
        images = page.eval_on_selector_all("img", "els => els.map(e => [e.alt, e.complete && e.naturalWidth > 0])")
        problems += [f"image did not load: {alt}" for alt, loaded in images if not loaded]
        verdict = page.query_selector("#verdict")
        if verdict is None or not verdict.inner_text().strip():
            problems.append("no verdict line (#verdict missing or empty)")
        page.screenshot(path=str(screenshot), full_page=True)
    finally:
        page.close()
    return problems


@pytest.mark.parametrize("kind", list(COMMANDS))
def test_each_report_opens_cleanly_in_chromium(kind, report_folders, browser, screenshots):
    shot = screenshots / f"report_{kind}.png"
    assert page_problems(browser, report_folders[kind] / "report.html", shot) == []
    assert shot.stat().st_size > 10_000  # a rendered page, not a blank one


def test_the_check_sees_a_broken_page(browser, tmp_path):
    """The checks above can fail: a page with a missing image, a script error and no verdict gives all three."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<!DOCTYPE html><html><body><img src="missing.png" alt="gone">'
        "<script>console.error('boom'); undefinedFunction();</script></body></html>",
        encoding="utf-8",
    )
    problems = page_problems(browser, bad, tmp_path / "bad.png")
    assert any(p.startswith("image did not load: gone") for p in problems)
    assert any(p.startswith("console error: boom") for p in problems)
    assert any(p.startswith("script error") and "undefinedFunction" in p for p in problems)
    assert "no verdict line (#verdict missing or empty)" in problems
