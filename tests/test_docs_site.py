"""The built documentation site, opened in headless Chromium as a reader would open it.

``make test-docs`` builds the site (``make docs``, strict) and runs these tests; they need the
``docs`` extra (playwright's driver) and Debian's ``chromium`` (``.ci/run`` installs both). The
site is served on 127.0.0.1 and every request to another address is blocked and counted as a
failure: the pages must render from the site alone.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "site"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


@pytest.fixture(scope="module")
def server():
    if not (SITE / "index.html").exists():
        pytest.fail("site/ is not built: run `make docs` first (make test-docs does both)")
    handler = functools.partial(_QuietHandler, directory=str(SITE))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield b
        b.close()


def open_page(browser, url: str):
    """The page at ``url`` once loaded, with the console errors, page errors and blocked
    outside requests it caused."""
    page = browser.new_page()
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
            if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))

    def route(r):
        if r.request.url.startswith("http://127.0.0.1:") or r.request.url.startswith("data:"):
            r.continue_()
        else:
            problems.append(f"outside request: {r.request.url}")
            r.abort()

    page.route("**/*", route)
    response = page.goto(url, wait_until="load")
    assert response is not None and response.status == 200, url
    page.wait_for_load_state("networkidle")
    return page, problems


def loaded_images(page) -> list[int]:
    """Natural widths of the page's images that loaded (0 = broken)."""
    return page.eval_on_selector_all(
        "article img", "imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")


@pytest.mark.parametrize("path, title, text", [
    ("index.html", "fnsysid", "Quickstart"),
    ("guide/usage.html", "Usage", "Knobs"),
    ("guide/own-data.html", "Your own data", "data.trajectory"),
    ("reference/settings.html", "Settings", "output.ci_level"),
    ("reference/cli.html", "Command line", "Config groups"),
    ("reference/api.html", "Python API", "load_trajectories"),
    ("ALGORITHMS.html", "Algorithms", "FedAvg"),
])
def test_page_renders(server, browser, path, title, text):
    page, problems = open_page(browser, f"{server}/{path}")
    assert title.lower() in page.title().lower(), page.title()
    assert text in page.inner_text("article")
    assert problems == []
    page.close()


def test_the_figures_render(server, browser):
    page, problems = open_page(browser, f"{server}/guide/results.html")
    widths = loaded_images(page)
    assert len(widths) >= 10 and min(widths) > 0, widths
    assert problems == []
    page.close()


def test_the_notebook_page_is_executed_with_its_figure(server, browser):
    page, problems = open_page(browser, f"{server}/examples/notebook.html")
    text = page.inner_text("body")
    assert "held-out NRMSE: one-step" in text            # a printed output of a cell
    widths = page.eval_on_selector_all(
        "img", "imgs => imgs.filter(i => i.src.startsWith('data:image/png'))"
               ".map(i => i.naturalWidth)")
    assert widths and min(widths) > 100, widths
    assert problems == []
    page.close()


def test_settings_reference_follows_the_schema():
    """The generated page lists every plain key with the schema's allowed words."""
    import runpy

    markdown = runpy.run_path(str(ROOT / "scripts" / "settings_reference.py"))["markdown"]()
    assert "| `output.ci_level` | `0.95` | a finite number in (0, 1) |" in markdown
    assert "| `M` | `20` | an integer >= 1" in markdown
    for option in (ROOT / "conf" / "strategy").glob("*.yaml"):
        assert f"### `strategy={option.stem}`" in markdown
