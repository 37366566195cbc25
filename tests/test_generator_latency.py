"""Latency verdicts on the site's diff pages: the data the generator writes and the pages it
renders, from an archive with a comparison record (v1 vs v3, not consecutive), single-round runs (v1 vs v2,
v2 vs v3) and two runs collected with rounds. The browser side is tests/test_browser_latency.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cbsite import format as cfmt
from cbsite import review
from cbsite.archive import read_run
from cbsite.diff import comparison
from cbsite.diff.rundiff import diff_runs
from cbsite.generator import build_site, diffdata, latencydata
from tests.helpers.latency_archive import (
    COMPARISON_ID,
    EXPECTED,
    IDS,
)

PAIR = f"diffs/runs/{IDS['v1']}/{IDS['v3']}/"


@pytest.fixture(scope="module")
def built(latency_site):
    return latency_site


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html.replace("<wbr>", ""))).replace("&#39;", "'")  # <wbr>: no space


def _diff(docs: Path, url: str) -> dict:
    return diffdata.read_diff(docs / url)  # diff.json and its per-phase files, as one object


def test_a_comparison_gets_a_diff_page_even_between_non_consecutive_versions(built):
    _, site, docs = built
    assert (site / PAIR / "index.html").is_file()
    model = (site / "models" / "cmp" / "index.html").read_text()
    # The model page lists the comparison and links its diff page.
    section = model[model.index('id="comparisons"'):]
    assert COMPARISON_ID in section and f'href="../../{PAIR}"' in section
    assert "3 regressed, 1 improved, 3 unchanged, 1 inconclusive" in _text(section) and "interleaved, 6 processes, 1 thread" in _text(section)
    page = _text((docs / PAIR / "index.md").read_text())
    assert f"measured together comparison {COMPARISON_ID}" in page


def test_verdict_columns_are_the_evidence_verdicts(built):
    runs, _, docs = built
    data = _diff(docs, PAIR)
    assert data["judged"] is True
    base, head = read_run(runs / "cmp" / "v1" / IDS["v1"]), read_run(runs / "cmp" / "v3" / IDS["v3"])
    rd = diff_runs(base, head)
    ev = comparison.evidence_for(runs, base, head, {c.path: c.base_path for c in rd.components if c.base_path})
    assert ev is not None and ev.paired
    verdicts = ev.verdicts()
    for phase in data["phases"]:
        cols = data[phase]
        for k, path in enumerate(cols["path"]):
            v = verdicts.get((path, phase))
            if v is None:  # estimated containers are not timed in a session: no verdict, never a change
                assert cols["latency"]["verdict"][k] is None and cols["share"]["latency_ms"][k] is None
                continue
            assert cols["latency"]["verdict"][k] == v.verdict == EXPECTED[(path, phase)]
            assert cols["latency"]["ratio"][k] == pytest.approx(v.ratio, rel=1e-5)
            assert cols["latency"]["ci_low"][k] == pytest.approx(v.ci_low, rel=1e-5)
            assert cols["latency"]["ci_high"][k] == pytest.approx(v.ci_high, rel=1e-5)
            assert cols["latency"]["reason"][k] == v.reason
            # A latency share only where the verdict is a change: unchanged and inconclusive get none.
            shared = cols["share"]["latency_ms"][k] is not None
            assert shared == (v.verdict in ("regressed", "improved")) or rd.get(path, phase).self_delta["latency_ms"] == 0


def test_unchanged_latency_is_not_a_contributor_even_when_its_median_moved(built):
    _, _, docs = built
    page = (docs / PAIR / "index.md").read_text()
    latency = page[page.index("<h3>Latency</h3>"):page.index('<div class="cbsite-charts"')]
    # enc.b: +12 % in its raw median, unchanged in the paired session; c: improved.
    assert "<code>enc.a</code>" in latency and "<code>c</code>" in latency and "enc.b" not in latency
    charts = json.loads((docs / PAIR / "charts.json").read_text())
    assert [r["path"] for r in charts["latency_ms"]["data"]["values"]] == ["enc.a", "c"]


def test_page_says_how_latency_was_judged_with_noise_and_detectable_change(built):
    runs, _, docs = built
    page = _text((docs / PAIR / "index.md").read_text())
    assert f"Judged on paired A/B blocks in worker processes (comparison {COMPARISON_ID})" in page
    assert "interleaved layout, 6 worker processes, 1 thread, 8 A/B block pairs each" in page
    base, head = read_run(runs / "cmp" / "v1" / IDS["v1"]), read_run(runs / "cmp" / "v3" / IDS["v3"])
    rd = diff_runs(base, head)
    judged = latencydata.judge(comparison.find_comparison(runs, IDS["v1"], IDS["v3"]), base, head, rd)
    ctx = latencydata.latency_context(judged, rd, "cmp")
    for phase, st in ctx["phases"].items():
        row = f"{phase} " + " ".join(str(st["counts"].get(v, 0)) for v in
                                     ("regressed", "improved", "unchanged", "inconclusive", "not judged"))
        assert f"{row} {cfmt.fmt_pct(st['noise'])} {cfmt.fmt_pct(st['detectable'])}" in page
    # The root's verdict beside the latency totals, and in the summary sentence instead of the IQR rule.
    assert "forward latency 0.23 ms 0.245 ms +0.015 ms +7% regressed 1.215× (95 % 1.202–1.229×)" in page
    assert "(+0.015 ms, regressed)" in page and "within noise" not in page
    # Inconclusive rows carry their reason: how many processes a decision needs.
    assert re.search(r"enc\.a backward inconclusive 1\.060× 0\.856–1\.312× inconclusive: .* processes needed", page)


def test_listing_agrees_with_the_pr_comment(built):
    runs, _, _ = built
    rows_fn = getattr(review, "latency_rows", None)
    if rows_fn is None:
        pytest.skip("review.latency_rows is not in this tree")
    base, head = read_run(runs / "cmp" / "v1" / IDS["v1"]), read_run(runs / "cmp" / "v3" / IDS["v3"])
    rd = diff_runs(base, head)
    record = comparison.find_comparison(runs, IDS["v1"], IDS["v3"])
    ctx = latencydata.latency_context(latencydata.judge(record, base, head, rd), rd, "cmp")
    expected = rows_fn(comparison.from_record(record), rd, rd.phases)
    assert [(r["phase"], r["path"], r["verdict"]) for r in ctx["listed"]] == [(ph, p, v.verdict) for ph, p, v in expected]


def test_single_round_runs_say_not_judged_with_the_hint(built):
    _, _, docs = built
    for url in ("diffs/cmp/v1/v2/", "diffs/cmp/v2/v3/"):
        data = _diff(docs, url)
        assert data["judged"] is False and all("latency" not in data[p] for p in data["phases"])
        page = _text((docs / url / "index.md").read_text())
        assert "Latency not judged" in page and "cbsite compare" in page and "cbsite collect --rounds N" in page
        assert "not judged" in page[page.index("Totals"):page.index("Latency verdicts")]  # beside the latency totals


def test_runs_with_rounds_are_judged_on_their_rounds(built):
    _, _, docs = built
    data = _diff(docs, "diffs/rounds/r1/r2/")
    assert data["judged"] is True
    fwd = data["forward"]
    verdict = dict(zip(fwd["path"], fwd["latency"]["verdict"]))
    assert verdict["enc.a"] == "regressed" and verdict["enc.b"] == "unchanged" and verdict[""] is None
    page = _text((docs / "diffs/rounds/r1/r2/index.md").read_text())
    assert "Judged on independent runs' rounds (4 base rounds, 4 head rounds)" in page


def test_peak_memory_gets_no_shares(built):
    _, _, docs = built
    for url in (PAIR, "diffs/cmp/v1/v2/"):
        data = _diff(docs, url)
        for p in data["phases"]:
            assert "peak_memory_bytes" not in data[p]["share"]  # maxima: no share column


def test_comparison_diff_page_is_deterministic(built, tmp_path):
    runs, site, docs = built
    again = build_site(runs, tmp_path / "site", project_dir=tmp_path / "project", quiet=True)
    for name in ("index.html", "diff.json", "diff.forward.json", "diff.backward.json", "charts.json"):
        assert (again / PAIR / name).read_bytes() == (site / PAIR / name).read_bytes()
    assert (again / "models/cmp/index.html").read_bytes() == (site / "models/cmp/index.html").read_bytes()


NODE = shutil.which("node")


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_ratio_format_is_the_same_in_python_and_javascript():
    values = [None, 0.0, 0.5, 0.99949, 1.0, 1.0004, 1.2149, 2.34567, 9.9994, 9.99951, 12.345, 99.94, 153.4, 1234.5]
    fmt = Path(__file__).parents[1] / "cbsite" / "generator" / "templates" / "assets" / "format.js"
    script = ("const F = require(process.argv[1]); const v = JSON.parse(process.argv[2]);"
              "process.stdout.write(JSON.stringify(v.map(x => [F.ratio(x), F.ratio(x, true)])));")
    out = subprocess.run([NODE, "-e", script, str(fmt), json.dumps(values)], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [[cfmt.fmt_ratio(v), cfmt.fmt_ratio(v, False)] for v in values]
