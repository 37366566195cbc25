"""How the memory view scales: a synthetic allocator trace of N events, laid out by the collector's
`memory_timeline.timeline`, then drawn by the site's viewer in Debian's chromium.

Prints the layout time, the JSON size, the drawn blocks and their step points, and the time until
the viewer is ready. Timings are data, not pass/fail.

    .venv/bin/python benchmarks/memory_view_scale.py [--events N] [--max-blocks K]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path

from cbsite.collector.plugins import memory_timeline
from cbsite.generator.serve import make_server

ASSETS = Path(__file__).resolve().parents[1] / "cbsite" / "generator" / "templates" / "assets"
CHROMIUM = Path("/usr/bin/chromium")


def synthetic_trace(events: int, seed: int = 0) -> list[dict]:
    """Allocations of mixed sizes; each event frees a live block (the oldest when many are live) or allocates."""
    rng = random.Random(seed)
    trace, live, addr = [], {}, 1
    for i in range(events):
        if live and rng.random() < 0.5:
            victim = rng.choice(list(live)) if len(live) < 50 else next(iter(live))
            size = live.pop(victim)
            trace += [{"action": a, "addr": victim, "size": size, "frames": []} for a in ("free_requested", "free_completed")]
        else:
            size = rng.choice([256, 4096, 65536, 1 << 20]) * rng.randint(1, 4)
            trace.append({"action": "alloc", "addr": addr, "size": size,
                          "frames": [{"filename": "model.py", "line": i % 50, "name": f"f{i % 50}"}]})
            live[addr] = size
            addr += 1
    return trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--max-blocks", type=int, default=1500)
    args = parser.parse_args()
    trace = synthetic_trace(args.events)
    started = time.perf_counter()
    t = memory_timeline.timeline({"device_traces": [trace], "segments": []}, max_blocks=args.max_blocks)
    layout_s = time.perf_counter() - started
    payload = json.dumps({"title": "scale", "snapshot": None, "timeline": t}, separators=(",", ":"))
    print(f"events {t['events']}, allocations {t['allocations']}, drawn {len(t['blocks'])} "
          f"({sum(len(b['points']) for b in t['blocks'])} step points), in the band {t['other']['count']}")
    print(f"layout {layout_s:.2f} s, timeline JSON {len(payload) / 1e6:.1f} MB")
    if not CHROMIUM.exists():
        print("no /usr/bin/chromium: drawing not measured (make browser)")
        return
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "assets").mkdir()
        for name in ("memory.html", "format.js"):
            shutil.copyfile(ASSETS / name, root / "assets" / name)
        (root / "t.memory.json").write_text(payload)
        httpd = make_server(root, port=0)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"])
                page = browser.new_page(viewport={"width": 1300, "height": 900})
                started = time.perf_counter()
                page.goto(f"http://127.0.0.1:{httpd.server_address[1]}/assets/memory.html?data=/t.memory.json")
                page.wait_for_selector("body[data-ready='1']", timeout=120_000)
                print(f"viewer ready in {time.perf_counter() - started:.2f} s (load, fetch, parse, draw)")
                browser.close()
        finally:
            httpd.shutdown()
            httpd.server_close()


if __name__ == "__main__":
    main()
