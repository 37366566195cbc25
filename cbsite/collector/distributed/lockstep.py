"""Lockstep measurement: components that communicate, timed on every rank at once.

A collective completes only when every rank makes it, so a component that communicates can be
replayed only when all ranks make the same calls, in the same order, the same number of times. The
per-rank adaptive timing of `blocks.time_fn` (block sizes and block counts from each rank's own
clock, pauses for a quiet machine) would desynchronise them. Here:

* every number that decides how often a statement runs comes from rank 0, broadcast (`Agreement`);
* the schedule entry (component, phase, blocks, calls per block) is compared across ranks (a hash,
  all-gathered) before its first timed block: a mismatch is a CbsiteError naming the component;
* a barrier precedes every timed block, so the blocks of all ranks start together;
* the statement is the existing one (`ComponentMeasurement.rotation`), timed by `blocks.timed_block`,
  summarised by `blocks.summarise`; FLOPs and bytes by `counting.count`; collectives by
  `CollectiveMode`, in the same untimed counting run.

Contended blocks are kept and left out of the median as in `time_fn`, but lockstep never pauses for a
quiet machine (one rank waiting alone would desynchronise the others); a row with too few clean blocks
is flagged instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils.benchmark import Timer

from cbsite.collector.counting import count
from cbsite.collector.distributed.collectives import CollectiveMode, Traffic
from cbsite.collector.measure import ComponentMeasurement, PhaseResult, per_call, phase_peak
from cbsite.collector.timing.blocks import (
    MIN_BLOCKS,
    Timing,
    TimingConfig,
    before_block,
    stmt_seconds,
    summarise,
    timed_block,
)
from cbsite.collector.timing.contention import WaitProbe
from cbsite.errors import CbsiteError

MAX_NUMBER = 2**20


class Agreement:
    """Rank 0's decisions broadcast, schedules compared, barriers: the lockstep primitives."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        # nccl moves CUDA tensors only; gloo CPU ones.
        self.device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
        self.collective_s = 0.0  # wall seconds spent in agreement collectives (the price of lockstep)

    def _timed(self, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        try:
            return fn()
        finally:
            self.collective_s += time.perf_counter() - start

    def decide(self, values: list[float]) -> list[float]:
        """Rank 0's `values`, on every rank."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        self._timed(lambda: self.dist.broadcast(t, src=0))
        return t.cpu().tolist()

    def barrier(self) -> None:
        self._timed(self.dist.barrier)

    def gather(self, obj: Any) -> list[Any]:
        """`obj` of every rank, on every rank (rank order)."""
        out: list[Any] = [None] * self.world
        self._timed(lambda: self.dist.all_gather_object(out, obj))
        return out

    def verify(self, what: str, entry: Any) -> None:
        """The same `entry` on every rank, or a CbsiteError naming `what` and each rank's entry."""
        digest = hashlib.sha256(json.dumps(entry, sort_keys=True, default=str).encode()).hexdigest()[:16]
        seen = self.gather((digest, entry))
        if len({d for d, _ in seen}) > 1:
            listed = "; ".join(f"rank {r}: {e}" for r, (_, e) in enumerate(seen))
            raise CbsiteError(
                f"the ranks disagree on the lockstep schedule at {what} ({listed}); every rank must build the same "
                "model with the same sharding plan and options (same cbsite, torch and torchrec on every node)"
            )


@dataclass
class LockstepResult:
    result: PhaseResult
    traffic: Traffic
    wall_s: float  # wall seconds of the whole lockstep measurement of this component and phase


def _agreed_number(agree: Agreement, timer: Timer, target_s: float) -> tuple[int, float]:
    """Calls per block, grown as `blocks.block_size` grows it, each step decided by rank 0's clock."""
    number = 1
    while True:
        per_stmt = stmt_seconds(timer, number)
        done, nxt, rank0_per_stmt = agree.decide([
            float(per_stmt * number >= target_s or number >= MAX_NUMBER),
            float(min(MAX_NUMBER, max(number * 2, int(number * target_s / max(per_stmt * number, 1e-9) * 1.05)))),
            per_stmt,
        ])
        if done:
            return number, rank0_per_stmt
        number = int(nxt)


def time_statement(agree: Agreement, label: str, stmt: Callable[[], Any], calls: int, cfg: TimingConfig) -> Timing:
    """Time `stmt` (`calls` calls of the thing measured) on every rank at once: warm-up, calls per block and
    blocks decided by rank 0, the entry compared across ranks, a barrier before every block."""
    for _ in range(cfg.warmup):
        stmt()
    timer = Timer(stmt="fn()", globals={"fn": stmt}, num_threads=cfg.num_threads)
    number, per_stmt = _agreed_number(agree, timer, cfg.block_s())
    block_s = max(per_stmt * number, 1e-9)
    wanted = max(MIN_BLOCKS, math.ceil(cfg.min_run_time / block_s))
    n_blocks = int(agree.decide([max(MIN_BLOCKS, min(wanted, int(cfg.cap_s() / block_s)))])[0])
    agree.verify(label, [label, n_blocks, number, calls])
    blocks = []
    probe = WaitProbe()
    step = before_block(stmt)  # a statement that rotates batches between blocks
    for i in range(n_blocks):
        step(i, n_blocks)  # same index and count on every rank: any forward it runs is in step too
        agree.barrier()
        blocks.append(timed_block(timer, number, calls, probe))
    median, p25, p75, used, flagged = summarise(blocks)
    agree.barrier()
    cpu_ms = sum(b.cpu_s for b in used) / max(1, sum(b.calls for b in used)) * 1e3  # read around the blocks
    notes = [f"lockstep: {n_blocks} blocks of {number} runs agreed by rank 0, a barrier before each block"]
    if flagged:
        notes.append(f"contended: {sum(b.contended for b in blocks)} of {len(blocks)} timed blocks waited for a CPU; "
                     "lockstep cannot pause for a quiet machine, so this latency includes waiting")
    return Timing(median_ms=median * 1e3, p25_ms=p25 * 1e3, p75_ms=p75 * 1e3, samples=sum(b.calls for b in used),
                  cpu_time_ms=cpu_ms, device_time_ms=None, timed_s=sum(b.seconds_per_call * b.calls for b in blocks),
                  blocks=blocks, contended_blocks=sum(b.contended for b in blocks), flagged=flagged, notes=notes)


def measure(agree: Agreement, label: str, measurement: ComponentMeasurement, phase: str, cfg: TimingConfig) -> LockstepResult:
    """Time `phase` of a communicating component on every rank at once (see the module docstring).

    Raises NothingToDifferentiate on every rank alike (the structure is the same on every rank).
    """
    started = time.perf_counter()
    calls = measurement.calls_per_batch
    stmt = measurement.rotation(phase)  # backward: one forward per batch, on every rank
    replay = measurement.replay(phase)
    with CollectiveMode() as mode:
        _, counts = count(replay)
    # A collective has no FLOP formula by definition: it is communication, reported in its own columns.
    counts = dataclasses.replace(counts, unsupported_ops=[op for op in counts.unsupported_ops if not op.startswith("c10d")])
    timing = time_statement(agree, f"{label} {phase}", stmt, calls, cfg)
    peak = phase_peak(cfg.device, replay)
    result = PhaseResult(timing, per_call(counts, calls), peak, timing.notes)
    return LockstepResult(result, mode.traffic.scaled(calls), time.perf_counter() - started)
