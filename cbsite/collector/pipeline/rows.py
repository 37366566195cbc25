"""Rows: one per component and phase from the measured outcomes, ratios derived, containers estimated from their
children; and the run's other frames (samples.parquet, ops.parquet) with the run's identity."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import polars as pl
import torch
from torch import nn

from cbsite import schema, tree
from cbsite.collector import variation
from cbsite.collector.capture import Capture
from cbsite.collector.config import Batch, CollectConfig
from cbsite.collector.plan import Component

if TYPE_CHECKING:
    from cbsite.collector.pipeline.components import Measured, Outcome


def static_size(module: nn.Module) -> tuple[int, int]:
    """Bytes and element count of the unique parameters and buffers of a subtree (tied weights once)."""
    seen: dict[int, torch.Tensor] = {}
    for t in list(module.parameters()) + list(module.buffers()):
        seen.setdefault(id(t), t)
    return sum(t.numel() * t.element_size() for t in seen.values()), sum(t.numel() for t in seen.values())


def component_rows(
    components: list[Component],
    in_run: set[str],
    outcomes: dict[str, dict[str, Outcome]],
    cap: Capture,
    modules: dict[str, nn.Module],
    phases: Sequence[str],
    model_name: str,
    version: str,
) -> list[dict[str, Any]]:
    rows = []
    for comp in components:  # pre-order
        if comp.path not in in_run:
            continue
        param_bytes, param_count = static_size(modules[comp.path])
        for phase in phases:
            outcome = outcomes[comp.path][phase]
            row = schema.empty_row()
            row.update(
                model=model_name, version=version, path=comp.path, parent=comp.parent, name=comp.name,
                depth=comp.depth, module_type=comp.module_type, is_leaf=comp.is_leaf, order=comp.order,
                call_count=cap.call_count(comp.path), phase=phase, status=outcome.status, error=outcome.error,
                param_bytes=param_bytes, param_count=param_count, input_shapes=outcome.input_shapes,
                notes=list(outcome.notes), unsupported_ops=[],
            )
            if outcome.patch is not None:
                outcome.patch.apply(row)
            res = outcome.result
            if res is not None:
                row.update(
                    latency_ms=res.timing.median_ms, latency_p25_ms=res.timing.p25_ms,
                    latency_p75_ms=res.timing.p75_ms, samples=res.timing.samples,
                    cpu_time_ms=res.timing.cpu_time_ms, device_time_ms=res.timing.device_time_ms,
                    flops=res.counts.flops, bytes_moved=res.counts.bytes_moved,
                    peak_memory_bytes=res.peak_memory_bytes, unsupported_ops=res.counts.unsupported_ops,
                )
            rows.append(row)
    return rows


def estimate(rows: list[dict[str, Any]], phases: Sequence[str], peak_flops: float | None, peak_bw: float | None) -> list[dict[str, Any]]:
    """Ratios for measured rows; sums of children for every non-leaf that has no number of its own."""
    for phase in phases:
        t = tree.build_tree(r for r in rows if r["phase"] == phase)
        for node in t:
            row = node.row
            if row["status"] == "measured":
                tree.derive_ratios(row, peak_flops, peak_bw)
            elif node.children and row["status"] in ("failed", "skipped"):
                if row["error"]:
                    row["notes"] = list(row["notes"] or []) + [f"not measured as a whole ({row['error']})"]
                row["status"] = "estimated"
        tree.estimate_containers(t, peak_flops, peak_bw)
    return rows


def measured_rows(model: nn.Module, batches: Sequence[Batch], config: CollectConfig, components: list[Component],
                  census: Capture, measured: "Measured", run_id: str, model_name: str, version: str,
                  peak_flops: float | None, peak_bw: float | None) -> list[dict[str, Any]]:
    """The rows stage: every component in the run, estimated where it has no number of its own."""
    rows = component_rows(components, measured.in_run, measured.outcomes, census, dict(model.named_modules()),
                          config.phases, model_name, version)
    for row in rows:
        row["run_id"] = run_id
    rows = estimate(rows, config.phases, peak_flops, peak_bw)
    # Modules whose work differs between forwards of the same batch (random control flow) are said so in their rows
    # (variation.py); probed after the measurement, so a model that counts its own calls saw the collection's first.
    # Not on a sharded model's ranks: every forward communicates, and the ranks' forwards must agree.
    variation.annotate(rows, {} if config.capture_all_at_once else variation.probe(model, *batches[0]))
    return rows


def samples_frame(samples: list[dict[str, Any]], run_id: str, model_name: str, version: str) -> pl.DataFrame | None:
    """samples.parquet's rows with the run's identity, typed by schema.SAMPLES_SCHEMA."""
    return _identified(samples, schema.SAMPLES_SCHEMA, run_id, model_name, version)


def ops_frame(ops: list[dict[str, Any]], run_id: str, model_name: str, version: str) -> pl.DataFrame | None:
    """ops.parquet's rows with the run's identity, typed by schema.OPS_SCHEMA."""
    return _identified(ops, schema.OPS_SCHEMA, run_id, model_name, version)


def _identified(items: list[dict[str, Any]], table_schema: Any, run_id: str, model_name: str,
                version: str) -> pl.DataFrame | None:
    if not items:
        return None
    import pyarrow as pa

    rows = [{**item, "run_id": run_id, "model": model_name, "version": version} for item in items]
    frame = pl.from_arrow(pa.Table.from_pylist(rows, schema=table_schema))
    assert isinstance(frame, pl.DataFrame)  # a Table gives a DataFrame (a Series comes from an Array)
    return frame
