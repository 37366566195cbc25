"""The run record (run.json), typed: one frozen section per stage, serialised to the same keys in the same order.

Readers elsewhere read run.json as a dict (`Run.meta`); this is where it is written, so a new field is one field
here and one line in `to_json`.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any, Mapping

from cbsite import archive, schema
from cbsite.collector import memory
from cbsite.collector.config import CollectConfig
from cbsite.collector.measure import REAL_COUNT_BELOW_S
from cbsite.collector.plugins import registry
from cbsite.collector.twins import TWINS_RULE
from cbsite.provenance import git_state, package_versions

COUNTING_RULE = ("FLOPs and bytes moved are counted on fake tensors (shapes, strides and dtypes, no arithmetic) where "
                 "that pass runs and meets no op whose work may depend on values; otherwise on a real run of batch 0. "
                 f"A component whose nearest measured ancestor's statement of the phase ran under {REAL_COUNT_BELOW_S * 1e3:g} ms is "
                 "counted on a real run straight away (cheaper than the pass on fake tensors; the counts are the same)")
ROTATION_RULE = "timed runs cycle through the captured batches in order; FLOPs, bytes and memory are counted on batch 0"


@dataclass(frozen=True)
class Origin:
    """What was collected: the model's name and version, where it came from and how it was prepared, the user's
    labels."""

    model: str
    version: str
    provider: Mapping[str, Any]
    preprocessing: tuple[Mapping[str, Any], ...]
    inputs: Mapping[str, Any]
    tags: tuple[str, ...]
    notes: str


@dataclass(frozen=True)
class Setup:
    """How it was collected: the device and its peaks, the dtype, the config and what it came to (batches, threads,
    plugins)."""

    device: Mapping[str, Any]
    dtype: str
    config: Mapping[str, Any]
    batches: int

    @classmethod
    def of(cls, config: CollectConfig, device: Mapping[str, Any], batch_size: int | None, batches: int, training: bool,
           num_threads: int, plugins: Mapping[str, Any]) -> "Setup":
        recorded = {
            **{k: v for k, v in asdict(config).items() if k not in ("plugins", "plugin_options")},
            "batch_size": batch_size, "batches": batches,
            "training": training, "num_threads": num_threads,
            "threads_source": "given (--threads)" if config.num_threads else
            ("default: one intra-op thread on CPU (README: Why one thread)" if config.device == "cpu" else "torch default"),
            "plugins": plugins,
        }
        return cls(device, config.dtype, recorded, batches)


@dataclass(frozen=True)
class Calibration:
    """Whether the run measured its CPU peaks at its start (`device.calibration.start`) and again at its end, the drift
    check (`device.calibration.end`: a run warning when the two differ by more than 10 %); `skipped` says why not, so
    that a given peak is never read as a checked one."""

    calibrated: bool
    drift_checked: bool
    skipped: str | None

    @classmethod
    def of(cls, config: CollectConfig, device: Mapping[str, Any]) -> "Calibration":
        """From the device entry once the peak check has run (peaks.check_peaks calibrates the end)."""
        measured = device.get("calibration")
        measured = measured if isinstance(measured, Mapping) else {}
        calibrated = isinstance(measured.get("start"), Mapping)
        if calibrated:
            skipped = None
        elif device.get("kind") != "cpu":
            skipped = "not a CPU: the peaks come from the device table or were given"
        elif config.peak_flops is not None and config.peak_bandwidth is not None:
            # --no-calibrate, calibrate=False, or a sharded run's ranks, which never calibrate beside each other
            skipped = "calibration off: both peaks were given and are used as they are"
        else:
            skipped = "calibration off (calibrate=False): a peak not given is missing, and so are the ratios over it"
        return cls(calibrated, isinstance(measured.get("end"), Mapping), skipped)


@dataclass(frozen=True)
class Wall:
    """Where the time went: the whole collection, the seconds inside timed regions (what no collector can avoid; the
    rest is capture, warm-up, counting passes and calibration), and the seconds per stage."""

    wall_time_s: float
    timed_s: float
    breakdown_s: Mapping[str, float]


@dataclass(frozen=True)
class Components:
    """The components by the status their rows carry (so run.json agrees with the Parquet), the failed attempts
    counted apart (a failed parent estimated from its children, a failed backward), and how the measured phases were
    counted: on shapes or on a real run, or taken from an identical twin (twins.py)."""

    counts: Mapping[str, int]
    failed_measurements: int
    components: int
    counts_phase: str
    counted_on_shapes: int
    counted_real: int
    twins_reused: int
    twins_enabled: bool


@dataclass(frozen=True)
class Rounds:
    """The noise across rounds (session/rounds.py), the samples.parquet rows and the session that ran the rounds."""

    noise: Mapping[str, Any]
    samples: int
    session: Mapping[str, Any] | None


@dataclass(frozen=True)
class Memory:
    """Where the memory went: the limit, the plan, the captures, the peaks and what raised them."""

    limit: Mapping[str, Any]
    plan: Mapping[str, Any]
    capture_groups: int
    # Real forwards that captured inputs, the census's included (a real census stopped where batch 0's inputs passed
    # the allowance, before one on shapes, counts as one).
    capture_forwards: int
    # Groups and forwards the hierarchy re-measurement captured again for its pairs (not in the two above).
    remeasure_captures: Mapping[str, int]
    capture_rode_root: bool  # the first group after the whole model took batch 0's inputs from its peak pass
    census: str
    largest_capture_bytes: int
    capture_anchors: Mapping[str, Any]  # groups captured by replaying the anchors that contain them (anchors.py)
    peak_rss_bytes: int | None
    peak_rss_bytes_after_stage: Mapping[str, int] | None
    raisers: Mapping[str, Any]
    returns: Mapping[str, Any]
    peak_device_bytes: int | None
    out_of_memory: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            **self.limit, **self.plan,
            "capture_groups": self.capture_groups, "capture_forwards": self.capture_forwards,
            "remeasure_captures": dict(self.remeasure_captures),
            "capture_rode_root": self.capture_rode_root,
            "census": self.census,
            "largest_capture_bytes": self.largest_capture_bytes,
            "capture_anchors": self.capture_anchors,
            "peak_rss_bytes": self.peak_rss_bytes,
            "peak_rss_bytes_after_stage": self.peak_rss_bytes_after_stage,
            **self.raisers,
            **self.returns,
            "peak_device_bytes": self.peak_device_bytes,
            "out_of_memory": self.out_of_memory,
        }


@dataclass(frozen=True)
class RunRecord:
    """One collection's run.json, one section per stage."""

    run_id: str
    created_at: str  # ISO 8601 UTC
    versions: Mapping[str, Any]
    git: Mapping[str, Any] | None
    origin: Origin
    setup: Setup
    wall: Wall
    components: Components
    warnings: tuple[str, ...]
    step: Mapping[str, Any] | None
    rounds: Rounds
    hierarchy: Mapping[str, Any]
    memory: Memory
    calibration: Calibration

    def to_json(self) -> dict[str, Any]:
        """run.json: these keys in this order (archive readers and the site read it by key)."""
        origin, setup, wall, comps = self.origin, self.setup, self.wall, self.components
        return {
            "schema_version": schema.SCHEMA_VERSION,
            "run_id": self.run_id,
            "model": origin.model,
            "version": origin.version,
            "created_at": self.created_at,
            "versions": self.versions,
            "device": setup.device,
            "calibration": asdict(self.calibration),
            "dtype": setup.dtype,
            "provider": origin.provider,
            "config": setup.config,
            "preprocessing": list(origin.preprocessing),
            "inputs": origin.inputs,
            "rotation": {"batches": setup.batches, "rule": ROTATION_RULE},
            "git": self.git,
            "tags": list(origin.tags),
            "notes": origin.notes,
            "wall_time_s": wall.wall_time_s,
            "timed_s": wall.timed_s,
            "breakdown_s": wall.breakdown_s,
            "counts": comps.counts,
            "failed_measurements": comps.failed_measurements,
            "components": comps.components,
            "warnings": list(self.warnings),
            "counts_phase": comps.counts_phase,
            "step": self.step,
            "rounds": self.rounds.noise["rounds"],
            "noise": self.rounds.noise,
            "samples": {"file": archive.SAMPLES_FILE, "rows": self.rounds.samples} if self.rounds.samples else None,
            "session": self.rounds.session,
            "hierarchy": self.hierarchy,
            "counting": {"on_shapes": comps.counted_on_shapes, "real": comps.counted_real, "rule": COUNTING_RULE},
            "twins": {"phases_counted_on_a_twin": comps.twins_reused, "enabled": comps.twins_enabled, "rule": TWINS_RULE},
            "memory": self.memory.to_json(),
        }


