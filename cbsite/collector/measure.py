"""Measure one component alone, from its captured calls: forward and backward, timed and counted.

Timing follows the design's rules: warm-up, then `torch.utils.benchmark.Timer.blocked_autorange`
(it synchronises CUDA and sizes the number of runs); latency is the median of the timed blocks with
their IQR kept. Counting (FLOPs, bytes, memory) runs in a separate, untimed pass, because dispatch
modes and profilers add microseconds per op.

Backward is timed without its forward: the forward runs once with inputs requiring grad exactly as in
the full model, then `torch.autograd.grad(outputs, wrt, grad_outputs, retain_graph=True)` is timed with
fixed seeded grad_outputs. `autograd.grad` returns gradients instead of accumulating them into `.grad`,
so every timed iteration does identical work and nothing has to be cleared inside the timed region.
"""

from __future__ import annotations

import collections
import collections.abc
import dataclasses
import functools
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Collection

import torch
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils.benchmark import Timer

from cbsite.collector.capture import Call, Rider, describe, is_state, tensors_in
from cbsite.collector.contention import WaitProbe, contended, wait_for_quiet
from cbsite.collector.counting import Counts, count, count_on_shapes
from cbsite.collector.cpu_memory import cpu_peak
from cbsite.collector.device import normal_values
from cbsite.collector.memory import cache_bytes, trimmed_if_left


class NothingToDifferentiate(Exception):
    """Backward is not applicable: no output requires grad or nothing to take a gradient for."""


def used_up(call: Call) -> str | None:
    """Why a call cannot be replayed because an input is an iterator (a generator, `iter(list)`), or None: the model's
    own call used it up, so every replay would see it empty and count nothing (0 FLOPs "measured")."""
    leaves = pytree.tree_leaves((call.args, call.kwargs))
    found = next((x for x in leaves if isinstance(x, collections.abc.Iterator) and not isinstance(x, torch.Tensor)), None)
    if found is None:
        return None
    return (f"an input is a {type(found).__name__}, an iterator: the model's call used it up, so a replay would see "
            "it empty; pass this module a list or tuple to measure it (its children are measured)")


class StateNotReplayable(Exception):
    """The component's inputs hold state that could not be copied at the call and has changed (capture.Call
    state_problem): every replay would run on a state the model never had, so the component is not measured."""


@dataclass(frozen=True)
class Block:
    """One timed block: the raw sample that samples.parquet keeps (medians are derived from these)."""

    seconds_per_call: float
    calls: int  # calls of the component inside the block
    start_s: float  # wall-clock start (epoch seconds)
    wait_s: float  # seconds this process's threads waited for a CPU during the block
    contended: bool
    cpu_s: float = 0.0  # CPU seconds of the whole process (all intra-op threads) during the block


@dataclass
class Timing:
    median_ms: float
    p25_ms: float
    p75_ms: float
    samples: int
    cpu_time_ms: float
    device_time_ms: float | None
    timed_s: float = 0.0  # wall seconds spent inside timed blocks (the floor of any collector)
    blocks: list[Block] = field(default_factory=list)
    contended_blocks: int = 0
    flagged: bool = False  # too few uncontended blocks: the latency includes waiting for a CPU
    cut_short: bool = False  # the per-component cap ended timing before the budget was spent
    notes: list[str] = field(default_factory=list)
    quiet_wait_s: float = 0.0  # wall seconds spent waiting for a quiet machine (not timing)
    warm_up_s: float = 0.0  # wall seconds of untimed calls before the first block
    sizing_s: float = 0.0  # wall seconds finding how many calls make a block (block_size)


@dataclass
class PhaseResult:
    timing: Timing
    counts: Counts
    peak_memory_bytes: int
    notes: list[str] = field(default_factory=list)
    # Wall seconds of the phase's untimed passes: "counting" (FLOPs and bytes), "memory_peaks" (the
    # allocator pass), "backward_graphs" (the forwards that build the graphs a backward is timed on).
    untimed_s: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class TimingConfig:
    min_run_time: float = 0.1  # seconds of uncontended timed blocks per component and phase
    # Untimed calls before a statement's first block, for statements timed cold (the step, a session worker); a
    # component's counting and peak passes are its warm-up (time_fn's `warm_s`).
    warmup: int = 3
    num_threads: int = 1
    device: str = "cpu"
    # Wall seconds one component and phase may take in timing, re-measurement included; past it the
    # row keeps what it has and says it was cut short. None: 20x the budget, at least 5 s.
    max_component_s: float | None = None
    # How long to wait for a quiet machine when blocks keep waiting for a CPU (per wait; at most 3).
    quiet_wait_s: float = 5.0
    # Bytes of extra backward graphs a component may hold at once to rotate batches (None: no bound).
    # Past it the graphs are built one at a time, batch by batch between blocks (measure.GraphCycle).
    graph_allowance_bytes: int | None = None

    def cap_s(self) -> float:
        return self.max_component_s if self.max_component_s is not None else max(5.0, 20 * self.min_run_time)

    def block_s(self) -> float:
        """Target seconds of one timed block: about budget/20, so contention is seen block by block."""
        return max(MIN_BLOCK_S, self.min_run_time / BLOCKS_PER_BUDGET)


MIN_BLOCKS = 5
BLOCKS_PER_BUDGET = 20  # a block is about budget / 20 long, so contention is seen block by block
MIN_BLOCK_S = 1e-3
MAX_QUIET_WAITS = 3


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# A component whose nearest measured ancestor's statement of a phase ran under this is counted on a real run, not first
# on fake tensors: a run that short (its own is part of its ancestor's) costs less than a pass on shapes, which pays per
# op for making and tracking fake tensors, and which a value-dependent op sends to a real run anyway. The counts are
# the same either way (count_on_shapes stands only where they are).
REAL_COUNT_BELOW_S = 0.01


IN_BLOCK_WARMUP_FROM = 20  # statements per block from which Timer's own warm-up costs at most 10 % of a block


