"""What each kind of page weighs on open and how soon it is interactive, in chromium against `cbsite serve`.

The archive: the tests' own demo runs (tests/data/runs: the sharded DLRM runs and the demo study) plus a synthetic
model of two versions with --components components each (tests/helpers/site_archives.synthetic_run). The site is
built once; each page is then opened --repeat times in a fresh browser context (empty cache) at 1400x1000 and
measured:

* bytes: every response the page loaded before it was interactive plus 2 s of quiet, as sent (`wire`: the .gz
  copies the build writes, `cbsite serve` sends them to a browser) and decoded (`raw`);
* interactive: `performance.now()` at the first animation frame where the page's own drawing is done (run and diff
  pages: their script's `data-ready` and, on a run page, the roofline; the model and study pages: the first
  chart; the home page: DOMContentLoaded), with DOMContentLoaded beside it.

Usage:

    .venv/bin/python benchmarks/page_weight.py                    # 1,000 components, 3 opens a page
    .venv/bin/python benchmarks/page_weight.py --components 10000 --repeat 5
    .venv/bin/python benchmarks/page_weight.py --repeat 1 --detail  # and every response of each page

The figures depend on the machine and its load: print them, never assert them.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cbsite.generator import build_site
from tests.helpers.browser import Server, launched_browser
from tests.helpers.site_archives import synthetic_run

DEMO = Path(__file__).resolve().parents[1] / "tests" / "data" / "runs"
VIEWPORT = {"width": 1400, "height": 1000}

# Per page kind: the condition, polled each animation frame, that says the page is drawn and answers input.
READY = {
    "home": "document.readyState !== 'loading'",
    "model": "document.querySelector('[data-cbsite-chart] svg') !== null",
    "run": "document.querySelector('#cbsite-run[data-ready=\"1\"]') !== null && "
           "(!document.querySelector('.cbsite-roofline') || document.querySelector('.cbsite-roofline svg') !== null)",
    "diff": "document.querySelector('#cbsite-diff[data-ready=\"1\"]') !== null",
    "study": "document.querySelector('[data-cbsite-study-chart] svg') !== null",
}
READY["sharded run"] = READY["run"]

# Recorded from the page's first script on: the time of the first frame where the page's condition holds.
PROBE = """(() => { const cond = new Function('return ' + %s);
  const poll = () => { let ok = false; try { ok = cond(); } catch (e) {} if (ok) window.__cbsiteReady = performance.now();
                       else requestAnimationFrame(poll); };
  requestAnimationFrame(poll); })();"""


def make_archive(root: Path, components: int) -> None:
    shutil.copytree(DEMO, root)
    for i, version in enumerate(("v1", "v2")):
        synthetic_run(root, "synthetic", version, n=components, seed=100 + i, minutes=i,
                      scale=1 + 0.3 * i, trace_every=max(components // 20, 1), branching=8)


def pages(site: Path) -> dict[str, str]:
    """A page of each kind, as a URL path under the site."""
    def rel(p: Path) -> str:
        return p.relative_to(site).as_posix() + "/"

    newest = lambda model: sorted((site / "runs" / model).glob("*/*"))[-1]  # noqa: E731
    return {
        "home": "",
        "model": "models/synthetic/",
        "run": rel(newest("synthetic")),
        "sharded run": rel(newest("dlrm-sharded")),
        "diff": rel(next((site / "diffs" / "synthetic").rglob("index.html")).parent),
        "study": rel(next((site / "studies").iterdir())),
    }


def open_page(browser, url: str, ready: str, detail: bool = False) -> dict[str, float]:
    """One open of `url` in a fresh context; with `detail`, prints each response's kB (sent, decoded)."""
    context = browser.new_context(viewport=VIEWPORT)
    context.add_init_script(PROBE % repr(ready))
    page = context.new_page()
    responses = []
    page.on("requestfinished", lambda r: responses.append(r))
    try:
        page.goto(url, wait_until="commit")
        page.wait_for_function("window.__cbsiteReady !== undefined", timeout=60000, polling=50)
        page.wait_for_timeout(2000)  # what the page loads just after (lazy charts in view, the search index)
        interactive = page.evaluate("window.__cbsiteReady")
        dcl = page.evaluate("performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd")
        wire = raw = 0
        files = []
        for r in list(responses):
            sizes = r.sizes()
            resp = r.response()
            body = len(resp.body()) if resp is not None and resp.status == 200 else 0
            wire += sizes["responseBodySize"] + sizes["responseHeadersSize"]
            raw += body
            files.append((sizes["responseBodySize"], body, urlsplit(r.url).path))
        if detail:
            for sent, body, name in sorted(files, reverse=True):
                print(f"    {sent / 1024:>8.0f} {body / 1024:>8.0f}  {name}  (kB sent, decoded)")
        return {"interactive_ms": interactive, "dcl_ms": dcl, "wire_kb": wire / 1024, "raw_kb": raw / 1024,
                "requests": len(responses)}
    finally:
        context.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--components", type=int, default=1000, help="components of each synthetic run")
    ap.add_argument("--repeat", type=int, default=3, help="opens of each page (the median is printed)")
    ap.add_argument("--keep", type=Path, default=None, help="build into this folder and keep it")
    ap.add_argument("--detail", action="store_true", help="also list each page's responses (first open)")
    ap.add_argument("--pages", nargs="+", default=list(READY), choices=list(READY), metavar="KIND",
                    help=f"the page kinds to open (default: all of {', '.join(READY)})")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="cbsite-weight-"))
    try:
        runs = tmp / "runs"
        make_archive(runs, args.components)
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            site = build_site(runs, args.keep or tmp / "site", quiet=True)
        print(f"# {platform.node()} · {os.cpu_count()} CPUs · load {os.getloadavg()[0]:.1f} · "
              f"synthetic runs of {args.components} components · built in {time.perf_counter() - t:.1f} s")
        server = Server(site)
        try:
            with launched_browser() as browser:
                print(f"{'page':<12} {'wire kB':>9} {'raw kB':>9} {'requests':>8} {'DCL ms':>8} {'interactive ms':>15}")
                for kind, path in pages(site).items():
                    if kind not in args.pages:
                        continue
                    runs_of = [open_page(browser, server.url + path, READY[kind], args.detail and i == 0)
                               for i in range(args.repeat)]
                    med = {k: statistics.median(r[k] for r in runs_of) for k in runs_of[0]}
                    print(f"{kind:<12} {med['wire_kb']:>9.0f} {med['raw_kb']:>9.0f} {med['requests']:>8.0f} "
                          f"{med['dcl_ms']:>8.0f} {med['interactive_ms']:>15.0f}")
        finally:
            server.close()
        print(f"# load after: {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
