"""Consistent hierarchies: a child should not measure slower than the parent that contains it.

A parent called once per forward does all of its child's work and more, so a child whose latency is
above its parent's *beyond both intervals* (the child's 25th percentile above the parent's 75th) points
at the measurement, not the model: the two were timed at different moments (a neighbour, a frequency
step) or the child alone pays a cost the parent amortises. Such pairs are timed again, *interleaved*
(random order inside each pair of blocks, as a comparison does), in the collecting process; the new
blocks join the run's samples, so the latencies stay derived from samples. A pair that is still
inverted is flagged on both rows, and run.json's `hierarchy` carries the share of consistent pairs.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Iterable

from torch.utils.benchmark import Timer

from cbsite.collector import memory
from cbsite.collector.timing.blocks import before_block, block_size, first_guess, one_call_per_block, timed_block
from cbsite.collector.timing.contention import WaitProbe

REMEASURE_PAIRS = 10


def _eligible(rows: Iterable[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(parent row, child row) pairs with numbers on both sides and the same calls per forward."""
    rows = list(rows)
    by = {(r["path"], r["phase"]): r for r in rows}
    pairs = []
    for child in rows:
        if child["parent"] is None or child["status"] != "measured" or not child["latency_ms"]:
            continue
        parent = by.get((child["parent"], child["phase"]))
        if parent is None or parent["status"] != "measured" or not parent["latency_ms"]:
            continue
        if parent["call_count"] == child["call_count"] and child["call_count"] > 0:
            pairs.append((parent, child))
    return pairs


def inverted(parent: dict[str, Any], child: dict[str, Any]) -> bool:
    """Is the child slower than its parent beyond both intervals?"""
    lo_child = child["latency_p25_ms"] if child["latency_p25_ms"] is not None else child["latency_ms"]
    hi_parent = parent["latency_p75_ms"] if parent["latency_p75_ms"] is not None else parent["latency_ms"]
    return lo_child > hi_parent


