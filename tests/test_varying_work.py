"""Work a replay cannot reproduce is said, never measured as if it were the model's.

* A module whose control flow is random per call (a Linear called 1-49 times, like stochastic depth or LayerDrop)
  does different work on every replay: its rows say so, and a comparison of the model with itself does not call it
  regressed (its verdict is "not judged", with the reason), where it once read "regressed 28.9x".
* A submodule handed an iterator: the model's call used it up, so a replay sees nothing. The row is not a silent
  0-FLOP "measured": the measurement fails with the reason and the row is estimated from its children.
"""

from __future__ import annotations

import torch

from cbsite.collector import CollectConfig, profile
from cbsite.collector.request import CollectRequest
from cbsite.collector.session.compare import CompareConfig, compare
from cbsite.collector.variation import COUNT_NOTE, VARIES_NOTE, probe
from cbsite.diff.comparison import from_record
from tests.varying_models import PassesAnIterator, looped


def _config(**kw):
    base = dict(min_run_time=0.01, warmup=1, calibrate=False, peak_flops=1e11, peak_bandwidth=1e10, progress=False,
                num_threads=1, step=False)
    base.update(kw)
    return CollectConfig(**base)


def test_the_probe_finds_random_control_flow_and_leaves_the_rng_as_it_was():
    model, args = looped(width=8, batch=2)
    before = torch.get_rng_state()
    notes = probe(model, args, {})
    assert torch.equal(torch.get_rng_state(), before)  # the collection draws what it would have drawn
    assert notes["loop"].startswith(VARIES_NOTE) and notes[""].startswith(VARIES_NOTE)
    assert notes["loop.lin"].startswith(COUNT_NOTE)  # each call of the Linear is the same work; its count is a draw
    assert "pre" not in notes and "post" not in notes
    fixed = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    assert probe(fixed, (torch.randn(2, 8),), {}) == {}


def test_random_per_call_work_compared_with_itself_is_not_judged_and_said(tmp_path):
    cfg = _config(phases=("forward",))
    side = dict(provider="tests.varying_models:looped", options={"width": 32, "batch": 8}, model_name="looped",
                batches=1, config=cfg)
    result = compare(CollectRequest(version="a", **side), CollectRequest(version="b", **side),
                     CompareConfig(processes=2, pairs=3, block_s=0.002))
    for key in (("loop", "forward"), ("", "forward")):
        verdict = result.verdicts[key]
        assert verdict.verdict == "not judged" and verdict.reason.startswith("work varies per call: not judged"), verdict
    # Fixed work beside it is still judged. Not asserted: that none of it is called a change. With 2 processes a
    # verdict has 1 degree of freedom, so each of 3 components x 2 sides is falsely called at its 1 % level by design.
    for key in (("pre", "forward"), ("loop.lin", "forward"), ("post", "forward")):
        assert result.verdicts[key].verdict != "not judged", result.verdicts[key]
    rows = {r["path"]: r for r in result.head.table("forward").to_dicts()}
    assert any(n.startswith(VARIES_NOTE) for n in rows["loop"]["notes"])
    assert any(n.startswith(COUNT_NOTE) for n in rows["loop.lin"]["notes"])
    # The record carries it, and the evidence the diff and the gate read from it says the same.
    entry = next(c for c in result.record["components"] if (c["key"], c["phase"]) == ("loop", "forward"))
    assert entry["verdict"]["verdict"] == "not judged" and entry["not_judged"]
    evidence = from_record(result.record)
    assert evidence.verdict("loop", "forward").verdict == "not judged"
    assert evidence.verdicts()[("loop", "forward")].verdict == "not judged"
    assert evidence.family([("loop", "forward"), ("pre", "forward")])[("loop", "forward")].verdict == "not judged"


def test_a_submodule_handed_an_iterator_is_not_a_silent_zero():
    run = profile(PassesAnIterator(), torch.randn(4, 16), config=_config())
    rows = {(r["path"], r["phase"]): r for r in run.table().to_dicts()}
    for phase in ("forward", "backward"):
        row = rows[("summer", phase)]
        assert row["status"] == "estimated" and "iterator" in row["error"] and "used it up" in row["error"], row
        assert row["flops"] and row["flops"] > 0  # from its Linear, called twice
    assert rows[("summer.lin", "forward")]["status"] == "measured"
