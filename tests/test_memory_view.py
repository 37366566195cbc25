"""The memory plugin's allocation timeline: its layout on hand-made and random snapshots (hypothesis),
the real CPU path on a small model (its peak agrees with the collector's peak_memory_bytes, measured on another replay),
and the site's one offline viewer in a real browser, reached from the run page of a built site."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from cbsite import archive
from cbsite.collector import profile
from cbsite.collector.plugins import memory_timeline
from cbsite.collector.plugins.memory import CPU_STATUS

HOSTILE = "</script><img src=x onerror=\"window.pwned=1\">"
PROPERTY = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def alloc(addr, size, name="op", category=None):
    e = {"action": "alloc", "addr": addr, "size": size, "stream": 0,
         "frames": [{"filename": "model.py", "line": 7, "name": name}]}
    if category:
        e["category"] = category
    return e


def free(addr, size):
    return [{"action": a, "addr": addr, "size": size, "stream": 0, "frames": []} for a in ("free_requested", "free_completed")]


def test_hand_made_snapshot_intervals_baseline_and_peak():
    # 0x100 (1000 B) existed before recording and is freed during it; 0x900 (64 B) is live throughout.
    trace = [alloc(0x200, 300, "a"), *free(0x100, 1000), alloc(0x300, 500, "b", "activation"),
             {"action": "oom", "size": 4096, "device_free": 10}, *free(0x200, 300), alloc(0x400, 50, "c")]
    segments = [{"device": 0, "address": 0x300, "total_size": 2000, "stream": 0, "blocks": [
        {"size": 500, "requested_size": 500, "state": "active_allocated", "frames": []},  # 0x300, allocated in the trace
        {"size": 0x900 - 0x300 - 500, "state": "inactive"},
        {"size": 64, "requested_size": 64, "state": "active_allocated", "frames": [{"name": "param"}]},  # 0x900
    ]}]
    t = memory_timeline.timeline({"device_traces": [trace], "segments": segments})
    assert t["events"] == 5  # alloc a, free 0x100, alloc b, free a, alloc c (free_completed halves and the OOM do not count)
    spans = sorted((b["start"], b["end"], b["size"], b["before"]) for b in t["blocks"])
    assert spans == [(0, 2, 1000, True), (0, 6, 64, True), (1, 4, 300, False), (3, 6, 500, False), (5, 6, 50, False)]
    assert t["baseline_bytes"] == 1064 and t["allocations"] == 3 and t["preexisting"] == 2
    assert (t["peak_bytes"], t["peak_at"]) == (1364, 1)  # before a's 300 B ... the old 1000 B is freed at t=2
    assert t["allocated_peak_bytes"] == 800  # a and b, both live at t=3
    assert t["ooms"] == [{"at": 3, "size": 4096, "free": 10}]
    cats = {t["categories"][b["category"]] for b in t["blocks"]}
    assert cats == {"before", "unknown", "activation"}
    assert t["frames"][t["blocks"][[b["size"] for b in t["blocks"]].index(300)]["frames"]] == ["a (model.py:7)"]


def test_cuda_format_block_addresses_awaiting_free_and_segment_events():
    """The CUDA snapshot's own shape: blocks carry their address and rounded size, a block can await
    a free on another stream, and segment_alloc / segment_free events are not allocations."""
    trace = [{"action": "segment_alloc", "addr": 0x1000, "size": 2 << 20, "stream": 0, "frames": []},
             alloc(0x1000, 512, "x"), *free(0x1000, 512), alloc(0x1200, 1024, "y"),
             {"action": "segment_free", "addr": 0x9000, "size": 2 << 20, "stream": 0, "frames": []}]
    segments = [{"device": 0, "address": 0x1000, "total_size": 2 << 20, "stream": 0, "blocks": [
        {"address": 0x1000, "size": 512, "requested_size": 0, "state": "inactive"},
        {"address": 0x1200, "size": 1024, "requested_size": 1000, "state": "active_allocated", "frames": []},
        {"address": 0x8000, "size": 2048, "requested_size": 2000, "state": "active_awaiting_free", "frames": []},
    ]}, {"device": 1, "address": 0x5000, "total_size": 4096, "stream": 0, "blocks": [
        {"address": 0x5000, "size": 4096, "requested_size": 4096, "state": "active_allocated", "frames": []}]}]
    t = memory_timeline.timeline({"device_traces": [trace, []], "segments": segments}, device=0)
    assert t["events"] == 3 and t["allocations"] == 2 and t["preexisting"] == 1
    assert t["baseline_bytes"] == 2048  # the awaiting-free block at 0x8000; device 1's segment is not ours
    assert t["peak_bytes"] == 2048 + 1024 and t["allocated_peak_bytes"] == 1024


def _check_layout(t):
    """At every t the drawn blocks tile [0, drawn live) with no gap or overlap, the band sits on top
    with the rest, and the total is the bytes live."""
    for when in range(t["events"] + 1):
        spans = []
        for b in t["blocks"]:
            if b["start"] <= when < b["end"]:
                y = [p[1] for p in b["points"] if p[0] <= when][-1]
                spans.append((y, y + b["size"]))
        spans.sort()
        top = 0
        for lo, hi in spans:
            assert lo == top, (when, spans)
            top = hi
        base = [v for s, v in t["other"]["base"] if s <= when][-1]
        height = [v for s, v in t["other"]["height"] if s <= when][-1]
        assert base == top
        yield when, top + height


@st.composite
def snapshots(draw):
    """A random but well-formed trace: allocations at fresh addresses, frees of live (or pre-existing) ones."""
    pre = draw(st.lists(st.integers(1, 5000), max_size=4))
    live = {0x10000 + i: s for i, s in enumerate(pre)}
    trace, nxt = [], 0x20000
    for _ in range(draw(st.integers(0, 40))):
        if live and draw(st.booleans()):
            addr = draw(st.sampled_from(sorted(live)))
            trace += free(addr, live.pop(addr))
        else:
            size = draw(st.integers(1, 10_000))
            trace.append(alloc(nxt, size))
            live[nxt] = size
            nxt += 0x10000
    survivors = {a: s for a, s in live.items() if a < 0x20000}  # pre-existing and never freed: in segments
    blocks, cursor = [], 0x10000
    for a in sorted(survivors):
        if a > cursor:
            blocks.append({"size": a - cursor, "state": "inactive"})
        blocks.append({"size": survivors[a], "requested_size": survivors[a], "state": "active_allocated"})
        cursor = a + survivors[a]
    return {"device_traces": [trace], "segments": [{"device": 0, "address": 0x10000, "blocks": blocks}]}, pre


@PROPERTY
@given(snapshots(), st.integers(1, 50))
def test_layout_tiles_the_live_bytes_at_every_event(snap, max_blocks):
    snapshot, pre = snap
    t = memory_timeline.timeline(snapshot, max_blocks=max_blocks)
    totals = dict(_check_layout(t))
    # Independent count of the bytes live after each event, straight from the trace.
    live, expected, when = sum(pre), {0: sum(pre)}, 0
    for e in snapshot["device_traces"][0]:
        if e["action"] in ("alloc", "free_requested"):
            when += 1
            live += e["size"] if e["action"] == "alloc" else -e["size"]
            expected[when] = live
    assert totals == expected
    assert t["peak_bytes"] == max(expected.values()) and t["baseline_bytes"] == sum(pre)
    assert len(t["blocks"]) == min(max_blocks, len(pre) + t["allocations"])
    assert t["other"]["count"] + len(t["blocks"]) == t["allocations"] + t["preexisting"]
    if t["peak_bytes"] > 0:  # the peak is always explained: allocations live at it are drawn first
        assert t["at_peak"]


VIEWER = Path(__file__).resolve().parents[1] / "cbsite" / "generator" / "templates" / "assets" / "memory.html"


def test_the_viewer_loads_nothing_from_elsewhere_and_only_same_origin_data():
    html = VIEWER.read_text()
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', html) and "import " not in html
    assert re.findall(r'<script src="([^"]+)"', html) == ["format.js"]  # the site's own formats, beside it
    assert "dataUrl.origin !== location.origin" in html and html.count("fetch(") == 1
    assert ".innerHTML" not in html  # frame names and titles only ever land as text


def with_memory(cfg):
    return dataclasses.replace(cfg, plugins=("memory",), num_threads=1)


def test_cpu_timeline_peak_agrees_with_peak_memory_bytes(fast_config, tmp_path):
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 16))
    run = profile(model, torch.randn(32, 64), config=with_memory(fast_config))
    assert run.meta["config"]["plugins"]["memory"]["status"] == CPU_STATUS
    saved = archive.read_run(run.save(tmp_path))
    for row in saved.table().to_dicts():
        m = {x["name"]: x["value"] for x in row["plugin_metrics"]}
        # The same definition measured on two replays: the collector's and the plugin's.
        assert m["memory.peak_bytes"] == row["peak_memory_bytes"], (row["path"], row["phase"])
        view = saved.path / row["memory_file"]
        assert view.name == f"{row['phase']}.memory.json"
        snapshot = pickle.loads(view.with_name(f"{row['phase']}.memory.pickle").read_bytes())
        assert snapshot["device_traces"][0][0]["action"] == "alloc" and m["memory.allocations"] >= 1
    fwd = {r["path"]: r for r in saved.table("forward").to_dicts()}
    # The first Linear's forward: x, its weight and bias live before; its 32x128 fp32 output is what it adds.
    m0 = {x["name"]: x["value"] for x in fwd["0"]["plugin_metrics"]}
    assert m0["memory.baseline_bytes"] == 4 * (32 * 64 + 128 * 64 + 128) and m0["memory.peak_bytes"] == 4 * 32 * 128
    data = json.loads((saved.path / fwd["0"]["memory_file"]).read_text())
    assert data["timeline"]["source"] == "cpu-profiler" and data["snapshot"] == "forward.memory.pickle"
    frames = data["timeline"]["frames"][data["timeline"]["blocks"][-1]["frames"]]
    assert frames[0] == "aten::addmm"  # the operator that allocated is the innermost frame


@contextlib.contextmanager
def served_page(browser, folder: Path):
    """A page of the session's chromium and the base URL of `folder` served on 127.0.0.1; the page records its
    requests and console/page errors in `page.requests` and `page.errors`."""
    from tests.helpers.browser import recording_page, served

    with served(folder) as server, recording_page(browser, {"width": 1300, "height": 900}) as page:
        yield page, server.url


@pytest.mark.browser
def test_memory_view_opens_from_the_run_page_offline(fast_config, tmp_path, browser):
    from cbsite.generator import build_site

    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 16))
    runs = tmp_path / "runs"
    profile(model, torch.randn(32, 64), config=with_memory(fast_config), model_name="mlp").save(runs)
    built = build_site(runs, tmp_path / "site", quiet=True)
    with served_page(browser, built) as (page, base):
        run_dir = next((built / "runs" / "mlp" / "v0").iterdir())
        page.goto(f"{base}runs/mlp/v0/{run_dir.name}/")
        page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=15000)
        link = page.locator("#cbsite-table a[aria-label*='memory timeline']").first  # "mem", named in full
        href = link.get_attribute("href")
        assert "memory.html?data=" in href and href.endswith(".memory.json")  # the site's one viewer
        page.goto(page.url + href)
        page.wait_for_selector("body[data-ready='1']", timeout=15000)
        assert page.locator("#chart path.block").count() >= 1
        biggest = page.evaluate("""() => { let best = 0, area = -1;
            document.querySelectorAll('#chart path.block').forEach((p, i) => {
                const b = p.getBBox(); if (b.width * b.height > area) { area = b.width * b.height; best = i; } });
            return best; }""")
        page.locator(f"#chart path.block[data-index='{biggest}']").hover()
        tip = page.locator("#tip")
        assert tip.is_visible() and re.search(r"kB .* (allocated at event|live before the phase began)", tip.inner_text())
        page.locator("#at-peak tr.pick").first.click()
        assert "Selected allocation" in page.locator("#selected").inner_text()
        snapshot_link = page.locator("#source a").get_attribute("href")
        assert snapshot_link.endswith(".memory.pickle") and page.request.get(snapshot_link).ok
        page.locator("#back").click()  # back to the run page the timeline belongs to
        page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=15000)
        assert page.url == f"{base}runs/mlp/v0/{run_dir.name}/"
    assert not page.errors
    assert all(r.startswith(base) or r.startswith("data:") for r in page.requests), page.requests


@pytest.mark.browser
def test_view_with_a_band_of_other_allocations_a_hostile_frame_name_and_foreign_data(tmp_path, browser):
    """Most allocations in the band: the view still draws; a frame name full of markup stays text; a
    `data` URL on another origin is refused without a request."""
    trace, live = [], {}
    for i in range(2000):
        if live and i % 3 == 0:
            addr = min(live)
            trace += free(addr, live.pop(addr))
        else:
            size = 64 * (1 + i % 7) if i else 10**6  # the first, largest of all, is drawn on its own
            trace.append(alloc(0x1000 + i, size, f"f{i % 5}" if i else HOSTILE))
            live[0x1000 + i] = size
    t = memory_timeline.timeline({"device_traces": [trace], "segments": []}, max_blocks=5)
    (tmp_path / "assets").mkdir()
    for name in ("memory.html", "format.js"):
        shutil.copyfile(VIEWER.with_name(name), tmp_path / "assets" / name)
    data = tmp_path / "run" / "artifacts" / "x" / "forward.memory.json"
    data.parent.mkdir(parents=True)
    data.write_text(json.dumps({"title": "band <b>x</b>", "snapshot": None, "timeline": t}))
    with served_page(browser, tmp_path) as (page, base):
        page.goto(f"{base}assets/memory.html?data=/run/artifacts/x/forward.memory.json")
        page.wait_for_selector("body[data-ready='1']", timeout=15000)
        assert page.locator("#chart path.other").count() == 1 and page.locator("#chart path.block").count() == 5
        assert "other allocations, together" in page.locator("#at-peak").inner_text()
        assert page.locator("#title").inner_text() == "band <b>x</b>"  # the title stays text
        # The block whose stack is markup: selected, its stack shows literally and no element is made of it.
        index = next(i for i, b in enumerate(t["blocks"]) if t["frames"][b["frames"]] == [HOSTILE + " (model.py:7)"])
        page.locator(f"#chart path.block[data-index='{index}']").dispatch_event("click")
        assert HOSTILE in page.locator("#selected").inner_text()
        assert page.locator("img").count() == 0 and not page.evaluate("window.pwned === 1")
        page.goto(f"{base}assets/memory.html?data=http://example.com/x.json")
        assert "No memory timeline given" in page.locator("#title").inner_text()
    assert not page.errors
    assert all(r.startswith(base) for r in page.requests), page.requests