def stamp() -> tuple[str, Mapping[str, Any], Mapping[str, Any] | None]:
    """When the record is written, the package versions and the working directory's git state."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), package_versions(), git_state()


def load_warnings(num_threads: int, when: str) -> list[str]:
    """Timing on a loaded machine measures the contention: say so in the run, not only in numbers.

    The load average counts this process's own running threads too, so only a load above the core
    count means that something waited for a core.
    """
    try:
        load = os.getloadavg()[0]
    except OSError:
        return []
    cores = os.cpu_count() or 1
    if load > cores + 0.5:
        return [
            f"the machine was busy {when} timing (1-minute load average {load:.1f} on {cores} cores, "
            f"{num_threads} intra-op threads): latencies may include waiting for other processes"
        ]
    return []


def memory_warnings(out_of_memory: list[str], limit: memory.MemoryLimit | None) -> list[str]:
    if not out_of_memory:
        return []
    cap = f" under the limit of {limit.bytes / 2**30:.2f} GiB ({limit.source})" if limit and limit.bytes else ""
    named = ", ".join(out_of_memory[:8]) + (f" and {len(out_of_memory) - 8} more" if len(out_of_memory) > 8 else "")
    return [f"{len(out_of_memory)} component phase(s) ran out of memory{cap}: {named}; they are failed, their children "
            "measured and their parents estimated from them (give a larger --memory-limit to measure them whole)"]


def plugins_record(selection: registry.Selection, status: dict[str, str], seconds: dict[str, float]) -> dict[str, Any]:
    """run.json config.plugins: each plugin's kind, options, status line (if any) and seconds spent in it."""
    record = selection.describe()
    for name, line in status.items():
        record[name]["status"] = line
    for name, spent in seconds.items():
        record[name]["seconds"] = round(spent, 3)
    return record
