"""The site and the diff of sharded (torchrun) runs, on the committed dlrm-sharded runs (table-wise and row-wise
plans, 2 gloo ranks): the run page's rank data and summary, the diff page's communication table, and the gate's
`comm_bytes*` rules. Real Parquet, a real MkDocs build; the browser side is tests/test_browser_sharded.py."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from cbsite import archive, review
from cbsite import gate as cgate
from cbsite.diff import rundiff as cdiff
from cbsite.errors import CbsiteError
from cbsite.generator import build_site

PLANS = ("table-wise", "row-wise")
OUTPUT_DIST = "sparse_arch.embedding_bag_collection.output_dist"



@pytest.fixture(scope="module")
def sharded(demo_runs) -> Path:
    """The demo's two sharded runs of one model (table-wise and row-wise plans), in the tests' archive."""
    return demo_runs / "dlrm-sharded"


def _run(sharded: Path, plan: str) -> archive.Run:
    return archive.read_run(next(p for p in sorted((sharded / plan).iterdir()) if not p.name.startswith(".")))


@pytest.fixture(scope="module")
def built(demo_site):
    """The demo archive's site: the dlrm-sharded pages are those of an archive holding only them."""
    return demo_site


def _page(built: Path, plan: str) -> Path:
    return next((built / "runs" / "dlrm-sharded" / plan).iterdir())


@pytest.mark.parametrize("plan", PLANS)
def test_run_page_has_every_rank_and_the_summary(sharded, built, plan):
    run = _run(sharded, plan)
    folder = _page(built, plan)
    html = (folder / "index.html").read_text().replace("<wbr>", "")  # paths break after a dot (<wbr>)
    assert 'id="cbsite-rank"' in html
    assert "world size 2" in html and "backend gloo" in html and plan.replace("-", "_") + " × 8 table(s)" in html
    assert "most imbalanced" in html and "whole model" in html
    d = json.loads((folder / "components.json").read_text())
    sh = d["sharded"]
    assert sh["world_size"] == 2 and sh["ranks"] == ["0", "1"]
    fwd = d["forward"]
    comm = [i for i, k in enumerate(fwd["kind"]) if k == "communication"]
    assert comm and all(fwd["comm_bytes_sent"][i] > 0 and fwd["collectives"][i] for i in comm)
    assert {k for k in fwd["kind"] if k} == {"compute", "communication"}
    # Each rank's view is that rank's rows in ranks.parquet, aligned with the page's paths.
    ranks = run.ranks
    for r in sh["ranks"]:
        view = sh["views"][r]["forward"]
        assert set(view["rank"]) <= {int(r), None}
        rows = ranks.filter((ranks["rank"] == int(r)) & (ranks["phase"] == "forward"))
        for row in rows.iter_rows(named=True):
            i = d["path"].index(row["path"])
            assert view["comm_bytes_sent"][i] == row["comm_bytes_sent"]
            if row["latency_ms"] is not None:
                assert view["latency_ms"][i] == pytest.approx(row["latency_ms"], rel=1e-3)
    # The all-ranks view is the slowest rank: its latency is at least each rank's.
    for i, v in enumerate(fwd["latency_ms"]):
        others = [sh["views"][r]["forward"]["latency_ms"][i] for r in sh["ranks"]]
        if v is not None and all(o is not None for o in others):
            assert v >= max(others) * (1 - 1e-3)
    assert any(sh["views"]["0"]["forward"]["latency_ms"][i] != sh["views"]["1"]["forward"]["latency_ms"][i]
               for i in range(len(d["path"])))


def test_diff_between_the_plans_shows_communication_bytes(built):
    folder = built / "diffs" / "dlrm-sharded" / "table-wise" / "row-wise"
    html = (folder / "index.html").read_text().replace("<wbr>", "")  # paths break after a dot (<wbr>)
    assert 'id="communication"' in html and 'class="cbsite-traffic"' in html
    row = next(line for line in html.splitlines() if f"<code>{OUTPUT_DIST}</code>" in line and "forward" in line)
    assert "131 kB → 262 kB <strong>2.0×</strong>" in row  # sent: all-to-all (table-wise) -> reduce-scatter (row-wise)
    assert "c10d::alltoall_base_ x1 → c10d::_reduce_scatter_base_ x1" in row


def test_non_sharded_diff_has_no_communication_section(tmp_path):
    from tests.helpers.site_archives import synthetic_run

    runs = tmp_path / "runs"
    synthetic_run(runs, "toy", "v1", n=12, seed=1)
    synthetic_run(runs, "toy", "v2", n=12, seed=2, minutes=5)
    built = build_site(runs, tmp_path / "site", quiet=True)
    page = next((built / "diffs" / "toy").rglob("index.html")).read_text()
    assert 'id="communication"' not in page
    assert 'id="cbsite-rank"' not in next((built / "runs" / "toy" / "v1").rglob("index.html")).read_text()