def in_block_warmup(number: int) -> int:
    """Untimed statements before a block of `number`, as `Timer.timeit(number)` runs them (max(number // 100, 2)),
    where they cost at most a tenth of the block; none below IN_BLOCK_WARMUP_FROM. With one call per block (a
    component of a second or more) that in-block warm-up tripled what every block cost (measured: 40 s of timed_block
    calls for 13 s inside timed blocks, nanoGPT small at 16 x 256); time_fn warms each statement up once, before its
    first block."""
    return max(number // 100, 2) if number >= IN_BLOCK_WARMUP_FROM else 0


def stmt_seconds(timer: Timer, number: int, warm: int | None = None) -> float:
    """Seconds per statement of one run of `number` statements, as `Timer.timeit(number)` measures it (its
    clock synchronises an accelerator; its thread count), after `warm` untimed statements (None:
    in_block_warmup(number), Timer's own rule where it costs at most a tenth of the block)."""
    warm = in_block_warmup(number) if warm is None else warm
    ready_inputs(timer, warm + number)
    if not hasattr(timer, "_timeit"):
        return timer.timeit(number).times[0]
    from torch.utils.benchmark.utils.common import set_torch_threads

    with set_torch_threads(timer._task_spec.num_threads):
        if warm:
            timer._timeit(warm)
        return timer._timeit(number) / number


def ready_inputs(timer: Timer, statements: int) -> None:
    """Before the clocks start: a statement that takes fresh inputs per call (FreshInputs) has them made for the next
    `statements` runs, so the timed region holds the component's own work, not the copies."""
    prepare = getattr(_statement(timer), "prepare", None)
    if prepare is not None:
        prepare(statements)


def _statement(timer: Timer) -> Any:
    """The callable a Timer built here runs (`Timer(stmt="fn()", globals={"fn": fn})`), or None."""
    return getattr(timer, "_globals", {}).get("fn")


def max_calls(fn: Any) -> int:
    """Statements a block may hold: a statement with fresh inputs per call holds its copies for a whole block, within
    its pool's limit (FreshInputs, pool_limit)."""
    return int(getattr(fn, "max_calls", 2**30))


def sized_block(timer: Timer, target_s: float, calls_per_stmt: int = 1, probe: WaitProbe | None = None,
                first: int = 1, warm: int | None = None) -> tuple[int, Block]:
    """Statements per block so that one block lasts about `target_s` (at least one), and the run that found it.

    Runs of `first`, then more, statements until one lasts `target_s`: that run is timed as `timed_block` times a
    block (same statement, same count, wait and CPU read around it), so a caller keeps it as its first block
    instead of throwing a block's worth of runs away. `first`: a guess from a call already timed (a warm-up). `warm`:
    Timer's in-block warm-up before the first run (None: as timed_block does; 0 where the statement just ran)."""
    most = max(1, min(2**30, max_calls(_statement(timer))))
    number = max(1, min(most, first))
    while True:
        block = timed_block(timer, number, calls_per_stmt, probe, warm)
        warm = 0
        wall = block.seconds_per_call * block.calls
        if wall >= SIZED_WITHIN * target_s or number >= most:
            return number, block
        # A tenth over, as first_guess: a statement still warming runs faster at the next run.
        number = min(most, max(number * 2, int(number * target_s / max(wall, 1e-9) * 1.1)))


# A sizing run within a tenth of the block's target is a block: "about budget/20" is what a block is. A run just short
# of the target was doubled, and that third run was the block (benchmarks/collect_scale.py, "sizing" column).
SIZED_WITHIN = 0.9


def block_size(timer: Timer, target_s: float, first: int = 1) -> int:
    """Calls of the statement per block so that one block lasts about `target_s` (at least one call); `first`: a
    guess to start from (first_guess)."""
    return sized_block(timer, target_s, first=first)[0]


def first_guess(seconds_per_stmt: float, target_s: float) -> int:
    """Statements per block a call of `seconds_per_stmt` suggests, a tenth over so that the first run at it is likely
    long enough (a warm-up call runs slower than the calls after it, a peak pass under the profiler much slower)."""
    return max(1, int(1.1 * target_s / seconds_per_stmt)) if seconds_per_stmt > 0 else 1


class WarmRatios:
    """How fast statements ran in their sizing run against the untimed run just before them (their warm call, or the
    peak pass or twin statement that stood as one), over this process's last few sizings, by kind of run before.

    A warm call is the first plain call after a pass under the profiler, and runs slower than the calls that follow
    it; a peak pass runs under the profiler, slower still. A first guess taken from either at face value started the
    sizing well short of a block, and a run after it was the block (benchmarks/collect_scale.py, "sizing" column). The
    guess is scaled by the median ratio seen (1 before any), never below half: a statement that does not speed up
    after its first call (a sleep, a call that streams from memory) then runs at most twice a block in its sizing,
    whatever the statements before it did. Only a guess, which the sizing run checks.
    """

    KEEP = 15
    LOWEST = 0.5

    def __init__(self) -> None:
        self.seen: dict[str, list[float]] = {}

    def ratio(self, kind: str) -> float:
        seen = self.seen.get(kind)
        return min(2.0, max(self.LOWEST, statistics.median(seen))) if seen else 1.0

    def note(self, kind: str, before_s: float, stmt_s: float) -> None:
        if before_s > 0 and stmt_s > 0:
            seen = self.seen.setdefault(kind, [])
            seen.append(stmt_s / before_s)
            del seen[:-self.KEEP]


WARM_RATIOS = WarmRatios()


def timed_block(timer: Timer, number: int, calls_per_stmt: int, probe: WaitProbe | None = None,
                warm: int | None = None) -> Block:
    """Time `number` statements once; note how long this process waited for a CPU meanwhile, and
    its CPU time (outside `timeit`, so the timed region is the Timer's alone). `warm` untimed statements run first
    (None: in_block_warmup(number)), before the block's clocks start: their CPU time was read as the block's, up to a
    tenth more than its calls took. A block right after one of the same statement needs none (time_fn passes 0)."""
    probe = probe or WaitProbe()
    warm = in_block_warmup(number) if warm is None else warm
    ready_inputs(timer, warm + number)  # fresh inputs, where the statement takes them, before the clocks start
    if warm:
        stmt_seconds(timer, warm, warm=0)
    start = time.time()
    probe.start()
    cpu0 = time.process_time()
    per_stmt = stmt_seconds(timer, number, warm=0)
    cpu = time.process_time() - cpu0
    wall = per_stmt * number
    wait = probe.stop(wall)
    return Block(per_stmt / calls_per_stmt, number * calls_per_stmt, start, wait, contended(wait, wall), cpu)


def warm_up(fn: Callable[[], Any], cfg: TimingConfig) -> float:
    """Up to `cfg.warmup` untimed calls (at least one when asked for any), stopping early once warm-up has
    taken the budget: a component that runs for a second is warm after one call, and three would triple
    what its warm-up costs. Returns the seconds of the last call (0.0 without warm-up)."""
    last, spent = 0.0, 0.0
    for _ in range(cfg.warmup):
        t0 = time.perf_counter()
        fn()
        _sync(cfg.device)
        last = time.perf_counter() - t0
        spent += last
        if spent >= cfg.min_run_time:
            break
    return last


def before_block(fn: Callable[[], Any]) -> Callable[[int, int], bool | None]:
    """The statement's own step before each timed block (a GraphCycle moves to the next batch), or nothing.
    Called with (block index, blocks expected); a true result says the statement now runs on other data."""
    return getattr(fn, "before_block", None) or (lambda index, expected: None)


def expected_blocks(cfg: TimingConfig, block_seconds: float) -> int:
    """Blocks time_fn will likely take: enough clean ones to hold the budget, at least MIN_BLOCKS."""
    return max(MIN_BLOCKS, math.ceil(cfg.min_run_time / max(block_seconds, 1e-9)))


def summarise(blocks: list[Block]) -> tuple[float, float, float, list[Block], bool]:
    """Median and quartiles (seconds per call) of the uncontended blocks, or of all when too few are.

    Returns (median, p25, p75, blocks used, flagged).
    """
    good = [b for b in blocks if not b.contended]
    flagged = len(good) < min(MIN_BLOCKS, len(blocks))
    used = blocks if flagged else good
    times = sorted(b.seconds_per_call for b in used)
    if len(times) >= 2:
        q = statistics.quantiles(times, n=4, method="inclusive")
        return statistics.median(times), q[0], q[2], used, flagged
    return times[0], times[0], times[0], used, flagged


def _waited_words(share: float) -> str:
    """The run-queue wait of a process's threads against the blocks' wall time, in words. Every thread counts
    (contention.run_queue_wait_s), so several waiting at once can add up to more than the wall time (a sharded
    run's communication threads once read "220% of their time")."""
    if share <= 1.0:
        return f"{share:.0%} of their time"
    return f"its threads waited {share:.1f}x the blocks' wall time between them"


def time_fn(fn: Callable[[], Any], calls_per_stmt: int, cfg: TimingConfig, warm_s: float | None = None) -> Timing:
    """Time `fn` (which makes `calls_per_stmt` calls of the component) and return per-call figures.

    Blocks of about budget/20 are timed with `Timer.timeit` until at least MIN_BLOCKS uncontended blocks
    hold the budget. A block whose threads waited for a CPU (contention.py) is kept as a sample but not
    used for the median; when blocks keep waiting, timing pauses until the machine is quiet (up to
    MAX_QUIET_WAITS times). If too few clean blocks remain, the row is flagged instead of silently
    reporting the waiting. Every block is kept for samples.parquet.
    """
    started = time.perf_counter()
    # `warm_s`: how long the untimed run just before took: the peak pass (after a counting pass, real or on shapes),
    # or for a twin one statement of the twin timed just before it (the same code on the same shapes). Where that run
    # outlasted a block it stands as the warm-up: it ran the same kernels on the same shapes, so what one more call
    # would warm (lazy initialisation, the allocator's cached blocks) is warm, and a statement that long streams most
    # of its data from memory on every call anyway. For GPT-2 small's blocks at 2 x 128 such a call came before five
    # one-call blocks; at 8 x 512 they were 60 s of warm-up calls, before the rule took the budget as its threshold
    # (it now takes a block). A shorter statement gets one plain call: the profiler's dispatch leaves its plain path
    # cold (on dlrm medium, first blocks over 5 % slower than the rest of theirs: 25 % without it, 19 % with it).
    # benchmarks/row_medians.py compares every row's median with and without the long statements' call (README
    # "Memory and scale").
    t_warm = time.perf_counter()
    called = True
    if warm_s is None:
        last_warm = warm_up(fn, cfg)
    elif warm_s >= cfg.block_s() or cfg.warmup == 0:
        last_warm, called = warm_s, False
    else:
        last_warm = warm_up(fn, dataclasses.replace(cfg, warmup=1))
    t_sizing = time.perf_counter()
    if not called:  # no warm-up call: none is recorded (a microsecond of bookkeeping is not a warm-up)
        t_warm = t_sizing
    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=cfg.num_threads)
    probe = WaitProbe()
    blocks: list[Block] = []
    step = before_block(fn)
    # A statement whose warm call already outlasts a block needs no sizing runs: one call per block. Otherwise the
    # sizing's last run, a block long, is the first block (a block's worth of runs per phase was thrown away). Without
    # a warm call the run before (a peak pass under the profiler, a twin's statement) only suggests the size: the
    # sizing's first run, of one statement where that run outlasted a block, says it, and is kept as the first block.
    # A warm call that long may have been slowed (a preemption, a first use), not the statement: the first one-call
    # block says, and a statement far shorter than a block is sized after all (below). A statement that must run one
    # call per block runs so whatever it takes.
    forced = one_call_per_block(fn)
    check_first = False  # is the first one-call block to be checked against the warm call that chose it?
    if forced or (called and last_warm >= cfg.block_s()):
        number, block_seconds, check_first = 1, max(cfg.block_s(), last_warm), not forced
    else:
        step(0, MIN_BLOCKS)  # as every block is prepared (a graph cycle's first batch: nothing to do)
        kind = "warm call" if called else "run before"
        guess = first_guess(last_warm * WARM_RATIOS.ratio(kind), cfg.block_s())
        number, first = sized_block(timer, cfg.block_s(), calls_per_stmt, probe, guess)
        WARM_RATIOS.note(kind, last_warm, first.seconds_per_call * calls_per_stmt)
        blocks.append(first)
        block_seconds = first.seconds_per_call * first.calls
    warm_up_s, sizing_s = t_sizing - t_warm, time.perf_counter() - t_sizing - sum(b.seconds_per_call * b.calls for b in blocks)
    expected = expected_blocks(cfg, max(cfg.block_s(), block_seconds))
    waits, since_wait, cut_short, quiet_wait = 0, 0, False, 0.0
    # A block right after a block of the same statement is warm: Timer's in-block warm-up statements only where nothing
    # ran it just before (the first block), the statement moved to another batch's graph (a graph cycle's
    # before_block says so), or after a wait for a quiet machine.
    warm_next = not blocks
    while True:
        changed = step(len(blocks), expected)
        block = timed_block(timer, number, calls_per_stmt, probe, None if warm_next or changed else 0)
        warm_next = False
        if check_first and block.seconds_per_call * block.calls < cfg.block_s() / 2:
            # The warm call misled: a matmul of microseconds whose warm call outlasted a block under a busy neighbour
            # ran blocks of one call until the cap. This block is a sizing run, and the block size comes from it.
            t0 = time.perf_counter()
            number, block = sized_block(timer, cfg.block_s(), calls_per_stmt, probe,
                                        first_guess(block.seconds_per_call * calls_per_stmt, cfg.block_s()), warm=0)
            sizing_s += time.perf_counter() - t0 - block.seconds_per_call * block.calls
            expected = expected_blocks(cfg, max(cfg.block_s(), block.seconds_per_call * block.calls))
        check_first = False
        blocks.append(block)
        good = [b for b in blocks if not b.contended]
        if len(good) >= MIN_BLOCKS and sum(b.seconds_per_call * b.calls for b in good) >= cfg.min_run_time:
            break
        if time.perf_counter() - started > cfg.cap_s():
            cut_short = len(good) < MIN_BLOCKS or sum(b.seconds_per_call * b.calls for b in good) < cfg.min_run_time
            break
        since_wait += block.contended
        if since_wait >= MIN_BLOCKS:
            if waits >= MAX_QUIET_WAITS:
                break  # the machine stayed busy: keep what there is and flag it
            waits, since_wait = waits + 1, 0
            t0 = time.perf_counter()
            wait_for_quiet(min(cfg.quiet_wait_s, max(0.0, cfg.cap_s() - (time.perf_counter() - started))))
            quiet_wait += time.perf_counter() - t0
            warm_next = True
    median, p25, p75, used, flagged = summarise(blocks)
    n_contended = sum(b.contended for b in blocks)
    notes = []
    if flagged:
        waited = sum(b.wait_s for b in used) / max(1e-12, sum(b.seconds_per_call * b.calls for b in used))
        notes.append(
            f"contended: {n_contended} of {len(blocks)} timed blocks waited for a CPU ({_waited_words(waited)}) "
            f"and the machine did not become quiet; this latency includes waiting"
        )
    if cut_short:
        notes.append(f"cut short: timing stopped at the {cfg.cap_s():.3g} s per-component cap with {len(blocks)} blocks")
    per_call = 1e3
    # CPU time of the whole process (all intra-op threads) during the blocks the median uses: beside the
    # wall latency it shows how parallel the component runs. Read around each block, so it costs no runs.
    cpu_ms = sum(b.cpu_s for b in used) / max(1, sum(b.calls for b in used)) * per_call
    device_ms = None
    if cfg.device.startswith("cuda"):
        # Device time from CUDA events over a short loop outside the blocks.
        loops = max(1, min(sum(b.calls for b in blocks) // calls_per_stmt,
                           int(cfg.min_run_time / 4 / max(median * calls_per_stmt, 1e-9))))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ready_inputs(timer, loops)
        start.record()
        for _ in range(loops):
            fn()
        end.record()
        torch.cuda.synchronize()
        device_ms = start.elapsed_time(end) / loops / calls_per_stmt
    return Timing(
        median_ms=median * per_call,
        p25_ms=p25 * per_call,
        p75_ms=p75 * per_call,
        samples=sum(b.calls for b in used),
        cpu_time_ms=cpu_ms,
        device_time_ms=device_ms,
        timed_s=sum(b.seconds_per_call * b.calls for b in blocks),
        blocks=blocks,
        contended_blocks=n_contended,
        flagged=flagged,
        cut_short=cut_short,
        notes=notes,
        quiet_wait_s=quiet_wait,
        warm_up_s=warm_up_s,
        sizing_s=sizing_s,
    )


