"""The collector's driver: `profile_model` calls the stages of a collection in order (pipeline/) and returns a `Run`.

census and plan -> calibration start -> components (capture, count, measure) -> rows -> re-measure -> rounds ->
peak check -> step -> the run record.
"""

from __future__ import annotations

import contextlib
import shutil
import time
import weakref
from typing import Any, Sequence

import polars as pl
import torch
from torch import nn

from cbsite import archive, schema
from cbsite.collector import hierarchy, memory
from cbsite.collector.capture import moved, refuse_iterators
from cbsite.collector.clean_worker import kept_worker
from cbsite.collector.config import DTYPES, Batch, CollectConfig, threads_for
from cbsite.collector.counting import warm_up as warm_counting
from cbsite.collector.device import describe_device, start_calibration_running
from cbsite.collector.peaks import check_peaks, shapes_budget
from cbsite.collector.pipeline import record
from cbsite.collector.pipeline.capture_plan import Planned, plan_collection
from cbsite.collector.pipeline.components import Measured, Plugins, measure_components
from cbsite.collector.pipeline.failures import error_text
from cbsite.collector.pipeline.fresh_rounds import Rounds, time_rounds
from cbsite.collector.pipeline.progress import Stages
from cbsite.collector.pipeline.remeasure import Remeasured, remeasure_inverted
from cbsite.collector.pipeline.rows import measured_rows, ops_frame, samples_frame
from cbsite.collector.plugins import registry
from cbsite.collector.preprocess import batch_size_of
from cbsite.collector.providers import Inputs as ProvidedInputs
from cbsite.collector.restore import preserved
from cbsite.collector.step import collect_step
from cbsite.collector.timing.blocks import TimingConfig
from cbsite.collector.twins import twin_spread
from cbsite.errors import CbsiteError


def profile_model(
    model: nn.Module,
    batches: Sequence[Batch],
    config: CollectConfig = CollectConfig(),
    *,
    model_name: str = "model",
    version: str = "v0",
    provider: dict[str, Any] | None = None,
    preprocessing: Sequence[dict[str, Any]] = (),
    inputs_description: dict[str, Any] | None = None,
    tags: Sequence[str] = (),
    notes: str = "",
    request: Any = None,
    keep_model: bool = True,
) -> archive.Run:
    """Profile every submodule of `model` independently on the captured inputs of `batches`.

    Several batches are captured and replayed in rotation so that repeated ids do not stay hot in
    cache; a module called several times per forward is timed over all its calls, per call.
    `keep_model`: leave the caller's model as it was found (restore.py). False where the model was built for this
    collection alone and is dropped after it (`cbsite collect`'s providers): keeping its values would be a copy of
    every one that nobody reads back.
    """
    schema.check_name("model", model_name)
    schema.check_name("version", version)
    if not batches:
        raise CbsiteError("no example inputs: give at least one batch of (args, kwargs)")
    refuse_iterators(batches)
    origin = record.Origin(model_name, version, provider or {"name": "python", "options": {}}, tuple(preprocessing),
                           inputs_description or {"batches": len(batches)}, tuple(tags), notes)
    caller_threads = torch.get_num_threads()
    torch.set_num_threads(threads_for(config))
    # The collection's wall time starts here: keeping the caller's model values (a spill to a file past
    # restore.SPILL_BYTES) is the collection's own work (run.json breakdown_s.preserve_model). Putting them back
    # comes after the run is recorded, so it is not in `wall_time_s`.
    started = time.perf_counter()
    try:
        # The caller's model is left as it was found, unless it is the collection's own: values, dtype, device, RNG
        # (restore.py). The memory limit turns an allocation that would summon the OOM killer into a failed component
        # (memory.py). One clean worker serves every calibration of the run (device.kept_worker).
        kept = preserved(model) if keep_model else contextlib.nullcontext()
        with kept, memory.MemoryLimit(config.memory_limit, torch.device(config.device)) as limit, kept_worker(), \
                memory.older_objects_frozen():
            return _profile(model, batches, config, origin, request, limit, started)
    finally:
        torch.set_num_threads(caller_threads)  # a notebook keeps its own setting


