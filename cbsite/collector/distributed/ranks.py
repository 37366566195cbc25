"""Rows per rank, and the one run rank 0 writes from every rank's rows.

Each rank turns what it measured into components.parquet rows (its `profile_model` run, with the
lockstep rows of the communicating modules put in, and the sharded pieces added under their owner).
Rank 0 merges them: components.parquet keeps one row per (component, phase), the **slowest rank's**
(the one a synchronous step waits for), with `rank` (which one) and `imbalance` (slowest / mean over the
ranks); ranks.parquet keeps every rank's rows; samples.parquet the timed blocks behind each merged row
(the slowest rank's). run.json's `distributed` says how it was collected.
"""

from __future__ import annotations

import copy
import statistics
import weakref
from typing import Any

import polars as pl

from cbsite import archive, schema, tree
from cbsite.collector import hierarchy
from cbsite.collector.distributed.collectives import Traffic
from cbsite.collector.distributed.discovery import STAGE_TYPE, Piece
from cbsite.collector.distributed.group import Group
from cbsite.collector.distributed.lockstep import LockstepResult
from cbsite.collector.measure import PhaseResult
from cbsite.collector.pipeline.rows import samples_frame
from cbsite.collector.session import rounds

STRUCTURE = ("path", "parent", "name", "depth", "module_type", "is_leaf", "order", "call_count", "phase")
RULE = ("components.parquet: per component and phase the slowest rank's row (`rank`), imbalance = slowest / mean "
        "latency over the ranks; ranks.parquet: every rank's rows; samples.parquet: the blocks behind each merged row")


def _peaks(run: archive.Run) -> tuple[float | None, float | None]:
    device = run.meta.get("device") or {}
    return next(iter((device.get("peak_flops") or {}).values()), None), device.get("peak_bandwidth")


def _fill(row: dict[str, Any], result: PhaseResult, extra_notes: list[str]) -> None:
    t = result.timing
    row.update(status="measured", error=None, latency_ms=t.median_ms, latency_p25_ms=t.p25_ms, latency_p75_ms=t.p75_ms,
               samples=t.samples, cpu_time_ms=t.cpu_time_ms, device_time_ms=t.device_time_ms, flops=result.counts.flops,
               bytes_moved=result.counts.bytes_moved, peak_memory_bytes=result.peak_memory_bytes,
               unsupported_ops=list(result.counts.unsupported_ops), notes=list(result.notes) + extra_notes)


def _traffic(row: dict[str, Any], traffic: Traffic) -> None:
    row.update(collectives=traffic.ops(), comm_bytes_sent=traffic.bytes_sent, comm_bytes_received=traffic.bytes_received)


def _not_measured(row: dict[str, Any], why: str) -> None:
    """A lockstep or local outcome without figures ("skipped: ...", "failed: ...")."""
    status, _, text = why.partition(": ")
    if row["status"] == "estimated":  # a container keeps its children's sums and says why it has no figure of its own
        row["notes"] = list(row.get("notes") or []) + [text]
        return
    row.update(status=status, error=text)