def inverted_pairs(rows: Iterable[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The (parent, child) rows `remeasure` times again: the eligible pairs that are inverted."""
    return [(parent, child) for parent, child in _eligible(rows) if inverted(parent, child)]


def remeasure(
    rows: list[dict[str, Any]],
    statement: Callable[[str, str], tuple[Callable[[], Any], int] | None],
    block_s: float,
    num_threads: int,
    session_id: str,
    first_pair: Callable[[str, str], int],
) -> tuple[list[dict[str, Any]], int]:
    """Time every inverted pair again, interleaved; returns (new sample rows, pairs re-measured).

    `statement(path, phase)` gives the timed statement of a measured component and its calls per
    statement (None when there is none); `first_pair(path, phase)` the next free block index.
    """
    from cbsite.collector.session.rounds import block_samples

    samples: list[dict[str, Any]] = []
    done = 0
    rng = random.Random(session_id)
    probe = WaitProbe()
    for parent, child in inverted_pairs(rows):
        try:
            blocks, sides = _time_pair(parent, child, statement, block_s, num_threads, rng, probe)
        except Exception as exc:  # noqa: BLE001 - both rows were measured once: one pair never ends the run
            if memory.is_out_of_memory(exc):
                memory.release_freed()
            first_line = (str(exc).strip().splitlines() or [""])[0]
            for row in (parent, child):
                row["notes"] = list(row["notes"] or []) + [f"{NOT_REMEASURED_NOTE}{type(exc).__name__} {first_line}".strip()]
            continue
        if blocks is None:
            continue
        for i, (row, *_rest) in enumerate(sides):
            start = first_pair(row["path"], row["phase"])
            new = block_samples(row["path"], row["phase"], blocks[i], session_id)
            for k, s in enumerate(new):
                s["pair"] = start + k
            samples.extend(new)
        done += 1
    return samples, done


def _time_pair(parent: dict[str, Any], child: dict[str, Any],
               statement: Callable[[str, str], tuple[Callable[[], Any], int] | None], block_s: float, num_threads: int,
               rng: random.Random, probe: WaitProbe) -> tuple[dict[int, list[Any]] | None, list[Any]]:
    """One inverted pair's interleaved blocks (None where either side has no statement) and its sides."""
    sides: list[Any] = []
    for row in (parent, child):
        found = statement(row["path"], row["phase"])
        if found is None:
            return None, sides
        fn, calls = found
        timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=num_threads)
        fn()
        # Sized from the row's own median (a statement is `calls` calls): a statement that outlasts a block is one
        # per block with no sizing run, a shorter one takes one sizing run instead of several.
        per_statement = row["latency_ms"] / 1e3 * calls
        one = one_call_per_block(fn) or per_statement >= block_s
        number = 1 if one else block_size(timer, block_s, first_guess(per_statement, block_s))
        sides.append((row, timer, calls, number, before_block(fn)))
    blocks: dict[int, list[Any]] = {0: [], 1: []}
    for k in range(REMEASURE_PAIRS):
        order = [0, 1]
        rng.shuffle(order)
        for i in order:
            row, timer, calls, number, step = sides[i]
            step(k, REMEASURE_PAIRS)  # a graph cycle takes its batches in turn here too
            blocks[i].append(timed_block(timer, number, calls, probe))
    return blocks, sides


NOT_REMEASURED_NOTE = "the interleaved re-measurement with its parent or child failed, its first figures stand: "
PARENT_NOTE = "slower than its parent "
CHILD_NOTE = "faster than its child "


def check_ranks(per_rank: list[list[dict[str, Any]]], remeasured: int) -> dict[str, Any]:
    """`check` on each rank's final rows of a sharded run, where lockstep figures replaced some of the figures
    each rank's own collection checked: its flags are dropped and the pairs judged again, rank by rank (a
    child and its parent on one rank; the merged table takes each row from its slowest rank)."""
    records = []
    for rank, rows in enumerate(per_rank):
        for row in rows:
            row["notes"] = [n for n in row.get("notes") or [] if not n.startswith((PARENT_NOTE, CHILD_NOTE))]
        rec = check(rows, remeasured)
        records.append({**rec, "inverted": [{**i, "rank": rank} for i in rec["inverted"]]})
    pairs = sum(r["pairs"] for r in records)
    consistent = sum(r["consistent"] for r in records)
    return {
        "pairs": pairs,
        "consistent": consistent,
        "share_consistent": consistent / pairs if pairs else None,
        "remeasured_pairs": remeasured,
        "inverted": [i for r in records for i in r["inverted"]],
        "rule": records[0]["rule"] + "; judged on each rank's rows after the lockstep figures" if records else None,
    }


def check(rows: list[dict[str, Any]], remeasured: int) -> dict[str, Any]:
    """Flag the rows of pairs still inverted; the share of consistent parent/child pairs for run.json."""
    pairs = _eligible(rows)
    bad = [(p, c) for p, c in pairs if inverted(p, c)]
    for parent, child in bad:
        where = "after an interleaved re-measurement" if remeasured else ""
        child["notes"] = list(child["notes"] or []) + [
            f"{PARENT_NOTE}{parent['path'] or '<root>'} ({child['latency_ms']:.4g} ms vs {parent['latency_ms']:.4g} ms) "
            f"beyond both intervals {where}: timed alone it pays a cost the parent amortises, or a disturbance remained".replace("  ", " ")
        ]
        parent["notes"] = list(parent["notes"] or []) + [
            f"{CHILD_NOTE}{child['path']} beyond both intervals (see that row)"
        ]
    return {
        "pairs": len(pairs),
        "consistent": len(pairs) - len(bad),
        "share_consistent": (len(pairs) - len(bad)) / len(pairs) if pairs else None,
        "remeasured_pairs": remeasured,
        "inverted": [{"parent": p["path"], "child": c["path"], "phase": c["phase"]} for p, c in bad],
        "rule": "pairs with equal calls per forward; inverted when the child's p25 is above the parent's p75",
    }
