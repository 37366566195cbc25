"""The diff summary (home, model and diff pages, PR comment) gives a share only where it means something:
between 0 % and 100 %, never for peak memory (a maximum), never where own changes cancel out (the rule
`RunDiff.cancelled`, one definition for the summary and the diff page), and it never capitalises a path.

Once it read "2000000% each, 8000000% together" on the committed dlrm-sharded diff, "most of the peak memory
growth (56%)" on dlrm, and "Dense_arch.model accounts for 647%" on the demo study."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from cbsite import archive
from cbsite import diff as cdiff
from cbsite.generator import diffdata
from tests.runfactory import make_run
from tests.test_diff import revisions

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "runs"
SHARE = re.compile(r"(-|\u2212)?(\d+)% (each|together|\)|of the)|\((-|\u2212)?(\d+)%\)")


def _newest(folder: Path) -> archive.Run:
    return archive.read_run(sorted(p for p in folder.iterdir() if p.is_dir())[-1])


def _where(summary: str) -> str:
    """The sentence that says where the change is (the one after the totals)."""
    return summary.split(". ", 2)[1]


def check_summary(rd: cdiff.RunDiff, model: str) -> str:
    """Every share printed lies in 0..100 %; peak memory has none; no path starts a sentence capitalised."""
    text = rd.summary()
    where = _where(text)
    for m in SHARE.finditer(where):
        sign, value = (m.group(1), m.group(2)) if m.group(2) is not None else (m.group(4), m.group(5))
        assert not sign and 0 <= int(value) <= 100, (m.group(0), text)
    for clause in where.split("; "):
        if "peak memory" in clause:
            assert "%" not in clause, clause
    paths = {c.path for c in rd.components if c.path} | {model}
    for sentence in re.split(r"(?<=\.) ", text):
        first = sentence.split(" ", 1)[0].rstrip(",:;")
        for p in paths:
            if p[:1].isalpha() and p[:1].islower():
                assert first != p[:1].upper() + p[1:], (p, sentence)
    return text


needs_runs = pytest.mark.skipif(not (RUNS / "dlrm-sharded").is_dir() or not (RUNS / "dlrm").is_dir(),
                                reason="the committed runs are absent")


@needs_runs
def test_sharded_diff_says_the_parts_cancel_out():
    """Table-wise -> row-wise: tables moved between ranks, +2.56 MB here, -2.56 MB there, -32 B net."""
    rd = cdiff.diff_runs(_newest(RUNS / "dlrm-sharded" / "table-wise"), _newest(RUNS / "dlrm-sharded" / "row-wise"))
    text = check_summary(rd, "dlrm-sharded")
    assert "2000000%" not in text and "together" not in _where(text)
    assert "Parameter memory: own changes cancel out (+2.56 MB up, \u22122.56 MB down, \u221232 B net" in text
    # One rule for the summary and the diff page.
    page = diffdata.cancelled(rd, "param_bytes", "forward")
    assert page is not None and rd.cancelled("param_bytes", "forward") is not None
    assert f"({page['up']} up, {page['down']} down, {page['net']} net" in text
    for metric in ("flops", "param_bytes", "latency_ms"):
        assert (diffdata.cancelled(rd, metric, "forward") is None) == (rd.cancelled(metric, "forward") is None)


@needs_runs
def test_dlrm_diff_gives_peak_memory_no_share():
    rd = cdiff.diff_runs(_newest(RUNS / "dlrm" / "v1"), _newest(RUNS / "dlrm" / "v2"))
    text = check_summary(rd, "dlrm")
    assert "peak memory growth (56%)" not in text
    assert "the largest own forward peak memory growth is in sparse_arch.embedding_bag_collection (EmbeddingBagCollection, +" in text
    # Shares that add up stay: the eight tied tables.
    assert "8 components tie for the largest part of the parameter memory growth (12% each, 98% together)" in text


@needs_runs
def test_every_committed_pair_of_versions_prints_readable_shares():
    """Every pair of versions of a committed model, both ways (the demo study's once read
    "Dense_arch.model accounts for 647% of the parameter memory growth")."""
    seen = 0
    for folder in sorted(p for p in RUNS.iterdir() if p.is_dir() and not p.name.startswith("_")):
        versions = sorted(p for p in folder.iterdir() if p.is_dir())
        for a, b in itertools.permutations(versions, 2):
            text = check_summary(cdiff.diff_runs(_newest(a), _newest(b)), folder.name)
            assert "Dense_arch" not in text and "accounts for" not in text
            seen += 1
    assert seen >= 4


SPEC = {"": {"a": {"a.x": None, "a.y": None}, "b": None}}


def test_a_share_above_100_percent_is_given_as_amounts():
    """a.x grows by 300 FLOPs, b shrinks by 100: a.x's own change is 150 % of the +200 net (not cancelled: the
    parts move 400, twice the net), so the summary gives amounts, not "150%"."""
    base = make_run(SPEC, metrics={"a.x": {"flops": 1000}, "a.y": {"flops": 1000}, "b": {"flops": 1000}})
    head = make_run(SPEC, version="v2", metrics={"a.x": {"flops": 1300}, "a.y": {"flops": 1000}, "b": {"flops": 900}})
    rd = cdiff.diff_runs(base, head)
    assert rd.cancelled("flops", "forward") is None
    text = check_summary(rd, "m")
    assert ("The largest own forward FLOP growth is in a.x (+300 FLOP, more than the whole model's +200 FLOP: partly offset "
            "elsewhere)") in text


def test_parts_that_cancel_out_are_given_as_amounts_up_down_and_net():
    base = make_run(SPEC, metrics={"a.x": {"flops": 1000}, "a.y": {"flops": 1000}, "b": {"flops": 1000}})
    head = make_run(SPEC, version="v2", metrics={"a.x": {"flops": 2000}, "a.y": {"flops": 1000}, "b": {"flops": 10}})
    rd = cdiff.diff_runs(base, head)
    cancel = rd.cancelled("flops", "forward")
    assert cancel == cdiff.Cancelled(up=1000, down=-990, net=10, complete=True)
    text = check_summary(rd, "m")
    assert "FLOPs: own changes cancel out (+1 kFLOP up, \u2212990 FLOP down, +10 FLOP net)" in text
    assert diffdata.cancelled(rd, "flops", "forward")["net"] == "+10 FLOP"


def test_a_path_is_never_capitalised():
    """A component whose own change exceeds the model's starts its clause: once "Dense_arch.model accounts for"."""
    spec = {"": {"dense_arch": {"dense_arch.model": None}, "b": None}}
    base = make_run(spec, metrics={"dense_arch.model": {"flops": 1000}, "b": {"flops": 1000}})
    head = make_run(spec, version="v2", metrics={"dense_arch.model": {"flops": 1300}, "b": {"flops": 900}})
    text = check_summary(cdiff.diff_runs(base, head), "m")
    assert "Dense_arch" not in text and "The largest own forward FLOP growth is in dense_arch.model" in text


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(revisions())
def test_no_share_printed_is_above_100_or_below_0_percent(pair):
    base_tree, head_tree = pair
    rd = cdiff.diff_runs(base_tree.run(version="v1"), head_tree.run(version="v2"))
    check_summary(rd, "m")


