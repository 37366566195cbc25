"""What each kind of page weighs on open, how soon it is interactive and how much main-thread work it costs, in
chromium against `cbsite serve`.

The archive: the tests' own demo runs (tests/data/runs: the sharded DLRM runs and the demo study) plus a synthetic
model of two versions with --components components each (tests/helpers/site_archives.synthetic_run). The site is
built once (or given with --site, twice to compare two builds: the opens then alternate between them); each page is
opened --repeat times in a fresh browser context (empty cache) at 1400x1000 and measured:

* bytes: every response the page loaded before it was interactive plus 2 s of quiet, as sent (`wire`: the .gz
  copies the build writes, `cbsite serve` sends them to a browser) and decoded (`raw`);
* ready: `performance.now()` at the first animation frame where the first screen's answering element is drawn
  (a run page: its icicle, beside the key facts and the slowest components, which are in the HTML; the diff page:
  its script's `data-ready`; the model and study pages: the first chart; the history page: its charts; home and
  regressions: DOMContentLoaded);
* interactive: the later of DOMContentLoaded, ready, and the end of the last long task (a main-thread task over
  50 ms, PerformanceObserver `longtask`) seen until 2 s of quiet after ready: from then on input is answered at once;
* main-thread work, from a chromium trace of the open (the renderer's main thread, every task until the end of the
  quiet): `cpu` is its thread time, which the machine's load barely changes (wall times on a loaded machine grow
  with the run queue), split by what it was spent on: script (compile, evaluate, calls, timers, events), style and
  layout, paint (paint, composite, raster on the main thread), parse (HTML, CSS) and the rest (GC, idle-time work
  that is not script, unattributed task time); `longest` is the longest single task (thread time) and `long cpu` the
  number of tasks with over 50 ms of thread time (long even on an idle machine); `worker` is the
  page's web workers' thread time (Material's search worker building its index from search_index.json) and `pool`
  the renderer's thread-pool workers' (scripts streamed and compiled off the main thread), which compete with the
  main thread for the cores;
* with --detail, each main-thread task over 50 ms: when it started, its wall and thread time, and its thread time by
  kind of work and by script file (ours, Material's bundle, vega.js; "(no script)": callbacks the trace names no
  file for, such as promise reactions);
* CDP Performance.getMetrics at the end: ScriptDuration, LayoutDuration (+RecalcStyleDuration) and TaskDuration
  (wall times, so loaded).

Usage:

    .venv/bin/python benchmarks/page_weight.py                    # 1,000 components, 5 opens a page
    .venv/bin/python benchmarks/page_weight.py --components 10000 --repeat 5
    .venv/bin/python benchmarks/page_weight.py --repeat 1 --detail  # and every response and long task of each page
    .venv/bin/python benchmarks/page_weight.py --repeat 1 --trace /tmp/traces  # each open's trace, for DevTools
    .venv/bin/python benchmarks/page_weight.py --keep /tmp/new      # build and keep the site, to compare later:
    .venv/bin/python benchmarks/page_weight.py --site /tmp/old --site /tmp/new --repeat 5

The figures depend on the machine and its load: print them, never assert them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cbsite.generator import build_site
from tests.helpers.browser import Server, launched_browser
from tests.helpers.site_archives import synthetic_run

DEMO = Path(__file__).resolve().parents[1] / "tests" / "data" / "runs"
VIEWPORT = {"width": 1400, "height": 1000}
QUIET_MS = 2000  # watched after ready: lazy charts in view, the search index, work left in idle time
LONG_TASK_MS = 50

# Per page kind: the condition, polled each animation frame, that says the first screen is drawn and answers input.
DOM_READY = "document.readyState !== 'loading'"
READY = {
    "home": DOM_READY,
    "model": "document.querySelector('[data-cbsite-chart] svg') !== null",
    "run": "document.querySelector('#cbsite-icicle svg') !== null",  # the key facts and slowest lists are the HTML
    "diff": "document.querySelector('#cbsite-diff[data-ready=\"1\"]') !== null",
    "study": "document.querySelector('[data-cbsite-study-chart] svg') !== null",
    "history": "document.querySelector('#cbsite-history[data-ready=\"1\"]') !== null",
    "regressions": DOM_READY,
}
READY["sharded run"] = READY["run"]
KINDS = ["home", "model", "run", "sharded run", "diff", "study", "history", "regressions"]

# Recorded from the page's first script on: the first frame where the page's condition holds, and every long task.
PROBE = """(() => { const cond = new Function('return ' + %s);
  window.__cbsiteLong = [];
  try { new PerformanceObserver(l => l.getEntries().forEach(e => window.__cbsiteLong.push([e.startTime, e.duration])))
          .observe({type: 'longtask', buffered: true}); } catch (e) {}
  const poll = () => { let ok = false; try { ok = cond(); } catch (e) {} if (ok) window.__cbsiteReady = performance.now();
                       else requestAnimationFrame(poll); };
  requestAnimationFrame(poll); })();"""

TRACE_CATEGORIES = ["devtools.timeline", "disabled-by-default-devtools.timeline", "toplevel", "v8", "blink",
                    "loading", "disabled-by-default-v8.compile", "blink.user_timing"]
# A trace event's name -> what its own time (less its children's) was spent on.
WORK = {
    "script": {"EvaluateScript", "v8.compile", "v8.compileModule", "v8.evaluateModule", "FunctionCall", "TimerFire",
               "EventDispatch", "FireAnimationFrame", "FireIdleCallback", "v8.run", "V8.Execute", "v8.callFunction",
               "ScriptCompiler", "v8.produceCache", "v8.parseOnBackground", "V8.CompileCode", "V8.ScriptCompiler",
               "RunMicrotasks", "XHRReadyStateChange", "v8.newInstance", "ResourceReceivedData"},
    "style+layout": {"Layout", "UpdateLayoutTree", "RecalculateStyles", "UpdateLayerTree", "InvalidateLayout",
                     "ScheduleStyleRecalculation", "IntersectionObserverController::computeIntersections",
                     "PrePaint", "LayoutShift"},
    "paint": {"Paint", "PaintImage", "CompositeLayers", "Layerize", "RasterTask", "Commit", "UpdateLayer",
              "Decode Image", "ImageDecodeTask"},
    "parse": {"ParseHTML", "ParseAuthorStyleSheet"},
    "gc": {"MinorGC", "MajorGC", "V8.GCScavenger", "V8.GCFinalizeMC", "BlinkGC.AtomicPhase", "V8.GC_MC_BACKGROUND"},
}
CATEGORY_OF = {name: cat for cat, names in WORK.items() for name in names}
# Blink's and V8's finer events, by their names' parts (the categories "blink" and "v8" hold hundreds).
CATEGORY_PARTS = [("GC", "gc"), ("V8.", "script"), ("v8.", "script"), ("Microtask", "script"), ("Style", "style+layout"),
                  ("style", "style+layout"), ("Layout", "style+layout"), ("layout", "style+layout"),
                  ("Paint", "paint"), ("paint", "paint"), ("Composit", "paint"), ("Pars", "parse")]


def kind_of(name: str) -> str | None:
    """What a trace event's own time was spent on, or None: its nearest ancestor's kind."""
    return CATEGORY_OF.get(name) or next((cat for part, cat in CATEGORY_PARTS if part in name), None)
TOP_TASKS = {"RunTask", "ThreadControllerImpl::RunTask", "ThreadPool_RunTask"}


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
        "history": "models/synthetic/history/",
        "regressions": "regressions/",
    }


def _complete_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trace's duration events as complete ("X") events: B/E pairs joined, per thread."""
    out: list[dict[str, Any]] = []
    open_: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for e in events:
        ph = e.get("ph")
        if ph == "X":
            out.append(e)
        elif ph == "B":
            open_.setdefault((e["pid"], e["tid"]), []).append(e)
        elif ph == "E" and open_.get((e["pid"], e["tid"])):
            b = open_[(e["pid"], e["tid"])].pop()
            joined = dict(b, ph="X", dur=e["ts"] - b["ts"])
            if "tts" in b and "tts" in e:
                joined["tdur"] = e["tts"] - b["tts"]
            out.append(joined)
    return out


