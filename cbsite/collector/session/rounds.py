"""A run's latency from its samples: rounds in fresh processes, raw blocks kept, medians derived.

Round 0 is the collecting process (its blocks come from `time_fn`); rounds 1..N-1 are worker processes
of a session. Per component and phase:

- each round's latency is the median of its uncontended blocks (all of its blocks when fewer than five
  are clean, and the row says so);
- `latency_ms` is the median of the round medians, so one disturbed process cannot move it far;
- `latency_p25_ms` / `latency_p75_ms` are quartiles of the pooled blocks the round medians used (the clean
  ones, all of a contended round's);
- the run-to-run spread (the standard deviation of the rounds' log medians, about a CV) goes into
  run.json's `noise`, beside the within-run spread that a single round can show.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any, Iterable, Sequence

from cbsite import tree

# As timing.blocks.MIN_BLOCKS: with fewer clean blocks a round's median uses all of its blocks, and the row
# says it was contended (the same rule the collecting process applies to its own blocks).
MIN_CLEAN_BLOCKS = 5


def block_samples(path: str, phase: str, blocks: Iterable[Any], session_id: str, process: int = 0,
                  arm: str = "run", key: str | None = None) -> list[dict[str, Any]]:
    """Sample rows (samples.parquet, without run identity) of one component's in-process blocks."""
    return [
        {"session_id": session_id, "path": path, "key": key if key is not None else path, "phase": phase,
         "process": process, "round": process, "pair": i, "arm": arm, "position": 0,
         "seconds_per_call": b.seconds_per_call, "calls": b.calls, "start_s": b.start_s, "wait_s": b.wait_s,
         "contended": b.contended}
        for i, b in enumerate(blocks)
    ]


def round_medians(samples: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[int, tuple[float, bool]]]:
    """(path, phase) -> {round: (median seconds per call, flagged)} over each round's clean blocks."""
    grouped: dict[tuple[str, str], dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        grouped[(s["path"], s["phase"])][s["round"]].append(s)
    out: dict[tuple[str, str], dict[int, tuple[float, bool]]] = {}
    for where, rounds in grouped.items():
        out[where] = {}
        for r, blocks in rounds.items():
            clean = [b["seconds_per_call"] for b in blocks if not b["contended"]]
            flagged = len(clean) < min(MIN_CLEAN_BLOCKS, len(blocks))
            values = [b["seconds_per_call"] for b in blocks] if flagged else clean
            out[where][r] = (statistics.median(values), flagged)
    return out


def apply_rounds(rows: list[dict[str, Any]], samples: Sequence[dict[str, Any]], phases: Sequence[str],
                 peak_flops: float | None, peak_bw: float | None,
                 flagged_notes: dict[tuple[str, str], list[str]] | None = None) -> dict[str, Any]:
    """Set measured rows' latencies from every round's samples; re-derive ratios and estimates.

    Returns run.json's `noise` record: rounds, and the run-to-run spread over components.
    """
    medians = round_medians(samples)
    pooled: dict[tuple[str, str], list[float]] = defaultdict(list)
    calls: dict[tuple[str, str], int] = defaultdict(int)
    for s in samples:
        where = (s["path"], s["phase"])
        # The blocks each round's median used: its clean ones, or all of a flagged round's. Quartiles of clean
        # blocks only beside a flagged round's median of all put the median outside its own quartiles (2.7x
        # the p75 on a sharded run's contended inter_arch).
        if not s["contended"] or medians[where][s["round"]][1]:
            pooled[where].append(s["seconds_per_call"])
            calls[where] += s["calls"]
    spreads = []
    rounds_seen: set[int] = set()
    for row in rows:
        where = (row["path"], row["phase"])
        if row["status"] != "measured" or where not in medians:
            continue
        per_round = medians[where]
        rounds_seen.update(per_round)
        values = [v for v, _ in per_round.values()]
        row["latency_ms"] = statistics.median(values) * 1e3
        clean = sorted(pooled.get(where, [])) or sorted(values)
        if len(clean) >= 2:
            q = statistics.quantiles(clean, n=4, method="inclusive")
            row["latency_p25_ms"], row["latency_p75_ms"] = q[0] * 1e3, q[2] * 1e3
        row["samples"] = calls.get(where) or row["samples"]
        notes = list(row.get("notes") or [])
        flagged_rounds = sorted(r for r, (_, f) in per_round.items() if f)
        if flagged_rounds:
            notes.append(f"contended in round{'s' * (len(flagged_rounds) > 1)} {', '.join(map(str, flagged_rounds))}: "
                         "too few blocks without waiting for a CPU; the median of rounds limits their effect")
        notes.extend((flagged_notes or {}).get(where, []))
        if len(values) >= 2:
            logs = [math.log(v) for v in values if v > 0]
            spread = statistics.stdev(logs) if len(logs) >= 2 else None
            if spread is not None:
                spreads.append(spread)
                notes = [n for n in notes if not n.startswith("run-to-run spread")]
                notes.append(f"run-to-run spread {spread:.1%} over {len(values)} rounds")
        row["notes"] = notes
    rederive(rows, phases, peak_flops, peak_bw)
    spreads.sort()
    return {
        "rounds": len(rounds_seen),
        "round_spread_median": statistics.median(spreads) if spreads else None,
        "round_spread_p90": spreads[int(0.9 * (len(spreads) - 1))] if spreads else None,
        "rule": "latency_ms = median over rounds of each round's median of uncontended blocks; spread = std of log round medians",
    }


def rederive(rows: list[dict[str, Any]], phases: Sequence[str], peak_flops: float | None, peak_bw: float | None) -> None:
    """Ratios of measured rows and the sums of estimated containers, after latencies changed."""
    for phase in phases:
        t = tree.build_tree(r for r in rows if r["phase"] == phase)
        for node in t:
            if node.row["status"] == "measured":
                tree.derive_ratios(node.row, peak_flops, peak_bw)
        for node in t:  # estimate_containers appends its note again: keep one
            if node.row["status"] == "estimated":
                node.row["notes"] = [n for n in (node.row.get("notes") or []) if not n.startswith("estimate")]
        tree.estimate_containers(t, peak_flops, peak_bw)
