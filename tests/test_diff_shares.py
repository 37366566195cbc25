"""Diff shares: the diff summary (home, model and diff pages, PR comment) and the diff page's tables and charts
give a share only where it means something: between 0 % and 100 %, never for peak memory (a maximum), never where
own changes cancel out (the rule `RunDiff.cancelled`, one definition for the summary and the diff page), and the
summary never capitalises a path.

Once it read "2000000% each, 8000000% together" on the committed dlrm-sharded diff, "most of the peak memory
growth (56%)" on dlrm, and "Dense_arch.model accounts for 647%" on the demo study."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from cbsite import archive
from cbsite import gate as cgate
from cbsite.diff import rundiff as cdiff
from cbsite.diff.record import CANCEL, display_path, short_type
from cbsite.generator import diffdata
from tests.helpers.runfactory import make_run, revisions

ROOT = Path(__file__).resolve().parent.parent
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


def test_sharded_diff_says_the_parts_cancel_out(demo_runs):
    """Table-wise -> row-wise: tables moved between ranks, +2.56 MB here, -2.56 MB there, -32 B net."""
    rd = cdiff.diff_runs(_newest(demo_runs / "dlrm-sharded" / "table-wise"), _newest(demo_runs / "dlrm-sharded" / "row-wise"))
    text = check_summary(rd, "dlrm-sharded")
    assert "2000000%" not in text and "together" not in _where(text)
    assert "Parameter memory: own changes cancel out (+2.56 MB up, \u22122.56 MB down, \u221232 B net" in text
    # One rule for the summary and the diff page.
    page = diffdata.cancelled(rd, "param_bytes", "forward")
    assert page is not None and rd.cancelled("param_bytes", "forward") is not None
    assert f"({page['up']} up, {page['down']} down, {page['net']} net" in text
    for metric in ("flops", "param_bytes", "latency_ms"):
        assert (diffdata.cancelled(rd, metric, "forward") is None) == (rd.cancelled(metric, "forward") is None)


def test_dlrm_diff_gives_peak_memory_no_share(demo_runs):
    rd = cdiff.diff_runs(_newest(demo_runs / "dlrm" / "v1"), _newest(demo_runs / "dlrm" / "v2"))
    text = check_summary(rd, "dlrm")
    assert "peak memory growth (" not in text and "peak memory reduction (" not in text
    total = rd.totals["forward"]["peak_memory_bytes"].delta
    if total:  # named with its type and amount, never a share (peaks are maxima)
        c = _largest_own(rd, "peak_memory_bytes", "forward")
        grew = "growth" if total > 0 else "reduction"
        assert (f"the largest own forward peak memory {grew} is in {display_path(c.path, 'dlrm')} "
                f"({short_type(c.module_type)}, {'+' if total > 0 else chr(0x2212)}") in text
    # Shares that add up stay: the eight tied tables.
    assert "8 components tie for the largest part of the parameter memory growth (12% each, 98% together)" in text


def test_every_committed_pair_of_versions_prints_readable_shares(demo_runs):
    """Every pair of versions of a committed model, both ways (the demo study's once read
    "Dense_arch.model accounts for 647% of the parameter memory growth")."""
    seen = 0
    for folder in sorted(p for p in demo_runs.iterdir() if p.is_dir() and not p.name.startswith("_")):
        versions = sorted(p for p in folder.iterdir() if p.is_dir())
        for a, b in itertools.permutations(versions, 2):
            text = check_summary(cdiff.diff_runs(_newest(a), _newest(b)), folder.name)
            assert "Dense_arch" not in text and "accounts for" not in text
            seen += 1
    assert seen >= 4


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
        assert all(r["share"] is None or abs(r["share"]) <= CANCEL for r in rows)
    # The charts' data is unchanged: the note is the page's.
    assert all("cancel" not in v for spec in diffdata.chart_specs(tops).values() for v in spec["data"]["values"])


def test_shares_stay_where_the_parts_add_up(demo_runs):
    """dlrm v1 -> v2: every own change of FLOPs and parameters is a growth, so the shares stay (12.3% each)."""
    rd = cdiff.diff_runs(_newest(demo_runs / "dlrm" / "v1"), _newest(demo_runs / "dlrm" / "v2"))
    for metric in ("flops", "param_bytes"):  # static counts: latencies are the measurement's
        assert diffdata.cancelled(rd, metric, "forward") is None
    tops = diffdata.top_rows(rd, "dlrm")
    assert tops["param_bytes"][0]["share"] == pytest.approx(0.1228, abs=1e-3) and tops["flops"][0]["cancel"] is None


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


def _largest_own(rd: cdiff.RunDiff, metric: str, phase: str, counts=None) -> cdiff.ComponentDelta | None:
    """The component with the largest own change of `metric` in the direction of the whole model's change:
    where the summary must say the change is (derived from the runs read, never pinned)."""
    grew = rd.totals[phase][metric].delta > 0
    return next((c for c in rd.top(metric, phase, len(rd.components), counts) if (c.self_delta[metric] > 0) == grew), None)


def test_where_latency_grew_follows_the_verdicts_and_names_each_phase(demo_runs):
    """The dlrm v1 -> v2 pair was measured in one comparison session. Its within-run intervals alone once left
    the backward growth out (the noise rule) and the summary explained the forward's small growth only. Judged
    by the comparison, each phase whose verdict is a change gets a clause that names its phase and the largest
    own change among the components judged changed; a phase judged otherwise gets none."""
    from cbsite import review
    from cbsite.diff import comparison

    base, head = _newest(demo_runs / "dlrm" / "v1"), _newest(demo_runs / "dlrm" / "v2")
    rd = cdiff.diff_runs(base, head)
    evidence = comparison.evidence_for(demo_runs, base, head, {c.path: c.base_path for c in rd.components if c.base_path})
    assert evidence is not None and evidence.paired
    verdicts, counts = cgate.root_verdicts(evidence, rd), cgate.latency_counts(evidence)
    judged = rd.summary(latency=verdicts, latency_counts=counts)
    where = _where(judged)
    for phase in rd.phases:
        delta = rd.totals[phase]["latency_ms"].delta
        clause = f"{phase} latency {'growth' if delta > 0 else 'reduction'}"
        c = _largest_own(rd, "latency_ms", phase, counts)
        if verdicts.get(phase) in ("regressed", "improved") and c is not None:
            assert clause in where and display_path(c.path, "dlrm") in where, (phase, where)
        else:
            assert f"{phase} latency growth" not in where and f"{phase} latency reduction" not in where, (phase, where)
    # Every latency clause names its phase.
    assert where.count("latency growth") + where.count("latency reduction") == sum(
        where.count(f"{p} latency {w}") for p in rd.phases for w in ("growth", "reduction"))
    assert judged in review.markdown(rd, latency=evidence)
    # A component the comparison found unchanged is never where latency changed, whatever its own difference.
    unchanged = {k for k, v in evidence.verdicts().items() if v.verdict not in cgate.CHANGE_VERDICTS}
    for phase in rd.phases:
        for c in rd.top("latency_ms", phase, 100, counts):
            assert (c.path, phase) not in unchanged or c.kind in ("added", "removed")


def test_a_comparisons_verdicts_are_judged_once(demo_runs, monkeypatch):
    """A PR comment asks the evidence for its verdicts once per section (summary, where, latency table, gate):
    each a t-test per component, judged once and handed out as copies."""
    from cbsite import review, stats
    from cbsite.diff import comparison

    base, head = _newest(demo_runs / "dlrm" / "v1"), _newest(demo_runs / "dlrm" / "v2")
    rd = cdiff.diff_runs(base, head)
    evidence = comparison.evidence_for(demo_runs, base, head, {c.path: c.base_path for c in rd.components if c.base_path})
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
