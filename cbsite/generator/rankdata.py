"""Sharded runs (torchrun, README "Sharded models"): what the run page adds for them.

components.parquet holds each component's slowest rank (`rank`, `imbalance`); ranks.parquet every rank's rows.
The page's rank selector switches the table, the icicle, the Totals (the root's row), the lists of "Where the time
goes" and the details panel between the slowest-rank view (the default) and one rank's rows, so components.json
gains, per phase, the communication columns (`kind`, traffic, collectives), under `sharded.views` each rank's
columns and under `sharded.facts` each rank's slowest components and bound mix (rundata.key_facts of that rank's
view). A row whose kind is "communication" is labelled so, never with a roofline bound (cbsite/bound.py). The
summary (world size, backend, plan, imbalance) goes to the template through `summary`. Data only: numbers are
formatted by the page (format.js / the template's filters).
"""

from __future__ import annotations

from typing import Any

from cbsite.archive import Run
from cbsite.generator import rundata

# Per-phase columns a rank's view replaces (the rest, links and notes, stay the slowest rank's).
RANK_COLUMNS = ("status", "error", "latency_ms", "latency_p25_ms", "latency_p75_ms", "samples", "cpu_time_ms",
                "device_time_ms", "flops", "tflops_per_s", "mfu", "bytes_moved", "bandwidth_gbps", "bandwidth_util",
                "arithmetic_intensity", "peak_memory_bytes")
COMM_COLUMNS = ("kind", "rank", "imbalance", "sharding_type", "collectives", "comm_bytes_sent", "comm_bytes_received")
MOST_IMBALANCED = 3


def _gbps(sent: Any, received: Any, latency_ms: Any) -> float | None:
    """Collective traffic of one call (bytes sent + received) over its latency, in GB/s."""
    if sent is None or received is None or not latency_ms:
        return None
    return (sent + received) / (latency_ms * 1e-3) / 1e9


def _columns(rows: list[dict[str, Any]], index: dict[str, int], n: int, names: tuple[str, ...]) -> dict[str, list[Any]]:
    cols: dict[str, list[Any]] = {c: [None] * n for c in (*names, "comm_gbps")}
    for row in rows:
        i = index.get(row["path"])
        if i is None:
            continue
        for c in names:
            cols[c][i] = row.get(c)
        cols["comm_gbps"][i] = _gbps(row.get("comm_bytes_sent"), row.get("comm_bytes_received"), row.get("latency_ms"))
    out = {c: rundata.compact_column(v) for c, v in cols.items()}
    if "mfu" in out:
        out["bound"] = rundata.site_bounds(out)
    return out


def _plan(dist: dict[str, Any]) -> list[dict[str, Any]]:
    """The sharding plan per owner: how many tables of each sharding type (and on which ranks)."""
    out = []
    for owner, tables in sorted((dist.get("sharding_plan") or {}).items()):
        counts: dict[str, int] = {}
        for spec in (tables or {}).values():
            key = str((spec or {}).get("sharding_type") or "?")
            counts[key] = counts.get(key, 0) + 1
        out.append({"owner": owner, "types": [{"type": k, "tables": v} for k, v in sorted(counts.items())]})
    return out


FACT_KEYS = ("slowest", "bounds", "leaf_share")  # what "Where the time goes" shows per phase


def _rank_facts(comps: dict[str, Any], views: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The slowest components, the leaves' bound mix and share of one rank: rundata.key_facts of the page's columns
    with that rank's view over them, as the page's rank selector lays it (the rest stays the slowest rank's)."""
    view = dict(comps)
    for phase in comps["phases"]:
        view[phase] = {**comps[phase], **views.get(phase, {})}
    facts = rundata.key_facts(view)
    return {k: facts[k] for k in FACT_KEYS}


def add(run: Run, comps: dict[str, Any]) -> dict[str, Any] | None:
    """Put a sharded run's rank data into `comps` (components.json); return the summary, None for other runs."""
    dist = run.meta.get("distributed")
    if not isinstance(dist, dict) or "rank" not in run.rows.columns:
        return None
    index = {p: i for i, p in enumerate(comps["path"])}
    n = len(comps["path"])
    by_phase: dict[str, list[dict[str, Any]]] = {}
    for row in run.rows.sort(["order", "phase"]).iter_rows(named=True):
        by_phase.setdefault(row["phase"], []).append(row)
    for phase in comps["phases"]:
        comps[phase].update(_columns(by_phase.get(phase, []), index, n, COMM_COLUMNS))
        comps[phase]["bound"] = rundata.site_bounds(comps[phase])  # now with the kinds
    ranks: dict[str, dict[str, Any]] = {}
    if run.ranks is not None and not run.ranks.is_empty():
        grouped: dict[tuple[int, str], list[dict[str, Any]]] = {}
        for row in run.ranks.sort(["rank", "order", "phase"]).iter_rows(named=True):
            grouped.setdefault((row["rank"], row["phase"]), []).append(row)
        for (rank, phase), rows in sorted(grouped.items()):
            if phase in comps["phases"]:
                ranks.setdefault(str(rank), {})[phase] = _columns(rows, index, n, RANK_COLUMNS + COMM_COLUMNS)
    world = dist.get("world_size")
    comps["sharded"] = {"world_size": world, "backend": dist.get("backend"),
                        "ranks": sorted(ranks, key=int), "views": ranks,
                        "facts": {rank: _rank_facts(comps, views) for rank, views in ranks.items()}}
    root_imbalance = {}
    worst: dict[str, list[dict[str, Any]]] = {}
    for phase in comps["phases"]:
        cols = comps[phase]
        if n and comps["path"][0] == "":
            root_imbalance[phase] = {"imbalance": cols["imbalance"][0], "rank": cols["rank"][0]}
        measured = [i for i in range(n) if cols["imbalance"][i] is not None and cols["status"][i] == "measured"]
        measured.sort(key=lambda i: (-cols["imbalance"][i], i))
        worst[phase] = [{"path": comps["path"][i] or comps["model"], "imbalance": cols["imbalance"][i],
                         "rank": cols["rank"][i], "kind": cols["kind"][i]} for i in measured[:MOST_IMBALANCED]]
    comm = sum(1 for k in comps[comps["phases"][0]]["kind"] if k == "communication") if comps["phases"] else 0
    return {"world_size": world, "backend": dist.get("backend"), "launcher": dist.get("launcher"),
            "plan": _plan(dist), "root": root_imbalance, "most_imbalanced": worst, "communicating": comm,
            "ranks_measured": len(ranks)}