@needs_runs
def test_where_latency_grew_follows_the_verdicts_and_names_each_phase():
    """The committed dlrm v1 -> v2 pair: backward latency grew by +4.51 ms, 69 % of it in
    sparse_arch.embedding_bag_collection's own time. Its within-run intervals overlap (the demo runs had one
    round), so the noise rule left it out and the summary once said "the largest part of the latency growth
    (38%)" of the forward's +0.156 ms alone. Judged by the comparison session, it regressed: the summary, the PR
    comment and the diff page name it, each latency clause with its phase."""
    from cbsite import comparison, review

    base, head = _newest(RUNS / "dlrm" / "v1"), _newest(RUNS / "dlrm" / "v2")
    rd = cdiff.diff_runs(base, head)
    unjudged = rd.summary()
    assert "the largest part of the forward latency growth (38%) is in over_arch.model.0._mlp.1._linear" in unjudged
    ebc = next(c for c in rd.for_phase("backward") if c.path == "sparse_arch.embedding_bag_collection")
    assert ebc.noise["latency_ms"] and ebc.self_delta["latency_ms"] > 3.0  # the noise rule drops it ...
    evidence = comparison.evidence_for(RUNS, base, head, {c.path: c.base_path for c in rd.components if c.base_path})
    assert evidence is not None and evidence.paired
    assert review.latency_changed(ebc, evidence.verdicts())  # ... the comparison judged it regressed
    judged = rd.summary(latency=review.root_verdicts(evidence, rd), latency_counts=review.latency_counts(evidence))
    assert ("most of the backward latency growth (69%) is in sparse_arch.embedding_bag_collection "
            "(EmbeddingBagCollection)") in judged
    assert "the largest part of the forward latency growth (38%) is in over_arch.model.0._mlp.1._linear" in judged
    assert judged in review.markdown(rd, latency=evidence)
    # A component the comparison found unchanged is never where latency changed, whatever its own difference.
    unchanged = {k for k, v in evidence.verdicts().items() if v.verdict not in review.CHANGE_VERDICTS}
    for c in rd.top("latency_ms", "backward", 100, review.latency_counts(evidence)):
        assert (c.path, "backward") not in unchanged or c.kind in ("added", "removed")


@needs_runs
def test_a_comparisons_verdicts_are_judged_once(monkeypatch):
    """A PR comment asks the evidence for its verdicts once per section (summary, where, latency table, gate):
    each a t-test per component, judged once and handed out as copies."""
    from cbsite import comparison, review, stats

    base, head = _newest(RUNS / "dlrm" / "v1"), _newest(RUNS / "dlrm" / "v2")
    rd = cdiff.diff_runs(base, head)
    evidence = comparison.evidence_for(RUNS, base, head, {c.path: c.base_path for c in rd.components if c.base_path})
    calls = []
    judge = stats.paired_many
    monkeypatch.setattr(stats, "paired_many", lambda *a, **k: calls.append(1) or judge(*a, **k))
    first = evidence.verdicts()
    review.markdown(rd, latency=evidence)
    assert len(calls) == 1 and evidence.verdicts() == first
    first.clear()  # a caller's copy: the evidence keeps its own
    assert evidence.verdicts() and len(calls) == 1
    evidence.verdicts(floor=0.5)  # another floor is another judgement
    assert len(calls) == 2