def phase_peak(device: str, fn: Callable[[], Any], excluded: Callable[[], Collection[int]] | None = None) -> int:
    """Peak bytes the phase allocates in one run of batch 0, from the allocator itself: CUDA's peak
    statistics, or on CPU the profiler's allocation events (not the census: see cpu_memory.py). `excluded` (CPU
    only): the live blocks the run made that are not the phase's (cpu_memory.cpu_peak)."""
    if device.startswith("cuda"):
        if excluded is not None:
            raise ValueError("CUDA's peak statistics cannot leave allocations out: no rider on CUDA")
        return _cuda_peak(fn)
    return cpu_peak(fn, excluded)


def _timed_peak(device: str, fn: Callable[[], Any], excluded: Callable[[], Collection[int]] | None = None) -> tuple[int, float]:
    """`phase_peak` and the wall seconds its (profiled, so slightly slower) run took."""
    t0 = time.perf_counter()
    peak = phase_peak(device, fn, excluded)
    return peak, time.perf_counter() - t0


def _cuda_peak(fn: Callable[[], Any]) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def _mutated_inputs(module: nn.Module, call: Call) -> bool:
    """Does the module write into its inputs (an in-place activation, say)?"""
    args, kwargs = call.replay_inputs(with_grad=False)
    leaves = tensors_in((args, kwargs))
    before = [t._version for t in leaves]
    with torch.no_grad():
        module(*args, **kwargs)
    return any(t._version != v for t, v in zip(leaves, before))


