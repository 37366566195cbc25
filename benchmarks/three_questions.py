"""How soon each kind of page answers the three questions, and what its first screen looks like, in chromium.

The three questions an ML performance engineer brings to the site:

* slow:   which submodule is slow (the slowest component, or the trend that shows it);
* bound:  is it compute- or memory-bound (that component's bound badge);
* change: what got slower between versions, and is it real (a judged regression with its verdict).

The site is built from the tests' committed archive (tests/data/runs: dlrm v1/v2, the sharded DLRM, deepfm, nanogpt
and the demo study) or given with --site. Each page kind (home, model, history, run, sharded run, diff, sharded
diff, study, regressions) is opened --repeat times in a fresh context (empty cache) at 1400x1000 and at 390x844
(touch), and once more at 1400x1000 in the dark scheme for the screenshot. For every question the page answers, the
time is `performance.now()` (from navigation start) at the first animation frame where the answering element is
drawn, visible and inside the viewport without scrolling (of a chart or another tall element, its first 120 px); an
answer below the first screen is timed when it is drawn and marked "scroll" with how far down it is. The first
screen of each open is saved as a PNG under --shots, and the page is checked for sideways scrolling and console
errors.

Usage:

    .venv/bin/python benchmarks/three_questions.py                     # build the committed archive, 3 opens
    .venv/bin/python benchmarks/three_questions.py --site /tmp/site --repeat 5 --shots /tmp/shots

Wall times depend on the machine and its load: print them, never assert them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.helpers.browser import PHONE, Server, launched_browser

DEMO = Path(__file__).resolve().parents[1] / "tests" / "data" / "runs"
DESKTOP = {"width": 1400, "height": 1000}

# Per page kind: a glob for its page under the site, and for each question it answers the CSS selector of the element
# that answers it (the first match is the answer a reader looks at).
HOT = ".cbsite-fact ol.cbsite-hot > li"
PAGES: dict[str, tuple[str, dict[str, str]]] = {
    "home": ("index.html", {"change": "table.cbsite-changes tbody tr"}),
    "model": ("models/dlrm/index.html", {"slow": ".cbsite-charts .cbsite-chart :is(svg, canvas)",
                                         "change": "ul.cbsite-diffs li"}),
    "history": ("models/dlrm/history/index.html", {"slow": "#cbsite-history-charts :is(svg, canvas)"}),
    "run": ("runs/dlrm/v2/*/index.html", {"slow": HOT, "bound": f"{HOT} .cbsite-bound"}),
    "sharded run": ("runs/dlrm-sharded/row-wise/*/index.html", {"slow": HOT, "bound": f"{HOT} .cbsite-bound"}),
    "diff": ("diffs/dlrm/v1/v2/index.html", {"slow": ".cbsite-answer-latency tbody tr",
                                             "bound": ".cbsite-answer-latency tbody tr .cbsite-bound",
                                             "change": ".cbsite-answer-latency tbody tr .cbsite-verdict"}),
    "sharded diff": ("diffs/dlrm-sharded/table-wise/row-wise/index.html",
                     {"slow": ".cbsite-answer-latency tbody tr",
                      "bound": ".cbsite-answer-latency tbody tr .cbsite-bound",
                      "change": ".cbsite-answer-latency tbody tr .cbsite-verdict"}),
    "study": ("studies/*/index.html", {"slow": ".cbsite-study-charts .cbsite-chart :is(svg, canvas)"}),
    "regressions": ("regressions/index.html", {"change": "table.cbsite-regressions tbody tr .cbsite-verdict"}),
}

# Added to every page before its scripts: each animation frame, for each question not yet answered, the first
# element matching its selector that is drawn and visible; its time (performance.now()), its top, and whether it lies
# inside the viewport. One loop for all questions, so each is timed at the frame it is answered.
_WATCH = """(questions) => {
  window.cbsiteAnswers = {};
  const look = () => {
    for (const [q, sel] of Object.entries(questions)) {
      const had = window.cbsiteAnswers[q];
      if (had && had.inside) continue;
      for (const el of document.querySelectorAll(sel)) {
        const r = el.getBoundingClientRect(), st = getComputedStyle(el);
        if (r.width < 1 || r.height < 1 || st.visibility === 'hidden' || +st.opacity === 0) continue;
        const inside = r.top >= 0 && r.left >= 0 && r.top + Math.min(r.height, 120) <= innerHeight && r.right <= innerWidth;
        if (!had || inside) window.cbsiteAnswers[q] = {ms: performance.now(), inside, top: Math.round(r.top + scrollY)};
        break;
      }
    }
    requestAnimationFrame(look);
  };
  requestAnimationFrame(look);
}"""


def page_urls(site: Path) -> dict[str, str]:
    """Each page kind's path under the site (the first match of its glob); kinds the site lacks are left out."""
    found = {}
    for kind, (pattern, _) in PAGES.items():
        matches = sorted(site.glob(pattern))
        if matches:
            found[kind] = matches[0].parent.relative_to(site).as_posix() + "/"
    return found