def _profile(model: nn.Module, batches: Sequence[Batch], config: CollectConfig, origin: record.Origin, request: Any,
             limit: memory.MemoryLimit | None, started: float) -> archive.Run:
    """The stages in order; `stages.done` names each one's wall seconds in run.json `breakdown_s`."""
    stages = Stages(started, torch.device(config.device).type == "cpu")
    stages.done("preserve_model")  # restore.preserved's copy of the model's values, the memory limit, the kept worker
    device, num_threads = torch.device(config.device), torch.get_num_threads()
    load_before = record.load_warnings(num_threads, "before")
    model, batches = _on_device(model, batches, device, DTYPES[config.dtype])
    planned = plan_collection(model, batches, config, device)
    stages.done("setup_and_capture")
    timing = TimingConfig(config.min_run_time, config.warmup, num_threads, config.device,
                          max_component_s=config.max_component_s, graph_allowance_bytes=planned.memory.allowance_bytes)
    device_info = _calibration_start(device, config)
    stages.done("calibration_start")
    peak_flops, peak_bw = next(iter(device_info["peak_flops"].values()), None), device_info["peak_bandwidth"]
    plugins = Plugins.start(config, origin.model)
    measured = measure_components(model, batches, config, planned, timing, plugins, stages.memory, origin.model)
    stages.done("components")
    run_id = archive.new_run_id()
    rows = measured_rows(model, batches, config, planned.components, planned.census, measured, run_id, origin.model,
                         origin.version, peak_flops, peak_bw)
    samples = measured.samples(run_id)
    remeasured = remeasure_inverted(rows, samples, measured, planned, dict(model.named_modules()), timing, num_threads,
                                    run_id)
    memory.release_freed()  # what the components freed goes back before the step needs its own
    stages.done("hierarchy_remeasure")
    rounds = time_rounds(model, batches, config, timing, run_id, rows, samples + remeasured.samples, request,
                         peak_flops, peak_bw)
    stages.done("rounds")
    hierarchy_record = hierarchy.check(rows, remeasured.pairs)
    twin_noise, twin_warnings = twin_spread(measured.twins, rows)
    peak_warnings = check_peaks(rows, device_info, measured.counted, shapes_budget(measured.timed_s))
    stages.done("calibration_end_and_peak_checks")
    training = model.training  # as the caller left it: the step changes modes and leaves them to `preserved`
    step = collect_step(model, batches, config, num_threads, request, measured.root_seconds()) if config.step else None
    stages.done("step")
    if limit is not None:
        limit.release()  # the memory limit is for measurement; the run's record is cbsite's own work (memory.MemoryLimit)
    setup = record.Setup.of(config, device_info, batch_size_of(ProvidedInputs(*batches[0])), len(batches), training,
                            num_threads, record.plugins_record(plugins.selection, plugins.runner.status,
                                                               plugins.runner.seconds))
    created_at, versions, git = record.stamp()
    run_record = record.RunRecord(
        run_id, created_at, versions, git, origin, setup,
        record.Wall(round(time.perf_counter() - started, 3), round(measured.timed_s, 3),
                    _breakdown(stages, measured, remeasured, plugins)),
        _components_record(rows, config.phases, measured),
        (*load_before, *record.load_warnings(num_threads, "after"), *peak_warnings,
         *record.memory_warnings(measured.out_of_memory(), limit), *twin_warnings),
        step, record.Rounds({**rounds.noise, "twins": twin_noise}, len(rounds.samples), rounds.session),
        hierarchy_record,
        _memory_record(planned, measured, remeasured, stages, limit, device), record.Calibration.of(config, device_info),
    )
    return _run(run_record, rows, rounds, plugins)


def _on_device(model: nn.Module, batches: Sequence[Batch], device: torch.device,
               dtype: torch.dtype) -> tuple[nn.Module, list[Batch]]:
    model = model.to(device)
    if dtype != torch.float32:
        model = model.to(dtype)
    return model, [moved(b, device, dtype) for b in batches]


