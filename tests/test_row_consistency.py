"""Rows that agree with themselves.

A median lies within its own quartiles: both come from the same blocks (never a flagged round's median of every
block beside quartiles of its clean ones). A sharded run's parent/child pairs are judged on each rank's final rows.
"""

from __future__ import annotations

from cbsite.collector.session.rounds import apply_rounds


def _samples(path: str, values: list[tuple[float, bool]], round_: int = 0) -> list[dict]:
    return [{"path": path, "phase": "forward", "round": round_, "process": round_, "seconds_per_call": v, "calls": 10,
             "contended": c} for v, c in values]


def _row(path: str) -> dict:
    return {"path": path, "parent": None if path == "" else "", "phase": "forward", "status": "measured",
            "latency_ms": 0.0, "latency_p25_ms": 0.0, "latency_p75_ms": 0.0, "samples": 0, "notes": [],
            "flops": 0, "bytes_moved": 0, "call_count": 1, "depth": 0 if path == "" else 1, "order": 0 if path == "" else 1,
            "is_leaf": path != ""}


def test_a_contended_rounds_median_and_quartiles_come_from_the_same_blocks():
    # 6 of 8 blocks waited for a CPU: too few clean ones, so the median is of all 8, and so are the quartiles.
    busy = _samples("", [(2e-3, True)] * 6 + [(1e-3, False)] * 2)
    # A quiet component: the median and quartiles of its clean blocks only (one contended block left out).
    quiet = _samples("a", [(1e-3, False), (1.1e-3, False), (1.2e-3, False), (1.3e-3, False), (1.4e-3, False),
                           (9e-3, True)])
    rows = [_row(""), _row("a")]
    apply_rounds(rows, busy + quiet, ["forward"], None, None)
    root, a = rows
    assert root["latency_p25_ms"] <= root["latency_ms"] <= root["latency_p75_ms"]
    assert root["latency_ms"] == 2.0 and root["samples"] == 80
    assert a["latency_ms"] == 1.2 and a["latency_p75_ms"] < 9.0 and a["samples"] == 50


def test_a_sharded_runs_pairs_are_judged_again_on_each_ranks_final_rows():
    """Lockstep figures replace some of a rank's rows after its collection checked its pairs (once
    sparse_arch's p25 of 13.4 ms above the root's p75 of 8.77 ms, while run.json said every pair was consistent)."""
    from cbsite.collector.hierarchy import check_ranks

    def rows(root: tuple[float, float, float], child: tuple[float, float, float], stale: bool = False) -> list[dict]:
        out = [_row(""), _row("a")]
        for row, (p25, med, p75) in zip(out, (root, child)):
            row.update(latency_p25_ms=p25, latency_ms=med, latency_p75_ms=p75)
        if stale:  # a flag the rank's own collection set on figures lockstep replaced
            out[1]["notes"] = ["slower than its parent <root> (9 ms vs 1 ms) beyond both intervals: ..."]
        return out

    rank0 = rows((7.0, 7.75, 8.77), (13.4, 20.0, 21.0))  # the child slower beyond both intervals
    rank1 = rows((10.0, 11.0, 12.0), (5.0, 6.0, 7.0), stale=True)  # consistent once lockstep figures are in
    record = check_ranks([rank0, rank1], remeasured=0)
    assert record["pairs"] == 2 and record["consistent"] == 1
    assert record["inverted"] == [{"parent": "", "child": "a", "phase": "forward", "rank": 0}]
    assert any(n.startswith("slower than its parent <root> (20 ms vs 7.75 ms)") for n in rank0[1]["notes"])
    assert rank1[1]["notes"] == []  # the stale flag is gone


def test_an_inverted_pair_is_timed_again_interleaved_holding_one_graph_at_a_time():
    """The re-measurement holds a parent and its child together: each holds one backward graph at a time,
    taking the batches in turn between blocks (it held every batch's graph of both)."""
    import torch
    from torch import nn

    from cbsite.collector import hierarchy
    from cbsite.collector.capture import capture
    from cbsite.collector.measure import ComponentMeasurement
    from cbsite.collector.timing.blocks import TimingConfig
    from cbsite.collector.timing.graphs import GraphCycle

    model = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
    caps = [capture(model, (torch.randn(8, 16),), {}, grad=True) for _ in range(3)]
    modules = dict(model.named_modules())
    built = {}

    def statement(path: str, phase: str):
        m = ComponentMeasurement(modules[path], [c.calls[path] for c in caps], TimingConfig(min_run_time=0.002, warmup=1))
        built[path] = m.rotation(phase, one_graph=True)
        return built[path], m.calls_per_batch

    rows = [_row(""), _row("0")]
    for row in rows:
        row["phase"] = "backward"
    rows[0].update(latency_p25_ms=0.9, latency_ms=1.0, latency_p75_ms=1.1)
    rows[1].update(latency_p25_ms=2.0, latency_ms=2.1, latency_p75_ms=2.2)  # the child slower beyond both intervals
    samples, done = hierarchy.remeasure(rows, statement, 0.0005, 1, "s", lambda path, phase: 0)
    assert done == 1
    assert sorted({s["path"] for s in samples}) == ["", "0"]
    assert len(samples) == 2 * hierarchy.REMEASURE_PAIRS
    assert all(isinstance(fn, GraphCycle) and fn.switches >= 2 for fn in built.values())


def test_a_contention_note_never_says_more_than_all_of_the_time():
    """Every thread's run-queue wait counts, so a sharded run's communication threads waiting at once once
    made a note read "waited for a CPU (220% of their time)"."""
    from cbsite.collector.timing.blocks import _waited_words

    assert _waited_words(0.37) == "37% of their time"
    assert _waited_words(2.2) == "its threads waited 2.2x the blocks' wall time between them"
    assert "%" not in _waited_words(1.01)