def test_gate_judges_communication_bytes_of_sharded_runs(sharded):
    rd = cdiff.diff_runs(_run(sharded, "table-wise"), _run(sharded, "row-wise"))
    stage = next(t for t in rd.traffic if t.phase == "forward" and t.path == OUTPUT_DIST)
    assert stage.base["comm_bytes_sent"] == 131072 and stage.head["comm_bytes_sent"] == 262144
    assert stage.change("comm_bytes") == pytest.approx(0.5)

    gate = cgate.check(rd, cgate.parse_rules(["*output_dist:comm_bytes_sent>+10%"]))
    assert not gate.passed
    assert [(b.phase, b.path, b.change) for b in gate.breaches] == [("forward", OUTPUT_DIST, pytest.approx(1.0))]
    assert cgate.check(rd, cgate.parse_rules(["*output_dist:comm_bytes_sent>+150%"])).passed
    # A glob over the pieces too: the row-wise pieces are new components that communicate, which breaks the rule.
    broken = cgate.check(rd, cgate.parse_rules(["*output_dist*:comm_bytes>+10%"])).breaches
    assert {(b.phase, b.path) for b in broken} >= {("forward", OUTPUT_DIST), ("forward", OUTPUT_DIST + ".row_wise")}
    # The whole model: the root's traffic.
    assert {b.phase for b in cgate.check(rd, cgate.parse_rules(["comm_bytes>+10%"])).breaches} == {"forward", "backward"}
    # The other way round, the bytes shrink: the rule holds.
    assert cgate.check(cdiff.diff_runs(_run(sharded, "row-wise"), _run(sharded, "table-wise")),
                        cgate.parse_rules(["*output_dist:comm_bytes_sent>+10%"])).passed
    # A glob that matches nothing is still refused.
    with pytest.raises(CbsiteError, match="matches no component"):
        cgate.check(rd, cgate.parse_rules(["*outptu_dist:comm_bytes>+10%"]))


def test_gate_on_runs_without_traffic_says_so(tmp_path):
    from tests.helpers.site_archives import synthetic_run

    runs = tmp_path / "runs"
    synthetic_run(runs, "toy", "v1", n=12, seed=1)
    synthetic_run(runs, "toy", "v2", n=12, seed=2, minutes=5)
    a, b = (archive.read_run(next((runs / "toy" / v).iterdir())) for v in ("v1", "v2"))
    gate = cgate.check(cdiff.diff_runs(a, b), cgate.parse_rules(["comm_bytes>+10%"]))
    assert gate.passed and gate.unknown and "no collective traffic" in gate.unknown[0]


def test_pr_summary_lists_the_communication_changes(sharded):
    rd = cdiff.diff_runs(_run(sharded, "table-wise"), _run(sharded, "row-wise"))
    md = review.markdown(rd, cgate.check(rd, cgate.parse_rules(["*output_dist:comm_bytes_sent>+10%"])))
    section = md[md.index("### Communication (forward)"):md.index("### Gate")]
    line = next(x for x in section.splitlines() if x.startswith(f"| `{OUTPUT_DIST}` |"))
    assert "131 kB → 262 kB (2.0×)" in line and "262 kB → 393 kB (+50%)" in line
    assert "`*output_dist:comm_bytes_sent>+10%` | ❌ broken (1)" in md


@pytest.mark.parametrize("plan", PLANS)
def test_one_taxonomy_communication_or_a_bound(built, plan):
    """A communicating component (kind "communication") is labelled "communication" and never gets a roofline
    bound, in the all-ranks columns and in every rank's; a computing one keeps its bound. The page's lists and bound
    mix say the same, and each rank has its own lists (the rank selector shows them)."""
    from cbsite import bound

    folder = _page(built, plan)
    d = json.loads((folder / "components.json").read_text())
    views = [d[p] for p in d["phases"]] + [v[p] for v in d["sharded"]["views"].values() for p in v]
    for cols in views:
        assert any(k == "communication" for k in cols["kind"])
        for i, (kind, label) in enumerate(zip(cols["kind"], cols["bound"])):
            if kind == "communication":
                assert label == "communication", (d["path"][i], label)
            else:
                assert label in (*bound.BOUNDS, "suspect", None), (d["path"][i], label)
        assert any(b in bound.BOUNDS for b in cols["bound"])  # the computing rows keep a roofline bound
    html = (folder / "index.html").read_text().replace("<wbr>", "")
    facts = html[html.index('id="facts"'):html.index('id="summary"')]
    for path, kind in zip(d["path"], d["forward"]["kind"]):
        item = f"<code>{path}</code>"
        if path and item in facts and kind == "communication":
            line = facts[facts.index(item):].split("</li>", 1)[0]
            assert 'bound-communication">communication<' in line and "bound-memory" not in line and "bound-overhead" not in line
    assert 'class="cbsite-bound bound-communication">communication</span>' in facts.split("</p>", 1)[0]  # the bound mix
    # Each rank's lists: that rank's slowest components, with the same labels.
    rank_facts = d["sharded"]["facts"]
    assert sorted(rank_facts) == d["sharded"]["ranks"]
    for rank, facts_of in rank_facts.items():
        for phase, items in facts_of["slowest"].items():
            cols = d["sharded"]["views"][rank][phase]
            for item in items:
                if not item["own"]:
                    i = d["path"].index(item["path"])
                    assert item["bound"] == cols["bound"][i]
                    assert item["latency"] == pytest.approx(cols["latency_ms"][i] * max(d["call_count"][i] or 1, 1))
    assert rank_facts["0"]["slowest"] != rank_facts["1"]["slowest"]


