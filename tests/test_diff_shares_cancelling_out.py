"""Diff shares left out where the components' own changes cancel out (the committed
dlrm-sharded diff once read "2000000% of the change"), and the home page's "What changed" digest of a summary."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from cbsite import archive
from cbsite import diff as cdiff
from cbsite.generator import diffdata, pages

ROOT = Path(__file__).resolve().parent.parent
FORMAT_JS = ROOT / "cbsite" / "generator" / "templates" / "assets" / "format.js"


def _newest(folder: Path) -> archive.Run:
    return archive.read_run(sorted(p for p in folder.iterdir() if p.is_dir())[-1])


def test_no_shares_where_the_parts_cancel_out(demo_runs):
    """Tables moved from one rank to another: +2.56 MB here, -2.56 MB there, -32 B net. A share of -32 B is
    2000000%, so the page gives the amounts and no shares (table column, contributors, their note)."""
    rd = cdiff.diff_runs(_newest(demo_runs / "dlrm-sharded" / "table-wise"), _newest(demo_runs / "dlrm-sharded" / "row-wise"))
    cancel = diffdata.cancelled(rd, "param_bytes", "forward")
    assert cancel is not None and cancel["net"] == "\u221232 B" and cancel["up"] == "+2.56 MB"
    assert cancel["down"] == "\u22122.56 MB"  # (some tables have no value on a side: not "complete")
    tops = diffdata.top_rows(rd, "dlrm-sharded")
    assert tops["param_bytes"] and all(r["share"] is None and r["cancel"] == cancel for r in tops["param_bytes"])
    files = diffdata.diff_files(rd)
    for phase in rd.phases:
        assert set(files[f"diff.{phase}.json"]["share"]["param_bytes"]) == {None}
    # Every share still given on this page is a number a person can read as a share.
    for rows in tops.values():
        assert all(r["share"] is None or abs(r["share"]) <= diffdata.CANCEL for r in rows)
    # The charts' data is unchanged: the note is the page's.
    assert all("cancel" not in v for spec in diffdata.chart_specs(tops).values() for v in spec["data"]["values"])


def test_shares_stay_where_the_parts_add_up(demo_runs):
    """dlrm v1 -> v2: every own change of FLOPs and parameters is a growth, so the shares stay (12.3% each)."""
    rd = cdiff.diff_runs(_newest(demo_runs / "dlrm" / "v1"), _newest(demo_runs / "dlrm" / "v2"))
    for metric in ("flops", "param_bytes"):  # static counts: latencies are the measurement's
        assert diffdata.cancelled(rd, metric, "forward") is None
    tops = diffdata.top_rows(rd, "dlrm")
    assert tops["param_bytes"][0]["share"] == pytest.approx(0.1228, abs=1e-3) and tops["flops"][0]["cancel"] is None


def test_chart_labels_are_short_distinct_and_never_start_at_an_index():
    paths = ["over_arch.model.0._mlp.1._linear", "over_arch.model.0._mlp.0._linear",
             "dense_arch.model._mlp.1._linear", "inter_arch",
             "sparse_arch.embedding_bag_collection.embedding_bags.t_cat_0", "dlrm"]
    labels = diffdata.short_labels(paths)
    assert labels == ["\u2026model.0._mlp.1._linear", "\u2026_mlp.0._linear", "\u2026model._mlp.1._linear",
                      "inter_arch", "\u2026embedding_bags.t_cat_0", "dlrm"]
    assert len(set(labels)) == len(labels)


def test_rate_is_one_format_in_python_and_javascript():
    """Examples per second: the run page wrote "49080 examples/s" and "442200 examples/s", the model page
    "168.3/s", the diff summary "49.1k"; `rate` is the one form, "49.1k", in both languages."""
    values = [None, 0, 7, 168.3, 999.6, 9381, 49080, 442200, 999600, 1.2e6, -49080]
    assert [pages.fmt_rate(v) for v in values] == [pages.DASH, "0", "7", "168", "1k", "9.38k", "49.1k", "442k", "1M",
                                                  "1.2M", "-49.1k"]
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    script = ("const F = require(process.argv[1]); const v = JSON.parse(process.argv[2]);"
              "process.stdout.write(JSON.stringify(v.map(x => F.rate(x))))")
    out = subprocess.run([node, "-e", script, str(FORMAT_JS), json.dumps(values)],
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [pages.fmt_rate(v) for v in values]


def test_change_digest_cuts_a_summary_into_lines_and_keeps_every_word():
    """The home page's "What changed" row (pages.change_digest): latency changes first, then the totals that moved
    most by |ln ratio|; the other clauses of the first sentence in their order; every other sentence and each of
    its "; "-joined clauses (a parenthesis is never cut) on a line of its own. Only the title is left out."""
    summary = ("dlrm v2 vs v1: 2.0\u00d7 parameter memory (+10.4 MB), +81% forward peak memory (+442 kB), +48% forward "
               "latency (+0.156 ms, regressed), 3.0\u00d7 backward FLOPs (+24.7 MFLOP), new backward peak memory (+1 MB), "
               "\u2212<0.001% forward FLOPs (\u221232 B), backward latency (+1.55 ms) within noise, unchanged forward "
               "FLOPs, backward FLOPs. Parameter memory: own changes cancel out (+2.56 MB up, \u22122.56 MB down, \u221232 B "
               "net; some own changes unknown); the largest part of the latency growth (38%) is in a.b. Forward "
               "components: 27 increased, 2 unchanged.")
    d = pages.change_digest(summary)
    assert d["largest"] == ["+48% forward latency (+0.156 ms, regressed)", "new backward peak memory (+1 MB)",
                            "3.0\u00d7 backward FLOPs (+24.7 MFLOP)", "2.0\u00d7 parameter memory (+10.4 MB)"]
    assert d["totals"] == ("+81% forward peak memory (+442 kB), \u2212<0.001% forward FLOPs (\u221232 B), backward "
                           "latency (+1.55 ms) within noise, unchanged forward FLOPs, backward FLOPs")
    assert d["notes"] == ["Parameter memory: own changes cancel out (+2.56 MB up, \u22122.56 MB down, \u221232 B net; "
                          "some own changes unknown)", "The largest part of the latency growth (38%) is in a.b",
                          "Forward components: 27 increased, 2 unchanged"]
    words = lambda t: {w.strip(",.;:()").lower() for w in t.split()} - {""}  # noqa: E731
    kept = " ".join(d["largest"] + [d["totals"]] + d["notes"])
    assert words(summary.split(": ", 1)[1]) == words(kept)
    assert pages.change_digest("runs cannot be compared") == {"largest": [], "totals": "", "notes": ["runs cannot be compared"]}