def _calibration_start(device: torch.device, config: CollectConfig) -> dict[str, Any]:
    """The device and its peaks (calibrated on CPU, in the kept clean worker)."""
    if start_calibration_running():
        # The process would only wait for the worker: the counting passes' one-time set-up is made in that wait.
        warm_counting()
    return describe_device(device, DTYPES[config.dtype], peak_flops=config.peak_flops,
                           peak_bandwidth=config.peak_bandwidth, calibrate=config.calibrate)


def _memory_record(planned: Planned, measured: Measured, remeasured: Remeasured, stages: Stages,
                   limit: memory.MemoryLimit | None,
                   device: torch.device) -> record.Memory:
    captures, census = planned.captures, planned.census
    return record.Memory(
        limit=limit.record() if limit else {}, plan=planned.memory.record(),
        capture_groups=captures.groups - remeasured.capture_groups,
        capture_forwards=captures.forwards + captures.census_forwards - remeasured.capture_forwards,
        remeasure_captures={"groups": remeasured.capture_groups, "forwards": remeasured.capture_forwards},
        capture_rode_root=captures.rode, census="on shapes" if census.on_shapes else "real",
        largest_capture_bytes=captures.most_bytes, capture_anchors=captures.anchors.record(),
        peak_rss_bytes=memory.peak_rss_bytes() if stages.memory else None,
        peak_rss_bytes_after_stage=dict(stages.memory.peaks) if stages.memory else None,
        raisers=measured.raisers.record() if stages.memory else {}, returns=measured.returns.record(),
        peak_device_bytes=torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        out_of_memory=measured.out_of_memory(),
    )


def _breakdown(stages: Stages, measured: Measured, remeasured: Remeasured, plugins: Plugins) -> dict[str, float]:
    """run.json breakdown_s: the stages, the components stage split into its parts, the re-measurement's timed blocks."""
    return {**stages.record(measured.timed_s, sum(plugins.runner.seconds.values()), measured.capture_s, measured.quiet_s,
                             measured.passes_s()),
            "hierarchy_remeasure_timed_blocks": round(remeasured.timed_s, 3)}


def _components_record(rows: list[dict[str, Any]], phases: Sequence[str], measured: Measured) -> record.Components:
    on_shapes, real = measured.counting()
    twins = measured.twins
    return record.Components(
        counts={s: sum(1 for r in rows if r["phase"] == phases[0] and r["status"] == s) for s in schema.STATUSES},
        failed_measurements=measured.failed_measurements, components=len(measured.in_run), counts_phase=phases[0],
        counted_on_shapes=on_shapes, counted_real=real, twins_reused=twins.reused if twins is not None else 0,
        twins_enabled=twins is not None,
    )


def _run(run_record: record.RunRecord, rows: list[dict[str, Any]], rounds: Rounds, plugins: Plugins) -> archive.Run:
    """The Run: its record, rows, ops and samples; then the reporters post-process it."""
    run_id, origin = run_record.run_id, run_record.origin
    table = pl.from_arrow(archive.rows_to_table(rows))
    assert isinstance(table, pl.DataFrame)  # a Table gives a DataFrame (a Series comes from an Array)
    run = archive.Run(meta=run_record.to_json(), rows=table, artifacts=plugins.artifacts,
                      ops=ops_frame(plugins.runner.ops, run_id, origin.model, origin.version),
                      samples=samples_frame(rounds.samples, run_id, origin.model, origin.version))
    if plugins.artifacts is not None:
        weakref.finalize(run, shutil.rmtree, plugins.artifacts, True)  # the staging folder lives as long as the Run
    _report(run, plugins.selection)
    return run


def _report(run: archive.Run, selection: registry.Selection) -> None:
    """Reporters post-process the finished run; one that raises is recorded and the others still run."""
    plugins = run.meta["config"]["plugins"]
    for reporter in selection.instances("reporters"):
        try:
            reporter.report(run)
        except Exception as exc:  # noqa: BLE001
            plugins[reporter.name]["status"] = f"failed: {error_text(exc)}"
