"""The manual's and the README's screenshots of the site, made from the committed archive.

    .venv/bin/python docs/scripts/screenshots.py            # writes docs/img/run-page.png and docs/img/diff-page.png

It builds a site from `runs/` into a temporary folder with `cbsite build`, serves it with Python's http.server on
a free local port, and photographs two pages with Debian's chromium (`/usr/bin/chromium`, or $CHROMIUM) driven
headless by playwright: the run page of dlrm v2 at its icicle, and the diff page of dlrm v1 -> v2 with its latency
verdicts opened. No browser is ever downloaded. Options: --runs DIR, --out DIR, --chromium PATH.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VIEWPORT = {"width": 1400, "height": 900}


@contextlib.contextmanager
def served(folder: Path):
    """The folder over HTTP on 127.0.0.1 (the site's scripts fetch their data; file:// would not do)."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # one line per request would bury the output
        pass


def _one(site: Path, pattern: str) -> str:
    """The site-relative URL of the one page matching `pattern` (run ids differ from archive to archive)."""
    found = sorted(site.glob(pattern))
    if not found:
        raise SystemExit(f"no page {pattern} in the site built from the archive: is dlrm v1/v2 in it?")
    return found[-1].parent.relative_to(site).as_posix() + "/"


def _scroll_to(page, selector: str) -> None:
    """Scroll down (only down: scrolling up shows Material's "back to top" button) to just above `selector`."""
    page.evaluate("s => window.scrollTo(0, document.querySelector(s).getBoundingClientRect().top + window.scrollY - 60)",
                  selector)


def shoot(runs: Path, out: Path, chromium: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cbsite-shots-") as tmp:
        site = Path(tmp) / "site"
        cbsite = Path(sys.executable).with_name("cbsite")
        subprocess.run([str(cbsite), "build", "--runs", str(runs), "--out", str(site)], check=True, cwd=ROOT)
        run_page = _one(site, "runs/dlrm/v2/*/index.html")
        diff_page = _one(site, "diffs/dlrm/v1/v2/index.html")
        written = []
        with served(site) as base, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(chromium), headless=True, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport=VIEWPORT, device_scale_factor=1)
                # The run page, scrolled so that the summary's end and the whole icicle are in view.
                page.goto(base + run_page, wait_until="networkidle")
                page.wait_for_selector("#cbsite-icicle svg, #cbsite-icicle canvas", timeout=30_000)
                _scroll_to(page, "#icicle")
                page.wait_for_timeout(500)
                written.append(out / "run-page.png")
                page.screenshot(path=str(written[-1]))
                # The diff page with its latency verdicts opened (#latency opens that <details>).
                page.goto(base + diff_page + "#latency", wait_until="networkidle")
                page.wait_for_selector("#latency[open]", timeout=30_000)
                _scroll_to(page, "#latency")
                page.wait_for_timeout(500)
                written.append(out / "diff-page.png")
                page.screenshot(path=str(written[-1]))
            finally:
                browser.close()
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=ROOT / "runs", help="the archive (default: the committed runs/)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="where the PNGs go (default: docs/img)")
    parser.add_argument("--chromium", type=Path, default=Path(os.environ.get("CHROMIUM", "/usr/bin/chromium")))
    args = parser.parse_args()
    if not args.chromium.exists():
        raise SystemExit(f"no chromium at {args.chromium}: `make browser` installs Debian's (never a downloaded build)")
    for path in shoot(args.runs.resolve(), args.out.resolve(), args.chromium):
        print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