def rank_rows(run: archive.Run, found: list[Piece], comm_modules: set[str], comm_pieces: set[str],
              lockstep: dict[tuple[str, str], LockstepResult | str], local: dict[tuple[str, str], PhaseResult | str],
              probes: dict[str, Traffic], rank: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """This rank's rows (with `rank`, `kind`, sharding and traffic columns) and timed blocks."""
    peak_flops, peak_bw = _peaks(run)
    run_id = run.meta["run_id"]
    rows = [dict(r) for r in run.rows.to_dicts()]
    samples = [s for s in (run.samples.to_dicts() if run.samples is not None else [])]
    lock_paths = {path for path, _ in lockstep}
    samples = [s for s in samples if s["path"] not in lock_paths]
    for row in rows:
        row.update(rank=rank, kind="communication" if row["path"] in comm_modules else "compute")
        outcome = lockstep.get((row["path"], row["phase"]))
        if isinstance(outcome, LockstepResult):
            _fill(row, outcome.result, [])
            _traffic(row, outcome.traffic)
            tree.derive_ratios(row, peak_flops, peak_bw)
            samples += rounds.block_samples(row["path"], row["phase"], outcome.result.timing.blocks, run_id)
        elif isinstance(outcome, str):
            _not_measured(row, outcome)
    rows += _piece_rows(rows, found, comm_pieces, lockstep, local, probes, rank, peak_flops, peak_bw)
    piece_paths = {p.path for p in found}
    for r in rows:
        if r["path"] in piece_paths:
            timed = lockstep.get((r["path"], r["phase"])) or local.get((r["path"], r["phase"]))
            blocks = timed.result.timing.blocks if isinstance(timed, LockstepResult) else (
                timed.timing.blocks if isinstance(timed, PhaseResult) else [])
            samples += rounds.block_samples(r["path"], r["phase"], blocks, run_id)
    _renumber(rows)
    return rows, samples


def _piece_rows(rows: list[dict[str, Any]], found: list[Piece], comm_pieces: set[str],
                lockstep: dict[tuple[str, str], LockstepResult | str], local: dict[tuple[str, str], PhaseResult | str],
                probes: dict[str, Traffic], rank: int, peak_flops: float | None, peak_bw: float | None) -> list[dict[str, Any]]:
    """Rows of the stage containers and pieces under each owner that has rows (within --max-depth)."""
    by_key = {(r["path"], r["phase"]): r for r in rows}
    phases = sorted({r["phase"] for r in rows}, key=schema.PHASES.index)
    out = []
    for phase in phases:
        last_order: dict[str, float] = {}
        for p in found:
            owner = by_key.get((p.owner, phase))
            if owner is None:
                continue
            end = max(r["order"] for r in rows if r["phase"] == phase and (r["path"] == p.owner or
                                                                           r["path"].startswith(p.owner + ".") or p.owner == ""))
            stage_path = f"{p.owner}.{p.stage}" if p.owner else p.stage
            base = last_order.get(p.owner, end)
            if (stage_path, phase) not in by_key:
                stage = _blank(stage_path, p.owner, p.stage, owner["depth"] + 1, STAGE_TYPE, False, base + 0.001, owner, phase, rank)
                stage.update(status="estimated", notes=[f"the {p.stage.replace('_', ' ')}s of the sharding types (torchrec keeps "
                                                        "them in a list, outside named_modules)"])
                by_key[(stage_path, phase)] = stage
                out.append(stage)
                base += 0.001
            piece = _blank(p.path, stage_path, p.sharding_type, owner["depth"] + 2, p.module_type, True, base + 0.001, owner,
                           phase, rank)
            piece["sharding_type"] = p.sharding_type
            communicates = p.path in comm_pieces
            piece["kind"] = "communication" if communicates else "compute"
            outcome = (lockstep if communicates else local).get((p.path, phase))
            result = outcome.result if isinstance(outcome, LockstepResult) else outcome
            if isinstance(result, PhaseResult):
                _fill(piece, result, [] if communicates else ["measured on this rank alone: it issues no collective"])
                tree.derive_ratios(piece, peak_flops, peak_bw)
            elif isinstance(result, str):
                _not_measured(piece, result)
            if isinstance(outcome, LockstepResult):
                _traffic(piece, outcome.traffic)
            elif communicates and phase == "forward":
                _traffic(piece, probes[p.path])
            last_order[p.owner] = base + 0.001
            out.append(piece)
    for r in out:
        if r["module_type"] == STAGE_TYPE:
            children = [c for c in out if c["parent"] == r["path"] and c["phase"] == r["phase"]]
            _sum_children(r, children, peak_flops, peak_bw)
    return out


def _blank(path: str, parent: str, name: str, depth: int, module_type: str, is_leaf: bool, order: float,
           owner: dict[str, Any], phase: str, rank: int) -> dict[str, Any]:
    row = schema.empty_row()
    row.update(run_id=owner["run_id"], model=owner["model"], version=owner["version"], path=path, parent=parent, name=name,
               depth=depth, module_type=module_type, is_leaf=is_leaf, order=order, call_count=owner["call_count"], phase=phase,
               status="skipped", notes=[], unsupported_ops=[], rank=rank, kind="compute")
    return row


def _sum_children(row: dict[str, Any], children: list[dict[str, Any]], peak_flops: float | None, peak_bw: float | None) -> None:
    """A stage container: the sums of its pieces (each called once per call of the owner), as estimate_containers does."""
    for metric in schema.ADDITIVE_METRICS:
        values = [c[metric] for c in children if c[metric] is not None]
        row[metric] = (sum(values) if metric not in ("flops", "bytes_moved") else int(sum(values))) if values else None
    for metric in ("comm_bytes_sent", "comm_bytes_received"):
        values = [c[metric] for c in children if c[metric] is not None]
        row[metric] = sum(values) if values else None
    row["collectives"] = sorted({op for c in children for op in (c["collectives"] or [])}) or None
    row["kind"] = "communication" if any(c["kind"] == "communication" for c in children) else "compute"
    peaks = [c["peak_memory_bytes"] for c in children if c["peak_memory_bytes"] is not None]
    row["peak_memory_bytes"] = max(peaks) if peaks else None
    row["notes"] = list(row["notes"]) + ["estimated: sum of the sharding types' pieces"]
    tree.derive_ratios(row, peak_flops, peak_bw)


def _renumber(rows: list[dict[str, Any]]) -> None:
    """Dense pre-order indices again (pieces were slotted in at fractional positions); one order per path."""
    orders = sorted({(r["order"], r["path"]) for r in rows})
    index: dict[str, int] = {}
    for _order, path in orders:
        index.setdefault(path, len(index))
    for r in rows:
        r["order"] = index[r["path"]]


def _write_traces(run0: archive.Run, traces: list[bytes | None]) -> dict[str, str]:
    """Every rank's trace of the real step into the run's artifacts: {rank: path relative to the run folder}."""
    if run0.artifacts is None or not any(traces):
        return {}
    folder = run0.artifacts / "step"
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for rank, data in enumerate(traces):
        if data:
            (folder / f"rank{rank}.trace.json.gz").write_bytes(data)
            out[str(rank)] = f"{archive.ARTIFACTS_DIR}/step/rank{rank}.trace.json.gz"
    return out


def merged_run(run0: archive.Run, gathered: list[Any] | None, group: Group, schedule: list[tuple[str, str]],
               plan: Any) -> archive.Run:
    """Rank 0: one run from every rank's (rows, samples, record)."""
    assert gathered is not None
    run_id, model, version = run0.meta["run_id"], run0.meta["model"], run0.meta["version"]
    per_rank = [g[0] for g in gathered]
    # Each rank's collection judged its parent/child pairs before lockstep figures replaced some of them
    # (`remeasured_pairs` is rank 0's: the pairs its collection timed again, interleaved).
    remeasured = (run0.meta.get("hierarchy") or {}).get("remeasured_pairs", 0)
    hierarchy_record = hierarchy.check_ranks(per_rank, remeasured)
    keyed = [{(r["path"], r["phase"]): r for r in rows} for rows in per_rank]
    merged, chosen_samples = [], []
    samples_by: list[dict[tuple[str, str], list[dict[str, Any]]]] = [{} for _ in gathered]
    for r, (_, samples, _, _) in enumerate(gathered):
        for s in samples:
            samples_by[r].setdefault((s["path"], s["phase"]), []).append(s)
    for base in per_rank[0]:
        key = (base["path"], base["phase"])
        rows = [(r, k[key]) for r, k in enumerate(keyed) if key in k]
        timed = [(r, row) for r, row in rows if row.get("latency_ms")]
        slowest_rank, slowest = max(timed, key=lambda x: x[1]["latency_ms"]) if timed else (0, base)
        row = copy.deepcopy(slowest)
        row.update({k: base[k] for k in STRUCTURE})
        row["rank"] = slowest_rank
        if len(timed) == group.world_size and len(timed) > 1:
            mean = statistics.fmean(x["latency_ms"] for _, x in timed)
            row["imbalance"] = slowest["latency_ms"] / mean if mean > 0 else None
        merged.append(row)
        chosen_samples += samples_by[slowest_rank].get(key, [])
    everyone = []
    for rows in per_rank:
        for r in rows:
            everyone.append({**r, **{k: keyed[0].get((r["path"], r["phase"]), r)[k] for k in STRUCTURE}, "imbalance": None})
    for r in merged + everyone:
        r.update(run_id=run_id, model=model, version=version)
    for s in chosen_samples:
        s.update(session_id=run_id)
        for k in ("run_id", "model", "version"):
            s.pop(k, None)
    meta = copy.deepcopy(run0.meta)
    meta["hierarchy"] = hierarchy_record
    records = [g[2] for g in gathered]
    phase0 = meta.get("counts_phase") or merged[0]["phase"]
    meta["counts"] = {s: sum(1 for r in merged if r["phase"] == phase0 and r["status"] == s) for s in schema.STATUSES}
    meta["failed_measurements"] = sum(1 for r in merged if r["status"] == "failed" or (r["status"] == "estimated" and r.get("error")))
    meta["components"] = len({r["path"] for r in merged})
    meta["wall_time_s"] = max(rec["wall_s"] for rec in records)
    meta["timed_s"] = round(sum((rec["local_timed_s"] or 0) + rec["lockstep_timed_s"] for rec in records), 3)
    meta["samples"] = {"file": archive.SAMPLES_FILE, "rows": len(chosen_samples)} if chosen_samples else None
    # The job's step is the slowest rank's (they run in lockstep, so they differ by their waiting only).
    steps = [rec.pop("step", None) for rec in records]
    timed_steps = [st for st in steps if st and (st.get("train") or {}).get("ms")]
    meta["step"] = (max(timed_steps, key=lambda st: st["train"]["ms"]) if timed_steps
                    else next((st for st in steps if st), None))
    for rec, st in zip(records, steps):
        rec["step_train_ms"] = ((st or {}).get("train") or {}).get("ms")
    traces = _write_traces(run0, [g[3] for g in gathered])
    if traces and meta["step"] is not None:
        meta["step"]["traces"] = traces
    meta["distributed"] = {
        **group.record(),
        "sharding_plan": plan,
        "ranks": records,
        "lockstep": {"entries": len(schedule), "schedule": [list(e) for e in schedule]},
        "communicating": sorted({r["path"] for r in merged if r["kind"] == "communication"}),
        "ranks_file": archive.RANKS_FILE,
        "rule": RULE,
        "not_measured": "the dense part's DDP all-reduce of gradients and the fused optimizers' updates run in the training "
                        "step (run.json `step`, timed in lockstep unless --no-step), not in a component's replay",
    }
    rows_table = pl.from_arrow(archive.rows_to_table(merged))
    ranks_table = pl.from_arrow(archive.rows_to_table(everyone))
    assert isinstance(rows_table, pl.DataFrame) and isinstance(ranks_table, pl.DataFrame)
    run = archive.Run(meta=meta, rows=rows_table, artifacts=run0.artifacts, ops=run0.ops,
                      samples=samples_frame(chosen_samples, run_id, model, version), ranks=ranks_table)
    # profile_model's staging folder of artifacts is removed when its Run is collected: the merged run, which
    # shares the folder, keeps that Run alive until it is collected itself (a finalizer holds its arguments).
    weakref.finalize(run, _keep, run0)
    return run


def _keep(*_: Any) -> None:
    """Nothing: what a finalizer holds stays alive as long as its object."""