def open_once(browser, url: str, kind: str, viewport: dict, shot: Path | None, scheme: str = "light") -> dict:
    """One cold open: each question's answer time, sideways scroll, console errors; the first screen saved."""
    phone = viewport["width"] < 600
    context = browser.new_context(viewport=viewport, color_scheme=scheme, has_touch=phone, is_mobile=phone)
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        questions = PAGES[kind][1]
        page.add_init_script(f"({_WATCH})({json.dumps(questions)})")
        page.goto(url)
        try:  # every answer on the screen, or drawn below it and left there for a second
            page.wait_for_function(f"Object.keys(window.cbsiteAnswers || {{}}).length === {len(questions)}",
                                   timeout=20000)
            page.wait_for_function("Object.values(window.cbsiteAnswers).every(a => a.inside)", timeout=1000)
        except PlaywrightTimeout:
            pass
        seen = page.evaluate("window.cbsiteAnswers || {}")
        answers = {q: seen.get(q) for q in questions}  # None: never drawn
        page.wait_for_timeout(300)  # let late layout settle before the screenshot and the width check
        sideways = page.evaluate("document.scrollingElement.scrollWidth - innerWidth")
        if shot is not None:
            page.screenshot(path=str(shot))
        return {"answers": answers, "sideways": sideways, "errors": errors}
    finally:
        context.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, help="a built site (default: build tests/data/runs into a temp folder)")
    parser.add_argument("--repeat", type=int, default=3, help="cold opens per page kind and size (median shown)")
    parser.add_argument("--shots", type=Path, default=Path(tempfile.gettempdir()) / "cbsite-three-questions",
                        help="folder for the first-screen PNGs")
    args = parser.parse_args()
    site = args.site
    if site is None:
        from cbsite.generator import build_site

        site = Path(tempfile.mkdtemp(prefix="cbsite-3q-")) / "site"
        build_site(DEMO, site, quiet=True)
    args.shots.mkdir(parents=True, exist_ok=True)
    urls = page_urls(site)
    print(f"# {platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the start; "
          f"median of {args.repeat} cold opens; ms from navigation start until the answer is drawn on screen")
    print("| page | size | slow | bound | change | sideways px | console errors |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    server = Server(site)
    try:
        with launched_browser() as browser:
            for kind, rel in urls.items():
                for label, viewport in (("1400x1000", DESKTOP), ("390x844", PHONE)):
                    slug = f"{kind.replace(' ', '-')}-{label}"
                    opens = [open_once(browser, server.url + rel, kind, viewport,
                                       args.shots / f"{slug}.png" if i == 0 else None) for i in range(args.repeat)]
                    cells = []
                    for question in ("slow", "bound", "change"):
                        if question not in PAGES[kind][1]:
                            cells.append("—")
                            continue
                        got = [o["answers"][question] for o in opens]
                        if any(a is None for a in got):
                            cells.append("not shown")
                            continue
                        ms = statistics.median(a["ms"] for a in got)
                        where = "" if all(a["inside"] for a in got) else f" (scroll: y {got[0]['top']})"
                        cells.append(f"{ms:,.0f}{where}")
                    sideways = max(o["sideways"] for o in opens)
                    errors = sum(len(o["errors"]) for o in opens)
                    print(f"| {kind} | {label} | {' | '.join(cells)} | {sideways} | {errors} |", flush=True)
                open_once(browser, server.url + rel, kind, DESKTOP, args.shots / f"{kind.replace(' ', '-')}-dark.png",
                          scheme="dark")
    finally:
        server.close()
    print(f"# load {os.getloadavg()[0]:.1f} at the end; first screens in {args.shots}")


if __name__ == "__main__":
    main()