INPLACE_NOTE = "in-place module"
PLUGIN_RUNS = 4  # fresh inputs made up front for a plugin's runs of a forward that changes its inputs


def _input_notes(batches: list[list[Call]], inplace: bool) -> list[str]:
    """How the component's inputs were replayed, where that is not plain clones of tensors."""
    notes = []
    if inplace:
        notes.append(f"{INPLACE_NOTE}: each timed call writes into its own fresh copy of the inputs, made before "
                     "the timed block (the block times the op as the model runs it, not the copy)")
    calls = [c for b in batches for c in b if c.stateful]
    kinds = ", ".join(sorted({type(x).__name__ for c in calls for x in pytree.tree_leaves((c.args, c.kwargs))
                              if is_state(x)}))
    by_reference = sorted({c.state_error for c in calls if c.state_error is not None})
    if by_reference:
        notes.append(f"inputs hold state that cannot be copied ({by_reference[0]}): replayed on the live object, "
                     "which neither the call nor the rest of the forward changed")
    elif any(c.state_changed is not False for c in calls):
        notes.append(f"stateful inputs ({kinds}): the call changes them, so every run replays its own copy of the "
                     "state as it was at the call, made before the timed block")
    elif calls:
        notes.append(f"inputs hold objects ({kinds}): replayed from a copy made at the call, which the call does not "
                     "change")
    return notes


Graph = tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]  # (roots, grad_outputs, wrt)


@dataclass(frozen=True)
class Known:
    """What an identical component's counting and peak passes found (twins.py): they stand for this one's."""

    counts: Counts  # per call
    peak: int
    source: str  # the twin's path
    # Seconds of one timed statement of the twin timed just before (twins.Source.statement_s): the same code on
    # the same shapes ran for this long right before, so time_fn treats it as this one's warm-up, as it does a
    # component's own counting and peak passes.
    warm_s: float = 0.0

    def note(self) -> str:
        return (f"FLOPs, bytes moved and peak memory counted on its twin {self.source or '<root>'} (same modules, "
                "parameters and input shapes, no value-dependent op); timed on its own inputs")


def _grad(graph: Graph) -> Any:
    roots, grads, wrt = graph
    return torch.autograd.grad(roots, wrt, grads, retain_graph=True, allow_unused=True)