def _event_url(e: dict[str, Any]) -> str:
    args = e.get("args") or {}
    data = args.get("data") or args.get("beginData") or {}
    return str(data.get("url", "")) if isinstance(data, dict) else ""


def _top_tasks(complete: list[dict[str, Any]], thread: tuple[int, int]) -> list[dict[str, Any]]:
    """A thread's top-level tasks, in time order; a task nested in another (a nested run loop) is the outer one's."""
    tasks = sorted((e for e in complete if (e["pid"], e["tid"]) == thread and e["name"] in TOP_TASKS),
                   key=lambda e: e["ts"])
    out, end = [], -1.0
    for t in tasks:
        if t["ts"] >= end:
            out.append(t)
            end = t["ts"] + t.get("dur", 0)
    return out


def page_main_thread(events: list[dict[str, Any]], origin: str = "") -> tuple[tuple[int, int] | None, list[dict[str, Any]]]:
    """The page's renderer main thread (pid, tid) in a trace's events, and its complete events. With `origin`, the
    page's renderer is the one whose events load from it (a trace can hold another renderer's); of several, the
    busiest."""
    mains = {(e["pid"], e["tid"]) for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name" and e.get("args", {}).get("name") == "CrRendererMain"}
    if origin:
        ours = {(e.get("pid"), e.get("tid")) for e in events if _event_url(e).startswith(origin)} & mains
        mains = ours or mains
    complete = [e for e in _complete_events(events) if (e.get("pid"), e.get("tid")) in mains]
    if not mains:
        return None, []
    thread = max(mains, key=lambda th: sum(t.get("tdur", 0) for t in _top_tasks(complete, th)))
    return thread, [e for e in complete if (e["pid"], e["tid"]) == thread]


def main_thread_work(trace: dict[str, Any], origin: str = "") -> dict[str, float]:
    """The renderer main thread's thread time (ms) in a trace: in all (its top-level tasks), by kind of work (each
    event's own time, less its children's, to its kind or its nearest ancestor's), and its longest task."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    thread, complete = page_main_thread(events, origin)
    if thread is None:
        return {}
    tasks = _top_tasks(complete, thread)
    work = {cat: 0.0 for cat in (*WORK, "other")}
    stack: list[dict[str, Any]] = []
    own = sorted((e for e in complete if "tdur" in e), key=lambda e: (e["ts"], -e.get("dur", 0)))
    for e in own:
        while stack and stack[-1]["ts"] + stack[-1].get("dur", 0) <= e["ts"]:
            stack.pop()
        parent = stack[-1] if stack else None
        e["_cat"] = kind_of(e["name"]) or (parent["_cat"] if parent else "other")
        e["_self"] = float(e["tdur"])
        if parent is not None:
            parent["_self"] -= e["tdur"]
        stack.append(e)
    for e in own:
        work[e["_cat"]] += max(e["_self"], 0.0) / 1000
    return {"cpu_ms": sum(t.get("tdur", 0) for t in tasks) / 1000,
            **{f"{cat}_ms": v for cat, v in work.items()},
            "longest_ms": max((t.get("tdur", 0) for t in tasks), default=0) / 1000,
            "cpu_long": sum(1 for t in tasks if t.get("tdur", 0) / 1000 > LONG_TASK_MS)}


def long_task_breakdown(trace: dict[str, Any], origin: str = "", over_ms: float = LONG_TASK_MS) -> list[dict[str, Any]]:
    """The page's main-thread tasks longer than `over_ms` (wall or thread time): each one's start (ms after the
    page's navigation), wall and thread time, and its thread time by kind of work and by script (the URL of the
    nearest script the time was spent under: which of our files, Material's bundle, or none)."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    thread, complete = page_main_thread(events, origin)
    if thread is None:
        return []
    nav = [e["ts"] for e in events if e.get("name") == "navigationStart" and (e.get("pid"), e.get("tid")) == thread]
    own = sorted((e for e in complete if "tdur" in e), key=lambda e: (e["ts"], -e.get("dur", 0)))
    start = min(nav) if nav else own[0]["ts"]
    out: list[dict[str, Any]] = []
    stack: list[dict[str, Any]] = []
    task: dict[str, Any] | None = None
    for e in own:
        while stack and stack[-1]["ts"] + stack[-1].get("dur", 0) <= e["ts"]:
            stack.pop()
        parent = stack[-1] if stack else None
        if parent is None:
            task = None
            if e["name"] in TOP_TASKS and max(e.get("dur", 0), e["tdur"]) / 1000 > over_ms:
                task = {"at_ms": (e["ts"] - start) / 1000, "wall_ms": e.get("dur", 0) / 1000,
                        "cpu_ms": e["tdur"] / 1000, "kind": {}, "script": {}, "_events": []}
                out.append(task)
        e["_cat"] = kind_of(e["name"]) or (parent["_cat"] if parent else "other")
        url = _event_url(e) if e["name"] not in TOP_TASKS else ""
        e["_url"] = (urlsplit(url).path.rsplit("/", 1)[-1] or "(the page)") if url else (parent["_url"] if parent else "")
        e["_self"] = float(e["tdur"])
        if parent is not None:
            parent["_self"] -= e["tdur"]
        if task is not None:
            task["_events"].append(e)
        stack.append(e)
    for task in out:
        for e in task.pop("_events"):
            ms = max(e["_self"], 0.0) / 1000
            task["kind"][e["_cat"]] = task["kind"].get(e["_cat"], 0.0) + ms
            if e["_cat"] == "script":
                key = e["_url"] or "(no script)"
                task["script"][key] = task["script"].get(key, 0.0) + ms
    return out


def print_long_tasks(tasks: list[dict[str, Any]]) -> None:
    for t in tasks:
        kinds = ", ".join(f"{k} {v:.0f}" for k, v in sorted(t["kind"].items(), key=lambda kv: -kv[1]) if v >= 1)
        scripts = ", ".join(f"{k} {v:.0f}" for k, v in sorted(t["script"].items(), key=lambda kv: -kv[1]) if v >= 1)
        print(f"    task at {t['at_ms']:>6.0f} ms: wall {t['wall_ms']:>4.0f}, cpu {t['cpu_ms']:>4.0f} ms ({kinds})"
              f"{'; script: ' + scripts if scripts else ''}")


def worker_work(trace: dict[str, Any], pid: int | None = None) -> dict[str, float]:
    """Thread time (ms) off the page's main thread: `worker`, the page's web workers (Material's search worker
    building its index), and `pool`, the renderer's thread-pool workers (script streamed and compiled off the main
    thread, image decoding) of process `pid`. On another thread, yet on a 2-core machine they compete with the main
    thread for the cores."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    kind: dict[tuple[int, int], str] = {}
    for e in events:
        if e.get("ph") != "M" or e.get("name") != "thread_name":
            continue
        name = str(e.get("args", {}).get("name", ""))
        if name.startswith(("DedicatedWorker", "SharedWorker", "ServiceWorker")):
            kind[(e["pid"], e["tid"])] = "worker"
        elif name.startswith("ThreadPool") and "Worker" in name and (pid is None or e["pid"] == pid):
            kind[(e["pid"], e["tid"])] = "pool"
    total = {"worker": 0.0, "pool": 0.0}
    ends: dict[tuple[int, int], float] = {}
    for e in sorted((e for e in _complete_events(events) if (e.get("pid"), e.get("tid")) in kind
                     and e["name"] in TOP_TASKS and "tdur" in e), key=lambda e: e["ts"]):
        thread = (e["pid"], e["tid"])
        if e["ts"] >= ends.get(thread, -1.0):  # a nested task is counted in the outer one
            total[kind[thread]] += e["tdur"] / 1000
            ends[thread] = e["ts"] + e.get("dur", 0)
    return {"worker_ms": total["worker"], "pool_ms": total["pool"]}


def open_page(browser, url: str, ready: str, detail: bool = False, trace_to: Path | None = None) -> dict[str, float]:
    """One open of `url` in a fresh context, traced; with `detail`, prints each response's kB (sent, decoded) and
    each main-thread task over 50 ms; with `trace_to`, writes the trace there (chromium's JSON, for DevTools)."""
    context = browser.new_context(viewport=VIEWPORT)
    context.add_init_script(PROBE % repr(ready))
    page = context.new_page()
    cdp = context.new_cdp_session(page)
    cdp.send("Performance.enable")
    responses = []
    page.on("requestfinished", lambda r: responses.append(r))
    try:
        browser.start_tracing(page=page, categories=TRACE_CATEGORIES)
        try:
            page.goto(url, wait_until="commit")
            page.wait_for_function("window.__cbsiteReady !== undefined", timeout=60000, polling=50)
            page.wait_for_timeout(QUIET_MS)
        finally:
            raw_trace = browser.stop_tracing()
            trace = json.loads(raw_trace)
            if trace_to is not None:
                trace_to.write_bytes(raw_trace)
        seen = page.evaluate("({ready: window.__cbsiteReady, long: window.__cbsiteLong,"
                             " dcl: performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd})")
        metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
        long_end = max((start + dur for start, dur in seen["long"] if dur > LONG_TASK_MS and start <= seen["ready"] + QUIET_MS),
                       default=0)
        wire = raw = 0
        files = []
        for r in list(responses):
            sizes = r.sizes()
            resp = r.response()
            body = len(resp.body()) if resp is not None and resp.status == 200 else 0
            wire += sizes["responseBodySize"] + sizes["responseHeadersSize"]
            raw += body
            files.append((sizes["responseBodySize"], body, urlsplit(r.url).path))
        origin = "{0.scheme}://{0.netloc}/".format(urlsplit(url))
        main = page_main_thread(trace["traceEvents"] if isinstance(trace, dict) else trace, origin)[0]
        renderer = main[0] if main else None
        if detail:
            for sent, body, name in sorted(files, reverse=True):
                print(f"    {sent / 1024:>8.0f} {body / 1024:>8.0f}  {name}  (kB sent, decoded)")
            print(f"    ready at {seen['ready']:.0f} ms, DOMContentLoaded at {seen['dcl']:.0f} ms; main-thread tasks over"
                  f" {LONG_TASK_MS} ms (thread time by kind and by script):")
            print_long_tasks(long_task_breakdown(trace, origin))
        return {"wire_kb": wire / 1024, "raw_kb": raw / 1024, "requests": len(responses), "dcl_ms": seen["dcl"],
                "ready_ms": seen["ready"], "interactive_ms": max(seen["dcl"], seen["ready"], long_end),
                "long_tasks": len(seen["long"]),
                **main_thread_work(trace, origin=origin),
                **worker_work(trace, pid=renderer),
                "ScriptDuration_ms": metrics.get("ScriptDuration", 0) * 1000,
                "LayoutDuration_ms": (metrics.get("LayoutDuration", 0) + metrics.get("RecalcStyleDuration", 0)) * 1000,
                "TaskDuration_ms": metrics.get("TaskDuration", 0) * 1000}
    finally:
        context.close()


COLUMNS = [("wire_kb", "wire kB"), ("raw_kb", "raw kB"), ("requests", "req"), ("dcl_ms", "DCL"), ("ready_ms", "ready"),
           ("interactive_ms", "interactive"), ("long_tasks", "long"), ("cpu_ms", "cpu"), ("script_ms", "script"),
           ("style+layout_ms", "style+layout"), ("paint_ms", "paint"), ("parse_ms", "parse"), ("gc_ms", "gc"),
           ("other_ms", "other"), ("longest_ms", "longest"), ("cpu_long", "long cpu"), ("worker_ms", "worker"), ("pool_ms", "pool"), ("ScriptDuration_ms", "ScriptDur"),
           ("LayoutDuration_ms", "LayoutDur"), ("TaskDuration_ms", "TaskDur")]


def build(components: int, keep: Path | None, tmp: Path) -> Path:
    runs = tmp / "runs"
    make_archive(runs, components)
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        site = build_site(runs, keep or tmp / "site", quiet=True)
    print(f"# synthetic runs of {components} components · built in {time.perf_counter() - t:.1f} s")
    return site


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--components", type=int, default=1000, help="components of each synthetic run")
    ap.add_argument("--repeat", type=int, default=5, help="opens of each page (the median is printed)")
    ap.add_argument("--keep", type=Path, default=None, help="build into this folder and keep it")
    ap.add_argument("--site", type=Path, action="append", default=[],
                    help="measure this built site instead of building one (twice: two sites, opens alternating)")
    ap.add_argument("--detail", action="store_true", help="also list each page's responses (first open)")
    ap.add_argument("--json", type=Path, default=None, help="also write every open's figures to this file")
    ap.add_argument("--trace", type=Path, default=None,
                    help="write each open's chromium trace into this folder (KIND-SITE-OPEN.json, for DevTools)")
    ap.add_argument("--pages", nargs="+", default=KINDS, choices=KINDS, metavar="KIND",
                    help=f"the page kinds to open (default: all of {', '.join(KINDS)})")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="cbsite-weight-"))
    try:
        sites = args.site or [build(args.components, args.keep, tmp)]
        print(f"# {platform.node()} · {os.cpu_count()} CPUs · load {os.getloadavg()[0]:.1f} · "
              f"sites: {', '.join(str(s) for s in sites)}")
        print("# ms unless kB; cpu..longest: main-thread thread time from a trace; *Dur: CDP Performance (wall)")
        servers = [Server(s) for s in sites]
        record: dict[str, dict[str, list[dict[str, float]]]] = {}
        try:
            with launched_browser() as browser:
                print(f"{'page':<12} {'site':<4}" + "".join(f"{label:>{max(len(label), 5) + 1}}" for _, label in COLUMNS))
                for kind in args.pages:
                    opens: list[list[dict[str, float]]] = [[] for _ in sites]
                    for i in range(args.repeat):
                        for s, (site, server) in enumerate(zip(sites, servers)):  # alternating: load drifts alike
                            path = pages(site)[kind]
                            trace_to = None
                            if args.trace:
                                args.trace.mkdir(parents=True, exist_ok=True)
                                trace_to = args.trace / f"{kind.replace(' ', '-')}-{s}-{i}.json"
                            opens[s].append(open_page(browser, server.url + path, READY[kind], args.detail and i == 0,
                                                      trace_to))
                    for s, runs_of in enumerate(opens):
                        med = {k: statistics.median(r.get(k, 0) for r in runs_of) for k, _ in COLUMNS}
                        print(f"{kind:<12} {s:<4}" + "".join(f"{med[k]:>{max(len(label), 5) + 1}.0f}" for k, label in COLUMNS))
                        record.setdefault(kind, {})[str(sites[s])] = runs_of
        finally:
            for server in servers:
                server.close()
        print(f"# load after: {os.getloadavg()[0]:.1f}")
        if args.json:
            args.json.write_text(json.dumps(record, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
