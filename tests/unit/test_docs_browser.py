"""The documentation site as a reader sees it, in a real browser: headless Chromium.

The site is built (`mkdocs build --strict`, as `make docs`) into a temporary folder and served
on a free localhost port; Chromium loads the home page and two deep pages and the test reads
their DOM: the navigation lists every page of mkdocs.yml, each page shows its own title with
its link marked active and its table of contents, no script throws, and searching for "slurm"
(Material opens its search from a `?q=` URL parameter) puts the training page first.

Chromium is driven through its DevTools protocol over `--remote-debugging-pipe` (JSON
messages on file descriptors 3 and 4), with the standard library only. Skipped without a
Chromium or Chrome binary (CI installs Debian's `chromium`). With `DOCS_SCREENSHOT=path.png`
the home page's screenshot is also written there.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import shutil
import subprocess
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.docs_site import build_site, nav_pages

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
BROWSER = os.environ.get("CHROME_BIN") or next(filter(None, map(shutil.which, BROWSERS)), None)
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no Chromium or Chrome binary found")
WAIT_S = 30


class Chromium:
    """One headless Chromium, one tab, spoken to over the DevTools pipe."""

    def __init__(self, binary: str, profile: Path):
        ours_in, theirs_out = os.pipe()  # Chromium writes its replies to its fd 4
        theirs_in, ours_out = os.pipe()  # and reads our commands from its fd 3

        def give_pipes():  # in the child: dup first, so 3 and 4 are inheritable copies
            read, write = os.dup(theirs_in), os.dup(theirs_out)
            os.dup2(read, 3)
            os.dup2(write, 4)

        flags = ["--headless", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run"]
        flags += [f"--user-data-dir={profile}", "--window-size=1280,900"]
        if os.geteuid() == 0:
            flags.append("--no-sandbox")  # Chromium refuses to run as root with its sandbox
        self.process = subprocess.Popen(
            [binary, *flags, "about:blank"], preexec_fn=give_pipes, close_fds=False,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        os.close(theirs_in)
        os.close(theirs_out)
        self.commands = os.fdopen(ours_out, "wb", buffering=0)
        self.replies = os.fdopen(ours_in, "rb", buffering=0)
        self.buffer, self.last_id, self.events = b"", 0, []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        attached = self.call("Target.attachToTarget", targetId=target, flatten=True)
        self.session = attached["sessionId"]
        self.call("Runtime.enable", session=True)

    def call(self, method: str, session: bool = False, **params):
        self.last_id += 1
        message = {"id": self.last_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        self.commands.write(json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self.buffer:
                chunk = self.replies.read(1 << 16)
                assert chunk, f"Chromium closed its pipe (exit {self.process.poll()})"
                self.buffer += chunk
            raw, self.buffer = self.buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") != self.last_id:
                self.events.append(reply)  # an event: kept for the checks
                continue
            assert "error" not in reply, f"{method}: {reply['error']}"
            return reply["result"]

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", session=True, expression=expression,
                           returnByValue=True, awaitPromise=True)  # fmt: skip
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def open(self, url: str) -> None:
        self.events.clear()
        self.call("Page.navigate", session=True, url=url)
        self.wait_for(f"location.href === {json.dumps(url)} && document.readyState === 'complete'")

    def wait_for(self, expression: str):
        """The first truthy value of `expression`, polled; fails after `WAIT_S`."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.2)
        pytest.fail(f"the page never had {expression}")

    def errors(self) -> list[str]:
        thrown = [e for e in self.events if e.get("method") == "Runtime.exceptionThrown"]
        return [e["params"]["exceptionDetails"].get("text", "") for e in thrown]

    def screenshot(self) -> bytes:
        return base64.b64decode(self.call("Page.captureScreenshot", session=True)["data"])

    def close(self) -> None:
        try:
            self.call("Browser.close")
            self.process.wait(timeout=15)
        except Exception:  # noqa: BLE001 - closing: whatever went wrong, stop our process
            self.process.kill()
            self.process.wait()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):  # no line per request on the test's output
        pass


@pytest.fixture(scope="module")
def site_url(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    build = build_site(site)
    assert build.returncode == 0, (build.stdout + build.stderr)[-4000:]
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)  # port 0: a free one
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium = Chromium(BROWSER, tmp_path_factory.mktemp("chromium-profile"))
    yield chromium
    chromium.close()


def _nav_paths() -> list[str]:
    """The site path of every page in mkdocs.yml's nav ("" for the home page)."""
    return ["" if page == "index.md" else page.removesuffix(".md") + "/" for page in nav_pages()]


LINKS = "[...document.querySelectorAll('.md-nav--primary a.md-nav__link')]"


def _check_page(browser: Chromium, url: str, heading: str) -> None:
    """Navigation (every page), the page's title, its link active, its TOC, no script error."""
    base = url.split("#")[0]
    links = browser.evaluate(f"{LINKS}.map(a => a.href)")
    site = re.match(r"https?://[^/]+/", url).group(0)
    missing = [page for page in _nav_paths() if site + page not in links]
    assert not missing, f"{url}: the navigation lacks {missing}"
    assert browser.evaluate("document.querySelector('h1').firstChild.textContent.trim()") == heading
    active = browser.evaluate(f"{LINKS}.filter(a => a.matches('.md-nav__link--active'))"
                              ".map(a => a.href)")  # fmt: skip
    assert base in active, f"{url}: the navigation marks {active} active"
    assert not browser.errors(), f"{url}: scripts threw {browser.errors()}"


def test_home_page(browser, site_url):
    browser.open(site_url)
    _check_page(browser, site_url, "megatron-neox documentation")
    assert browser.evaluate("document.title").startswith("megatron-neox")
    shot = browser.screenshot()
    assert shot.startswith(b"\x89PNG"), "the screenshot is not a PNG"
    if path := os.environ.get("DOCS_SCREENSHOT"):
        Path(path).write_bytes(shot)


@pytest.mark.parametrize(
    "page, heading, anchor",
    [("training/", "Training at scale", "launching-on-a-cluster"),
     ("checkpoints/", "Checkpoints", None)],
)  # fmt: skip
def test_deep_pages(browser, site_url, page, heading, anchor):
    url = site_url + page + (f"#{anchor}" if anchor else "")
    browser.open(url)
    _check_page(browser, url, heading)
    toc = browser.evaluate("document.querySelectorAll('.md-nav--secondary a.md-nav__link').length")
    assert toc > 1, f"{page}: no table of contents"
    if anchor:
        assert browser.evaluate(f"!!document.getElementById({json.dumps(anchor)})")


def test_search_for_slurm_finds_the_training_page(browser, site_url):
    """Material reads `?q=` on load, opens the search and runs it in its web worker."""
    browser.open(site_url + "?q=slurm")
    results = browser.wait_for(  # the result links, once there are any
        "(hrefs => hrefs.length && hrefs)("
        "[...document.querySelectorAll('.md-search-result__item > a')].map(a => a.href))"
    )
    first = results[0].split("?")[0]
    assert first == site_url + "training/", f"search for slurm found first {results[:5]}"
    assert not browser.errors(), f"scripts threw {browser.errors()}"