def test_sharded_diff_labels_communication_on_both_paths(sharded, tmp_path):
    """The diff page's head columns say "communication" for communicating rows, as the run page does, whether the
    build hands them the head run's page data or computes them again (diffdata._run_columns): the same bytes."""
    from cbsite.generator import diffdata, latencydata, runpagedata, templating

    base, head = _run(sharded, "table-wise"), _run(sharded, "row-wise")
    rd = cdiff.diff_runs(base, head)
    judged = latencydata.judge(None, base, head, rd)
    computed = diffdata.diff_files(rd, judged, head)
    taken = diffdata.diff_files(rd, judged, head, runpagedata.run_data(head, [])[1])
    for name in computed:
        a, b = tmp_path / f"a-{name}", tmp_path / f"b-{name}"
        templating.dump_json(computed[name], a)
        templating.dump_json(taken[name], b)
        assert a.read_bytes() == b.read_bytes(), name
    rows = head.rows.filter(pl.col("phase") == "forward")
    communicating = set(rows.filter(pl.col("kind") == "communication").get_column("path").to_list())
    labels = dict(zip((c.path for c in rd.for_phase("forward")), computed["diff.forward.json"]["run"]["bound"]))
    assert communicating and all(labels[p] == "communication" for p in communicating if p in labels)
    assert all(labels[p] != "communication" for p in labels if p not in communicating)


def test_sharded_diff_gives_each_ranks_own_change_where_the_all_ranks_one_would_mix_ranks(sharded, built):
    """In the all-ranks view each row is its own slowest rank: the row-wise root (rank 1, 7.75 ms) has children on
    rank 0 that add up past it, so "own = total - children" read -12.3 ms while the total went 3.33 -> 7.75 ms. The
    page shows no such own change but each rank's, computed from that rank's rows alone; an own change that is one
    rank's own rows on each side (a leaf's) is still shown."""
    from cbsite.generator import diffdata

    base, head = _run(sharded, "table-wise"), _run(sharded, "row-wise")
    rows = head.rows.filter(pl.col("phase") == "forward")
    rank_of = dict(zip(rows.get_column("path").to_list(), rows.get_column("rank").to_list()))
    assert rank_of[""] != rank_of["sparse_arch"]  # the root and its largest child: different slowest ranks
    folder = built / "diffs" / "dlrm-sharded" / "table-wise" / "row-wise"
    fwd = diffdata.read_diff(folder)["forward"]
    root = fwd["path"].index("")
    assert fwd["own"]["latency_ms"][root] is None and fwd["share"]["latency_ms"][root] is None
    per_rank = fwd["mixed"][root]["latency_ms"]
    assert sorted(per_rank) == ["0", "1"]
    for rank, value in per_rank.items():  # each rank's own change is the diff of that rank's own rows
        one = cdiff.diff_tables(base.ranks.filter(pl.col("rank") == int(rank)), head.ranks.filter(pl.col("rank") == int(rank)))
        assert value == pytest.approx(one.get("", "forward").self_delta["latency_ms"], rel=2e-3)
    # FLOPs are the same on every rank: the root's own FLOP change is not mixed, and is shown.
    assert "flops" not in fwd["mixed"][root] and fwd["own"]["flops"][root] is not None
    # A leaf's own change is its whole change, one row on each side: shown, never per rank.
    leaves = [i for i, p in enumerate(fwd["path"]) if p and not any(q.startswith(p + ".") for q in fwd["path"])
              and fwd["delta"]["latency_ms"][i] is not None]
    assert leaves and all(fwd["mixed"][i] is None and fwd["own"]["latency_ms"][i] == fwd["delta"]["latency_ms"][i]
                          for i in leaves)
    # The page: the root is listed with each rank's own change and the words why, never with -12.3 ms.
    html = (folder / "index.html").read_text().replace("<wbr>", "")
    answer = html[html.index('id="answer"'):html.index('id="setup"')]
    row = next(r for r in answer.split("<tr")[1:] if "<code>dlrm-sharded</code>" in r)
    assert "per rank" in row and "rank 0 \u221213 ms" in row and "rank 1 \u221211.3 ms" in row, row
    assert "12.3 ms" not in answer
    assert 'id="mixed-ranks"' in answer and "each row is its own slowest rank" in answer