class GraphCycle:
    """The backward statement when the graphs of every batch would not fit in memory together: one
    graph at a time, the batches taken in turn between timed blocks instead of call by call.

    Each batch gets a run of consecutive blocks (expected blocks / batches, rounded up: five blocks on two batches
    are three and two, one graph built between them, not two and two and a last one that builds batch 0's again);
    the graph of the next batch is built (untimed, `build_s`) only after the previous one is freed, so the component
    holds one graph, as a training step does. A component this large streams its working set from memory on every
    call, so whether consecutive calls see the same batch does not change what is cached.
    """

    def __init__(self, build: Callable[[int], Graph], batches: int, first: Graph, index: int = 0) -> None:
        self.build = build
        self.batches = batches
        self.index = index  # the batch of `first` (a graph the forward phase left, ComponentMeasurement.held)
        self.start = index  # the turn starts there
        self.graph: Graph | None = first
        self.switches = 0
        self.build_s = 0.0  # untimed seconds spent building graphs between blocks

    def __call__(self) -> Any:
        return _grad(self.graph)

    def before_block(self, index: int, expected: int) -> bool:
        """Move to the batch block `index` takes; True where that is another graph than the last block's."""
        per_batch = max(1, math.ceil(expected / self.batches))
        wanted = (index // per_batch + self.start) % self.batches
        if wanted == self.index:
            return False
        t0 = time.perf_counter()
        self.graph = None  # freed first: never two graphs at once
        self.graph = self.build(wanted)
        self.build_s += time.perf_counter() - t0
        self.index = wanted
        self.switches += 1
        return True


def one_call_per_block(fn: Callable[[], Any]) -> bool:
    """Must every timed block of `fn` be one call, prepared by its before_block (FreshGraphs)?"""
    return bool(getattr(fn, "one_call_per_block", False))


def _grad_freeing(graph: Graph) -> Any:
    roots, grads, wrt = graph
    return torch.autograd.grad(roots, wrt, grads, allow_unused=True)


class FreshGraphs:
    """The backward statement of a component whose graph saves more activations than the collection's allowance
    (the root of GPT-2 small at 8 x 512): every call differentiates a graph of its own without `retain_graph`, so the
    saved activations are freed as backward goes, as a training step frees them. A retained graph keeps them
    all through backward: GPT-2 small at 4 x 256 held 1.64 GiB more with it, 1.32 GiB freeing, against 1.07 GiB
    for a plain step (benchmarks/backward_memory.py), and the root's retained graph set the peak of the whole
    collection at 8 x 512.

    A graph is used once, so a block is one call and its graph is built (untimed) just before it, the batches
    taken in turn; time_fn and hierarchy.remeasure keep one call per block for it (`one_call_per_block`). A
    component this large runs for far longer than a block, so it had one call per block anyway.
    """

    one_call_per_block = True

    def __init__(self, build: Callable[[int], Graph], batches: int, first: tuple[int, Graph] | None = None) -> None:
        self.build = build
        self.batches = batches
        self.graph: Graph | None = None
        self.built = 0
        if first is not None:  # a graph the forward phase left (ComponentMeasurement.held): the first block's
            self.built, self.graph = first[0] + 1, first[1]
        self.build_s = 0.0  # untimed seconds spent building graphs between blocks

    def _ready(self) -> None:
        if self.graph is None:
            self.graph = self.build(self.built % self.batches)
            self.built += 1

    def __call__(self) -> Any:
        self._ready()  # only outside timed blocks (a warm-up call): before_block built the graph of a timed one
        graph, self.graph = self.graph, None
        return _grad_freeing(graph)

    def before_block(self, index: int, expected: int) -> None:
        t0 = time.perf_counter()
        self._ready()
        self.build_s += time.perf_counter() - t0


@dataclass
class Replay:
    """One run's inputs of every call of a batch: `inputs` (fresh copies, the leaves a backward differentiates for),
    the grad mode of each call, and `given`, what the module is called with: the inputs themselves, or for an in-place
    module with grad, copies of the leaves that require grad (autograd refuses to write into a leaf that does)."""

    inputs: list[tuple[tuple[Any, ...], dict[str, Any]]]
    modes: list[bool]
    given: list[tuple[tuple[Any, ...], dict[str, Any]]]


class FreshInputs:
    """Inputs for a forward statement whose calls change them (an in-place module writes into its input; a cache
    grows): each run takes a copy of its own, as the captured call had it, from a pool made before each timed block
    (`prepare`, called by timed_block and stmt_seconds before the clocks start), so a block times the component as
    the model runs it, and no copy. A run outside a block (a warm-up) makes its own.

    The pool holds at most `limit_bytes` of copies (`pool_limit`: half the core's own cache), so a block holds at most
    `max_calls` statements (sized_block): the copies made just before it are still in that cache, as the model's input
    to an in-place op is, its producer having just written it; a larger input is one call per block on a copy just
    made, in cache as far as the producer's output would be. Two 8 MiB copies made before the block ran an in-place
    ReLU 3x slower than in place on a 32 MiB L3 (the first was evicted by the second); one ran as fast."""

    def __init__(self, make: Callable[[int], Replay], batches: int, snapshot: Any, limit_bytes: int) -> None:
        self.make = make
        self.batches = batches
        self.made = 0
        self.pool: collections.deque[tuple[int, Replay]] = collections.deque()
        # Copies a run has used, let go at the next `prepare`: freeing them (an in-place op's output is its input; a
        # large one is unmapped) is not the component's work, and inside a block it was timed.
        self.used: list[tuple[int, Replay]] = []
        self.prepare(1)
        self.max_calls = max(1, limit_bytes // max(1, _new_bytes(self.pool[0][1], snapshot)))

    def prepare(self, runs: int) -> None:
        self.used.clear()
        while len(self.pool) < runs:
            index = self.made % self.batches
            self.pool.append((index, self.make(index)))
            self.made += 1

    def next(self) -> tuple[int, Replay]:
        if not self.pool:
            self.prepare(1)
        self.used.append(self.pool.popleft())
        return self.used[-1]


@functools.cache
def pool_limit(device: str) -> int:
    """Bytes of fresh inputs a FreshInputs pool may hold: half the cache a CPU core has to itself (its L2, from
    sysfs), or half a GPU's L2."""
    if device.startswith("cuda"):
        return cache_bytes(torch.device(device)) // 2
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in sorted(os.listdir(base)):
            with open(f"{base}/{entry}/level") as f:
                level = f.read().strip()
            with open(f"{base}/{entry}/type") as f:
                kind = f.read().strip()
            with open(f"{base}/{entry}/size") as f:
                size = f.read().strip().upper()
            if level == "2" and kind in ("Unified", "Data") and size.endswith("K"):
                return int(size[:-1]) * 1024 // 2
    except (OSError, ValueError):
        pass
    return 256 * 1024


def _new_bytes(replay: Replay, snapshot: Any) -> int:
    """Bytes a replay's copies allocate: its tensors' storages that are not the snapshot's (a state tensor nothing
    writes into is shared with it)."""
    def storages(obj: Any) -> dict[int, int]:
        out = {}
        for t in tensors_in(obj):
            try:
                out[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            except (RuntimeError, NotImplementedError):
                out[id(t)] = t.numel() * t.element_size()
        return out

    kept = storages(snapshot)
    return sum(n for ptr, n in storages((replay.inputs, replay.given)).items() if ptr not in kept)


class GradOutputs:
    """The fixed seeded `grad_outputs` of backward graphs: per batch, standard normal values drawn in order from a
    generator seeded with the batch's index, shaped as the graph's outputs (past device.NORMAL_TILE values, the drawn
    ones repeat: `device.normal_values`).

    Drawing normal values is slow next to most of the work they serve (GPT-2 small's logits at 8 x 512 are 8 x 512 x
    50257 = 206 M of them per graph), and a collection draws the same ones again and again: a component's graphs of one batch, and its twins' (GPT-2's 12
    blocks, and everything in them, have outputs of the same shapes). `limit_bytes` > 0 keeps those drawn, up to that
    many bytes, for the rest of the collection; the values are the same either way (autograd only reads them)."""

    def __init__(self, limit_bytes: int = 0) -> None:
        self.limit_bytes = limit_bytes
        self.kept: dict[tuple[Any, ...], list[torch.Tensor]] = {}
        self.kept_bytes = 0

    def of(self, roots: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
        from torch._subclasses.fake_tensor import FakeTensor

        if any(isinstance(r, FakeTensor) for r in roots):
            # A graph of fake tensors (counting on shapes) gets fake values, never kept: a real graph of the same shapes
            # given them would run fake tensors through meta kernels (a tiny Mixtral's `_grouped_mm` backward).
            gen = torch.Generator(device=roots[0].device).manual_seed(seed)
            return [normal_values(r.shape, r.dtype, r.device, gen) for r in roots]
        key = (seed, tuple((tuple(r.shape), r.dtype, str(r.device)) for r in roots))
        if key in self.kept:
            return self.kept[key]
        gen = torch.Generator(device=roots[0].device).manual_seed(seed)
        grads = [normal_values(r.shape, r.dtype, r.device, gen) for r in roots]
        size = sum(g.numel() * g.element_size() for g in grads)
        if self.kept_bytes + size <= self.limit_bytes:
            self.kept[key] = grads
            self.kept_bytes += size
        return grads


class ComponentMeasurement:
    """Replays one module's captured calls (several batches in rotation) for each phase."""

    def __init__(self, module: nn.Module, batches: list[list[Call]], cfg: TimingConfig,
                 graph_bytes: int | None = None, saved_bytes: int | None = None,
                 grad_outputs: GradOutputs | None = None) -> None:
        self.module = module
        self.grad_outputs = grad_outputs or GradOutputs()
        self.batches = [b for b in batches if b]
        self.cfg = cfg
        # Bytes autograd saves in one forward of this component (the capture's census), for the
        # decision between holding every batch's graph and building them one at a time.
        self.graph_bytes = graph_bytes
        # Of those, what autograd saved (activations): what a backward that frees its graph lets go as it goes.
        self.saved_bytes = saved_bytes
        self.calls_per_batch = len(self.batches[0])
        # In-place modules as the capture saw them in the full model (free); a replay only where it did not watch.
        problems = [p for b in self.batches for c in b if (p := used_up(c) or c.state_problem()) is not None]
        if problems:
            raise StateNotReplayable(problems[0])
        seen = [c.mutates_inputs for c in self.batches[0]]
        self.inplace = any(seen) if None not in seen else _mutated_inputs(module, self.batches[0][0])
        # Inputs that hold state the call changes (a cache grows): every run takes a copy of its own, as of the call,
        # made before any timed block, as an in-place module's inputs are (FreshInputs). Where it was not watched
        # (state_changed None), it is taken to.
        self.stateful = any(c.stateful and c.state_changed is not False for b in self.batches for c in b)
        self.fresh_per_call = self.inplace or self.stateful
        self.notes = _input_notes(self.batches, self.inplace)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.static = list(module.parameters()) + list(module.buffers())
        # Set by the collector when backward is measured right after forward with nothing in between (no
        # plugin replays): the forward phase then leaves the graphs its own runs built for backward to take
        # (`held`), instead of backward building them again with forwards of its own (one per graph: 58 s of
        # GPT-2 small's collection at 8 x 512, two of them the whole model's).
        self.hold_graphs = False
        self.held: dict[int, Graph] = {}  # batch index -> a graph the forward phase's runs built
        # Backward's counts, peak and untimed seconds, taken on the forward peak pass's graph before forward was
        # timed: for a component that frees its graphs, which cannot hold that graph through forward's timing.
        self.early_backward: tuple[Counts, int, dict[str, float]] | None = None
        self.holding_s = 0.0  # seconds forward spent making the graphs it leaves (their grad_outputs): backward's graphs
        # Phases counted on a real run straight away (set by the collector where the nearest measured ancestor's
        # statement of that phase ran under REAL_COUNT_BELOW_S): the run is cheaper than the same pass on fake tensors.
        self.count_real: set[str] = set()
        # Set by the collector for the whole model on CPU (capture.Rider): the next capture group's inputs of batch 0
        # are captured during forward's peak pass, a forward that runs anyway, instead of in a forward of their own.
        self.rider: Rider | None = None

    def input_shapes(self) -> str:
        call = self.batches[0][0]
        return describe((call.args, call.kwargs))

    def _run(
        self, call_inputs: list[tuple[tuple[Any, ...], dict[str, Any]]], grad_modes: list[bool], module: nn.Module | None = None
    ) -> list[Any]:
        """Call the module on each call's inputs as given (Replay.given): a run that changes them (in place, or a
        cache) must have been given its own (`_replay`, FreshInputs)."""
        module = module if module is not None else self.module
        outs = []
        for (args, kwargs), grad in zip(call_inputs, grad_modes):
            with torch.set_grad_enabled(grad):
                outs.append(module(*args, **kwargs))
        return outs

    def _replay(self, batch: list[Call], grad: bool | None = None) -> Replay:
        """Fresh inputs of every call of `batch` (capture.Call.replay_inputs: state objects copied from the snapshot),
        in each call's grad mode, or `grad` for all."""
        modes = [c.grad_enabled if grad is None else grad for c in batch]
        inputs = [c.replay_inputs(with_grad=m) for c, m in zip(batch, modes)]
        given = inputs
        if self.inplace:
            # Autograd refuses an in-place write into a leaf that requires grad: the module gets a copy (an input the
            # model had computed, as in the full model), made here, before any timing.
            given = [pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) and x.requires_grad else x, i)
                     if m else i for i, m in zip(inputs, modes)]
        return Replay(inputs, modes, given)

    def replay(self, phase: str, module: nn.Module | None = None) -> Callable[[], Any]:
        """One untimed run of `phase` on batch 0 (every call of the component), for profiler plugins.

        Inputs (and, for backward, the forward graph) are prepared here, before the callable is
        returned, so a profiler wrapped around it sees only the component's own work. `module`
        replaces the component (e.g. its compiled form) with the same inputs.
        """
        batch = self.batches[0]
        if phase == "forward":
            if self.fresh_per_call:
                # Each run on its own inputs: a few made now, outside whatever the plugin wraps around the runs.
                source = FreshInputs(lambda i: self._replay(batch), 1, [(c.args, c.kwargs) for c in batch],
                                     pool_limit(self.cfg.device))
                source.prepare(PLUGIN_RUNS)

                def fresh_run() -> list[Any]:
                    run = source.next()[1]
                    return self._run(run.given, run.modes, module)

                fresh_run.prepare = source.prepare  # type: ignore[attr-defined]  # a plugin that times it (time_fn)
                fresh_run.max_calls = source.max_calls  # type: ignore[attr-defined]
                return fresh_run
            run = self._replay(batch)
            return lambda: self._run(run.given, run.modes, module)
        roots, grads, wrt = self._graph(batch, seed=0, module=module)
        return lambda: torch.autograd.grad(roots, wrt, grads, retain_graph=True, allow_unused=True)

    def rotation(self, phase: str, graphs: list[Any] | None = None, freeing: bool | None = None,
                 one_graph: bool = False, keep_last: bool = False,
                 keep_batches: Collection[int] = ()) -> Callable[[], Any]:
        """The timed statement of `phase`: one run of every call of batch i, cycling through the batches.

        Inputs (and for backward the forward graphs, one per batch) are prepared once, here, so the
        statement holds only the component's own work. The session's workers time the same statement.
        `keep_last` (forward): the statement keeps its last run's outputs (`statement.last`: batch index, inputs,
        grad modes, outputs), so that the graph that run built can serve backward. Each run lets the previous
        one's outputs go before it starts, as each run let its own go at its end before: a timed block still
        frees as many outputs as it makes, and never holds two.
        `keep_batches` (forward, with `keep_last`): also the last run of each of these batches (`statement.last`
        "every": batch index -> the run), where backward holds a graph of every batch anyway: a run on such a batch
        lets that batch's previous run go, so a block still frees as many outputs as it makes, and the statement holds
        one run per batch, what backward's rotation holds.
        """
        state = {"i": 0}
        if phase == "forward":
            source: FreshInputs | None = None
            if self.fresh_per_call:
                # Calls that change their inputs: each run on a copy of its own, made before the timed block.
                source = FreshInputs(lambda i: self._replay(self.batches[i]), len(self.batches),
                                     [(c.args, c.kwargs) for b in self.batches for c in b], pool_limit(self.cfg.device))
                next_run = source.next
            else:
                prepared = [self._replay(batch) for batch in self.batches]

                def next_run() -> tuple[int, Replay]:
                    index = state["i"] % len(prepared)
                    state["i"] += 1
                    return index, prepared[index]

            def forward_fn() -> None:
                run = next_run()[1]
                self._run(run.given, run.modes)

            last: dict[str, Any] = {}
            every: dict[int, Any] = {}
            last["every"] = every

            def forward_keeping() -> None:
                last.pop("run", None)
                index, run = next_run()
                every.pop(index, None)
                last["run"] = (index, run.inputs, run.modes, self._run(run.given, run.modes))
                if index in keep_batches:
                    every[index] = last["run"]

            statement = forward_keeping if keep_last else forward_fn
            if keep_last:
                forward_keeping.last = last  # type: ignore[attr-defined]
            if source is not None:
                statement.prepare = source.prepare  # type: ignore[attr-defined]
                statement.max_calls = source.max_calls  # type: ignore[attr-defined]
            return statement
        # `freeing`: the caller's choice (a comparison times both arms alike), else this component's own.
        if graphs is None and (self.frees_graphs() if freeing is None else freeing):
            return FreshGraphs(lambda i: self._graph(self.batches[i], seed=i), len(self.batches))
        # `one_graph`: hold one graph at a time even where every batch's would fit (a re-measurement times a
        # parent and its child interleaved, so both are held at once).
        if graphs is None and (one_graph or not self.graphs_fit()) and len(self.batches) > 1:
            return GraphCycle(lambda i: self._graph(self.batches[i], seed=i), len(self.batches), self._graph(self.batches[0], seed=0))
        graphs = graphs or [self._graph(batch, seed=i) for i, batch in enumerate(self.batches)]

        def backward_fn() -> None:
            roots, grads, wrt = graphs[state["i"] % len(graphs)]
            state["i"] += 1
            torch.autograd.grad(roots, wrt, grads, retain_graph=True, allow_unused=True)

        return backward_fn

    def forward(self, known: Known | None = None) -> PhaseResult:
        """Count, take the allocator peak, then time. `known`: an identical component's counts and peak
        (twins.py), which stand for this one's; its passes are then replaced by one plain warm-up call, or none
        where the twin's statement timed just before outlasted a block (`Known.warm_s`). With `hold_graphs`, the graphs
        these runs build are left for backward (`held`, `early_backward`)."""
        notes = list(self.notes)
        if known is not None:
            statement = self.rotation("forward", keep_last=self.hold_graphs, keep_batches=self._keep_batches())
            timing = time_fn(statement, self.calls_per_batch, self.cfg, warm_s=known.warm_s)
            self._hold_last(statement)
            return PhaseResult(timing, known.counts, known.peak, notes + [known.note()] + timing.notes, _around(timing))
        # Each pass on inputs of its own where a call changes them (a counting pass on shapes leaves fake tensors in a
        # cache it grew); otherwise the passes share one set.
        first = self._replay(self.batches[0])
        runs = [first, self._replay(self.batches[0]), self._replay(self.batches[0])] if self.fresh_per_call else [first] * 3
        t0 = time.perf_counter()
        counts = (None if "forward" in self.count_real else
                  count_on_shapes(lambda: None, lambda _: self._run(runs[0].given, runs[0].modes), self.module.modules()))
        if counts is None:  # the output (and its graph) is let go at once
            counts = _counted_for_real(lambda: self._run(runs[1].given, runs[1].modes))
        counting_s = time.perf_counter() - t0
        # The allocator peak of one call, then timing, warmed by it (and by a real counting pass, where there was one).
        # The peak pass's outputs are kept only where backward takes their graph.
        outs: list[Any] = []
        first_inputs, first_modes = runs[2].inputs, runs[2].modes
        peak_pass = lambda: outs.append(self._run(runs[2].given, runs[2].modes))  # noqa: E731
        rider, self.rider = self.rider, None
        if rider is None:
            peak, peak_s = _timed_peak(self.cfg.device, peak_pass)
        else:  # its clones are not the component's: left out of the peak
            peak, peak_s = _timed_peak(self.cfg.device, rider.around(peak_pass), excluded=rider.storages)
        if self.hold_graphs:
            self._hold_peak_graph(self._left_graph(first_inputs, first_modes, outs.pop(), seed=0))
        outs.clear()
        runs.clear()  # the passes' copies are let go before timing
        # Made after the peak pass: a batch whose graph that pass left (`held`) is not kept again.
        statement = self.rotation("forward", keep_last=self.hold_graphs, keep_batches=self._keep_batches())
        timing = time_fn(statement, self.calls_per_batch, self.cfg, warm_s=peak_s)
        self._hold_last(statement)
        return PhaseResult(timing, per_call(counts, self.calls_per_batch), peak, notes + timing.notes,
                           {"counting": counting_s, "memory_peaks": peak_s, **_around(timing)})

    def _hold_peak_graph(self, graph: Graph | None) -> None:
        """Batch 0's graph from the forward peak pass. Held through forward's timing (beside the graph each timed run
        builds) only where backward holds a graph per batch anyway (several batches, within the allowance): a
        component replayed on batch 0 alone would hold two graphs where its backward holds one, and GPT-2 small's root
        at 2 x 128, which sets the collection's peak, did (0.1 GiB more). There forward's last timed run leaves batch
        0's graph instead (`_hold_last`). A component that frees its graphs (past the allowance) takes its backward
        counting and peak pass on this graph now, before forward is timed (`early_backward`)."""
        if graph is None:
            return
        if not self.frees_graphs():
            if len(self.batches) > 1 and self.graphs_fit():
                self.held[0] = graph
            return
        t0 = time.perf_counter()
        shaped = self._backward_on_shapes(_grad_freeing)
        counting_s = time.perf_counter() - t0
        if shaped is None:
            return  # counted for real in backward, which uses a graph of its own up
        peak, peak_s = _timed_peak(self.cfg.device, lambda: _grad_freeing(graph))
        self.early_backward = (per_call(shaped, self.calls_per_batch), peak, {"counting": counting_s, "memory_peaks": peak_s})

    def _keep_batches(self) -> set[int]:
        """The batches whose last timed forward run is kept for backward (`rotation(keep_batches=...)`): every batch
        not held yet where backward holds a graph of every batch (they fit together, and are retained, not freed)."""
        if not self.hold_graphs or self.frees_graphs() or not self.graphs_fit():
            return set()
        return set(range(len(self.batches))) - set(self.held)

    def _hold_last(self, statement: Callable[[], Any]) -> None:
        """The graphs of forward's timed runs, held for backward where they add a batch backward needs and the
        graphs held stay within what backward itself would hold: the last run of every batch kept (`_keep_batches`),
        else the last run's. Where its graphs do not fit together it holds one at a time: any batch's where
        backward's counting and peak pass are done (`early_backward`), else batch 0's, which they take (another
        batch's would be held while they build batch 0's)."""
        last = getattr(statement, "last", {})
        run = last.pop("run", None)
        every = last.pop("every", {})
        runs = sorted(every.values()) if every else ([run] if run is not None else [])
        del run, every
        one_at_a_time = self.frees_graphs() or not self.graphs_fit()
        for index, inputs, modes, outs in runs:
            if index in self.held or (one_at_a_time and index != 0 and self.early_backward is None):
                continue
            graph = self._left_graph(inputs, modes, outs, seed=index)
            if graph is not None:
                self.held[index] = graph

    def _left_graph(self, inputs: list[tuple[tuple[Any, ...], dict[str, Any]]], modes: list[bool], outs: list[Any],
                    seed: int) -> Graph | None:
        """`_graph_of` a run forward made, its seconds (drawing grad_outputs) counted as backward's graph time."""
        t0 = time.perf_counter()
        graph = self._graph_of(inputs, modes, outs, seed)
        self.holding_s += time.perf_counter() - t0
        return graph

    def _backward_on_shapes(self, differentiate: Callable[[Graph], Any]) -> Counts | None:
        """Backward's counts of batch 0 on a graph of fake tensors (counting.count_on_shapes), or None."""
        return count_on_shapes(lambda: self._graph(self.batches[0], seed=0), differentiate, self.module.modules())

    def _graph_of(self, inputs: list[tuple[tuple[Any, ...], dict[str, Any]]], modes: list[bool], outs: list[Any],
                  seed: int) -> Graph | None:
        """(outputs to differentiate, their grad_outputs, tensors to differentiate for) of a run's calls with grad
        enabled, or None where there is nothing to differentiate. Seeded per batch: the same graph `_graph` builds."""
        live = [(i, o) for i, m, o in zip(inputs, modes, outs) if m]
        leaves = [t for t in tensors_in([i for i, _ in live]) if t.requires_grad]
        roots = [t for t in tensors_in([o for _, o in live]) if t.requires_grad and t.grad_fn is not None]
        wrt = leaves + self.params
        if not roots or not wrt:
            return None
        return roots, self.grad_outputs.of(roots, seed), wrt

    def _graph(
        self, batch: list[Call], seed: int, module: nn.Module | None = None
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """Forward once with grad: (outputs to differentiate, their grad_outputs, tensors to differentiate for).

        Only the calls the full model made with grad enabled: a call under `torch.no_grad()` has no backward.
        """
        batch = [c for c in batch if c.grad_enabled]
        if not batch:
            raise NothingToDifferentiate(
                "every captured call ran with grad disabled (torch.no_grad or inference mode), so the model "
                "runs no backward through it"
            )
        run = self._replay(batch, grad=True)
        outs = self._run(run.given, run.modes, module)
        graph = self._graph_of(run.inputs, run.modes, outs, seed)
        if graph is None:
            roots = [t for t in tensors_in(outs) if t.requires_grad and t.grad_fn is not None]
            raise NothingToDifferentiate("no output requires grad" if not roots else "no input or parameter requires grad")
        return graph

    def graphs_fit(self) -> bool:
        """May the backward graphs of every batch be held at once (within the allowance)?"""
        allowance = self.cfg.graph_allowance_bytes
        if allowance is None or self.graph_bytes is None or len(self.batches) < 2:
            return True
        return (len(self.batches) - 1) * self.graph_bytes <= allowance

    def frees_graphs(self) -> bool:
        """Are the activations one graph of this component saved past the allowance? Then backward is timed as a
        training step runs it, freeing them as it goes (FreshGraphs), not on a retained graph. Only the saved
        activations count: freeing does not let go of the outputs and their gradients, which were most of GPT-2
        small's root graph at 2 x 128 (freeing there cost 2.5 s and saved nothing: 1.21x a plain step either way)."""
        allowance = self.cfg.graph_allowance_bytes
        return allowance is not None and self.saved_bytes is not None and self.saved_bytes > allowance

    def backward(self, known: Known | None = None) -> PhaseResult:
        """As `forward`, on graphs built from the captured inputs (one per batch, one at a time, or a fresh one
        per call for a component whose graph is past the allowance)."""
        fresh = self.frees_graphs()
        differentiate = _grad_freeing if fresh else _grad
        held, self.held = self.held, {}  # graphs the forward phase's runs built (hold_graphs), by batch
        early, self.early_backward = self.early_backward, None
        untimed = {"backward_graphs": self.holding_s}
        self.holding_s = 0.0
        notes = [n for n in self.notes if not n.startswith(INPLACE_NOTE)]
        build = lambda i: self._graph(self.batches[i], seed=i)  # noqa: E731

        def batch0_graph() -> Graph:
            if 0 in held:
                return held.pop(0)
            t0 = time.perf_counter()
            built = build(0)
            untimed["backward_graphs"] += time.perf_counter() - t0
            return built

        graph: Graph | None = None
        index = 0
        if known is not None or early is not None:
            if known is not None:
                counts, peak, peak_s = known.counts, known.peak, None
                notes.append(known.note())
            else:
                # Its peak pass ran before forward was timed; it stands as the warm-up as a peak pass does elsewhere: a
                # component past the allowance streams its working set from memory on every call, so what forward's
                # timing did to the caches in between changes nothing a warm-up call would.
                counts, peak, early_untimed = early
                peak_s = early_untimed["memory_peaks"]
                untimed.update(early_untimed)
            # The first block's graph: one the forward phase left, else batch 0's (whose build also says whether there
            # is anything to differentiate; a twin's freeing timing would build its own, but not that).
            if held:
                index = min(held)
                graph = held.pop(index)
            elif not (fresh and early is not None):
                graph = batch0_graph()
        else:
            # The first graph serves the counting and peak passes and the first batch's timing.
            graph = batch0_graph()
            t1 = time.perf_counter()
            # On shapes where they stand for a real run (counting.count_on_shapes): a graph of fake tensors, which also
            # leaves the real one for the peak pass.
            shaped = None if "backward" in self.count_real else self._backward_on_shapes(differentiate)
            counts = per_call(shaped or _counted_for_real(lambda: differentiate(graph)), self.calls_per_batch)
            untimed["counting"] = time.perf_counter() - t1
            if fresh and shaped is None:  # the counting pass used the graph up: another for the peak pass, the first let go first
                graph = None
                graph = batch0_graph()
            # The allocator peak of one call, before timing: a graph cycle may hold
            # another batch's graph once timing ends.
            peak, peak_s = _timed_peak(self.cfg.device, lambda: differentiate(graph))
            untimed["memory_peaks"] = peak_s
            if fresh:  # used up by the peak pass; a graph the forward phase left serves the first block
                graph = None
                if held:
                    index = min(held)
                    graph = held.pop(index)
        if fresh:
            statement: Callable[[], Any] = FreshGraphs(build, len(self.batches), None if graph is None else (index, graph))
            graph = None
            notes.append(
                f"backward timed as a training step runs it: each call on a graph of its own, freed as it goes; the "
                f"activations one graph saves ({self.saved_bytes / 2**20:,.0f} MiB) are past the collection's allowance "
                f"of {self.cfg.graph_allowance_bytes / 2**20:,.0f} MiB for holding graphs"
            )
        elif self.graphs_fit():
            graphs: list[Graph | None] = [held.pop(i, None) for i in range(len(self.batches))]
            graphs[index] = graph
            t0 = time.perf_counter()
            graphs = [g if g is not None else build(i) for i, g in enumerate(graphs)]
            untimed["backward_graphs"] += time.perf_counter() - t0
            statement = self.rotation("backward", graphs)
            del graphs
        else:
            statement = GraphCycle(build, len(self.batches), graph, index)
            notes.append(
                f"backward graphs built one batch at a time (rotation batch by batch between blocks): the graphs "
                f"of {len(self.batches)} batches would hold {len(self.batches) * self.graph_bytes / 2**20:,.0f} MiB "
                f"at once, past the collection's allowance of {self.cfg.graph_allowance_bytes / 2**20:,.0f} MiB"
            )
        held.clear()
        del graph
        if known is not None:
            peak_s = known.warm_s
        timing = time_fn(statement, self.calls_per_batch, self.cfg, warm_s=peak_s)
        untimed["backward_graphs"] += getattr(statement, "build_s", 0.0)
        untimed.update(_around(timing))
        del statement
        live = sum(c.grad_enabled for c in self.batches[0])
        if live < self.calls_per_batch:
            notes.append(
                f"backward of {live} of {self.calls_per_batch} calls per forward (the others ran with grad disabled); "
                "figures are per call over all of them"
            )
        dense_tables = [
            m for m in self.module.modules()
            if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and not m.sparse and m.weight.requires_grad
        ]
        if dense_tables:
            rows = sum(m.num_embeddings for m in dense_tables)
            notes.append(
                f"dense embedding gradient: backward writes whole tables ({rows} rows), not just the rows looked up"
            )
        return PhaseResult(timing, counts, peak, notes + timing.notes, untimed)


def _counted_for_real(fn: Callable[[], Any]) -> Counts:
    """`count` of a real run of `fn`, its result let go at once; as after a peak pass (cpu_memory.cpu_peak), a run
    that left more than memory.TRIM_LEFT_BYTES resident has its freed heap handed back before timing allocates
    beside it."""
    with trimmed_if_left():
        return count(fn)[1]


def _around(timing: Timing) -> dict[str, float]:
    """The untimed work around a phase's timed blocks, for run.json's breakdown."""
    return {"warm_up": timing.warm_up_s, "block_sizing": timing.sizing_s}


def per_call(counts: Counts, calls: int) -> Counts:
    """Counts of one call from those of `calls` calls."""
    if calls == 1:
        return counts
    return Counts(
        flops=counts.flops // calls,
        bytes_moved=counts.bytes_moved // calls,
        unsupported_ops=counts.unsupported_ops,
        flops_by_op={k: v // calls for k, v in counts.flops_by_op.items()},
        op_calls=counts.op_calls,
        value_dependent=counts.value_dependent,
        matmul_calls=counts.matmul_calls,  # a ceiling is a ratio of sums: all calls of the batch, undivided
        undescribed_matmuls=counts.undescribed_matmuls,
        on_shapes=counts.on_shapes,
    )
