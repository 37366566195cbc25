"""Time one statement in blocks: the raw samples of a latency, each about budget/20 long, so contention is seen
block by block.

A block is `number` runs of a statement under `torch.utils.benchmark.Timer` (it synchronises CUDA and sets the thread
count), with the run-queue wait and CPU time of this process read around it (contention.py). `time_fn` warms the
statement up, sizes its blocks, then takes blocks until enough uncontended ones hold the budget: latency is their
median with the IQR kept; a contended block stays a sample but leaves the median, and when blocks keep waiting the
timing pauses for a quiet machine.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils.benchmark import Timer

from cbsite.bound import DEVICE_IDLE
from cbsite.collector.timing.contention import WaitProbe, contended, quiet_wait_s, wait_for_quiet
from cbsite.collector.timing.gpu_time import device_time, sleep_ahead_allowed


@dataclass(frozen=True)
class Block:
    """One timed block: the raw sample that samples.parquet keeps (medians are derived from these)."""

    seconds_per_call: float
    calls: int  # calls of the component inside the block
    start_s: float  # wall-clock start (epoch seconds)
    wait_s: float  # seconds this process's threads waited for a CPU during the block
    contended: bool
    cpu_s: float = 0.0  # CPU seconds of the whole process (all intra-op threads) during the block


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
    quiet_wait_s: float = field(default_factory=quiet_wait_s)
    # Bytes of extra backward graphs a component may hold at once to rotate batches (None: no bound).
    # Past it the graphs are built one at a time, batch by batch between blocks (graphs.GraphCycle).
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


IN_BLOCK_WARMUP_FROM = 20  # statements per block from which Timer's own warm-up costs at most 10 % of a block


def in_block_warmup(number: int) -> int:
    """Untimed statements before a block of `number`, as `Timer.timeit(number)` runs them (max(number // 100, 2)),
    where they cost at most a tenth of the block; none below IN_BLOCK_WARMUP_FROM. With one call per block (a
    component of a second or more) that in-block warm-up would triple what every block costs; time_fn warms each
    statement up once, before its first block."""
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
# of the target would be doubled into a third run (benchmarks/collect_scale.py, "sizing" column).
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


def one_call_per_block(fn: Callable[[], Any]) -> bool:
    """Must every timed block of `fn` be one call, prepared by its before_block (FreshGraphs)?"""
    return bool(getattr(fn, "one_call_per_block", False))


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


def _waited_words(share: float) -> str:
    """The run-queue wait of a process's threads against the blocks' wall time, in words. Every thread counts
    (contention.run_queue_wait_s), so several waiting at once can add up to more than the wall time (a sharded
    run's communication threads, say)."""
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
    last_warm, called, warm_up_s = _warm_call(fn, cfg, warm_s)
    t_sizing = time.perf_counter()
    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=cfg.num_threads)
    probe = WaitProbe()
    number, block_seconds, check_first, first = _first_size(fn, timer, probe, calls_per_stmt, cfg, last_warm, called)
    blocks: list[Block] = [first] if first is not None else []
    sizing_s = time.perf_counter() - t_sizing - sum(b.seconds_per_call * b.calls for b in blocks)
    loop = _BlockLoop(fn, timer, probe, calls_per_stmt, cfg, started, blocks, number, check_first)
    loop.run(block_seconds)
    median, p25, p75, used, flagged = summarise(blocks)
    n_contended = sum(b.contended for b in blocks)
    per_call = 1e3
    # CPU time of the whole process (all intra-op threads) during the blocks the median uses: beside the
    # wall latency it shows how parallel the component runs. Read around each block, so it costs no runs.
    cpu_ms = sum(b.cpu_s for b in used) / max(1, sum(b.calls for b in used)) * per_call
    notes = _timing_notes(blocks, used, flagged, loop.cut_short, cfg)
    device_ms = _device_ms(fn, timer, blocks, median, calls_per_stmt, cfg, notes) if cfg.device.startswith("cuda") else None
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
        cut_short=loop.cut_short,
        notes=notes,
        quiet_wait_s=loop.quiet_wait_s,
        warm_up_s=warm_up_s,
        sizing_s=sizing_s + loop.sizing_s,
    )


def _warm_call(fn: Callable[[], Any], cfg: TimingConfig, warm_s: float | None) -> tuple[float, bool, float]:
    """The untimed run before the first block: (its seconds, whether it was a warm-up call made here, the seconds of
    the warm-up calls made here).

    `warm_s`: how long the untimed run just before took: the peak pass (after a counting pass, real or on shapes), or
    for a twin one statement of the twin timed just before it (the same code on the same shapes). Where that run
    outlasted a block it stands as the warm-up: it ran the same kernels on the same shapes, so what one more call would
    warm (lazy initialisation, the allocator's cached blocks) is warm, and a statement that long streams most of its
    data from memory on every call anyway. A shorter statement gets one plain call: the profiler's dispatch leaves its
    plain path cold. benchmarks/row_medians.py compares every row's median with and without the long statements' call
    (README "Memory and scale")."""
    t0 = time.perf_counter()
    if warm_s is None:
        last = warm_up(fn, cfg)
    elif warm_s >= cfg.block_s() or cfg.warmup == 0:
        return warm_s, False, 0.0  # no warm-up call: none is recorded (a microsecond of bookkeeping is not a warm-up)
    else:
        last = warm_up(fn, dataclasses.replace(cfg, warmup=1))
    return last, True, time.perf_counter() - t0


def _first_size(fn: Callable[[], Any], timer: Timer, probe: WaitProbe, calls_per_stmt: int, cfg: TimingConfig,
                last_warm: float, called: bool) -> tuple[int, float, bool, Block | None]:
    """Statements per block, how long a block is expected to last, whether the first block is to be checked against
    the warm call that chose its size, and the sizing's last run, kept as the first block (None: no sizing ran).

    A statement whose warm call already outlasts a block needs no sizing runs: one call per block. Otherwise the
    sizing's last run, a block long, is the first block. Without a warm call the run before (a peak pass under the
    profiler, a twin's statement) only suggests the size: the sizing's first run, of one statement where that run
    outlasted a block, says it, and is kept as the first block. A warm call that long may have been slowed (a
    preemption, a first use), not the statement: the first one-call block says (`_BlockLoop`), and a statement far
    shorter than a block is sized after all. A statement that must run one call per block runs so whatever it takes."""
    forced = one_call_per_block(fn)
    if forced or (called and last_warm >= cfg.block_s()):
        return 1, max(cfg.block_s(), last_warm), not forced, None
    before_block(fn)(0, MIN_BLOCKS)  # as every block is prepared (a graph cycle's first batch: nothing to do)
    kind = "warm call" if called else "run before"
    guess = first_guess(last_warm * WARM_RATIOS.ratio(kind), cfg.block_s())
    number, first = sized_block(timer, cfg.block_s(), calls_per_stmt, probe, guess)
    WARM_RATIOS.note(kind, last_warm, first.seconds_per_call * calls_per_stmt)
    return number, first.seconds_per_call * first.calls, False, first


class _BlockLoop:
    """time_fn's blocks after sizing: taken until enough uncontended ones hold the budget, the per-component cap is
    reached, or the machine stayed busy through MAX_QUIET_WAITS waits for a quiet machine."""

    def __init__(self, fn: Callable[[], Any], timer: Timer, probe: WaitProbe, calls_per_stmt: int, cfg: TimingConfig,
                 started: float, blocks: list[Block], number: int, check_first: bool) -> None:
        self.fn, self.timer, self.probe, self.calls_per_stmt, self.cfg = fn, timer, probe, calls_per_stmt, cfg
        self.started, self.blocks, self.number = started, blocks, number
        self.check_first = check_first  # is the first one-call block to be checked against the warm call?
        self.cut_short = False
        self.quiet_wait_s = 0.0
        self.sizing_s = 0.0  # sizing after a misleading warm call (`_resize`)

    def run(self, block_seconds: float) -> None:
        cfg, blocks = self.cfg, self.blocks
        step = before_block(self.fn)
        expected = expected_blocks(cfg, max(cfg.block_s(), block_seconds))
        waits, since_wait = 0, 0
        # A block right after a block of the same statement is warm: Timer's in-block warm-up statements only where
        # nothing ran it just before (the first block), the statement moved to another batch's graph (a graph cycle's
        # before_block says so), or after a wait for a quiet machine.
        warm_next = not blocks
        while True:
            changed = step(len(blocks), expected)
            block = timed_block(self.timer, self.number, self.calls_per_stmt, self.probe,
                                None if warm_next or changed else 0)
            warm_next = False
            if self.check_first and block.seconds_per_call * block.calls < cfg.block_s() / 2:
                block = self._resize(block)
                expected = expected_blocks(cfg, max(cfg.block_s(), block.seconds_per_call * block.calls))
            self.check_first = False
            blocks.append(block)
            good = [b for b in blocks if not b.contended]
            held = sum(b.seconds_per_call * b.calls for b in good)
            if len(good) >= MIN_BLOCKS and held >= cfg.min_run_time:
                return
            if time.perf_counter() - self.started > cfg.cap_s():
                self.cut_short = len(good) < MIN_BLOCKS or held < cfg.min_run_time
                return
            since_wait += block.contended
            if since_wait >= MIN_BLOCKS:
                if waits >= MAX_QUIET_WAITS:
                    return  # the machine stayed busy: keep what there is and flag it
                waits, since_wait = waits + 1, 0
                self._wait_for_quiet()
                warm_next = True

    def _resize(self, block: Block) -> Block:
        """The warm call misled (a statement of microseconds whose warm call outlasted a block under a busy
        neighbour would run blocks of one call until the cap): this block is a sizing run, and the block size comes
        from it. Returns the sizing's last run, the block kept."""
        t0 = time.perf_counter()
        cfg = self.cfg
        self.number, block = sized_block(self.timer, cfg.block_s(), self.calls_per_stmt, self.probe,
                                         first_guess(block.seconds_per_call * self.calls_per_stmt, cfg.block_s()),
                                         warm=0)
        self.sizing_s += time.perf_counter() - t0 - block.seconds_per_call * block.calls
        return block

    def _wait_for_quiet(self) -> None:
        if self.cfg.quiet_wait_s <= 0:  # told never to wait (CBSITE_QUIET_WAIT_S=0): not even a probe
            return
        t0 = time.perf_counter()
        left = self.cfg.cap_s() - (time.perf_counter() - self.started)
        wait_for_quiet(min(self.cfg.quiet_wait_s, max(0.0, left)))
        self.quiet_wait_s += time.perf_counter() - t0


def _timing_notes(blocks: list[Block], used: list[Block], flagged: bool, cut_short: bool,
                  cfg: TimingConfig) -> list[str]:
    """What a row says about its timing: blocks that waited for a CPU in its median, a cut at the cap."""
    notes = []
    if flagged:
        n_contended = sum(b.contended for b in blocks)
        waited = sum(b.wait_s for b in used) / max(1e-12, sum(b.seconds_per_call * b.calls for b in used))
        notes.append(
            f"contended: {n_contended} of {len(blocks)} timed blocks waited for a CPU ({_waited_words(waited)}) "
            f"and the machine did not become quiet; this latency includes waiting"
        )
    if cut_short:
        notes.append(f"cut short: timing stopped at the {cfg.cap_s():.3g} s per-component cap with {len(blocks)} blocks")
    return notes


def _device_ms(fn: Callable[[], Any], timer: Timer, blocks: list[Block], median: float, calls_per_stmt: int,
               cfg: TimingConfig, notes: list[str]) -> float:
    """Device time per call: the GPU's own work, launch gaps left out (gpu_time.py), within a quarter of the budget;
    a row whose device works under half its latency is launch-bound, and its notes say so."""
    ahead = sleep_ahead_allowed()
    measured = device_time(fn, lambda n: ready_inputs(timer, n), median * calls_per_stmt,
                           max(1, sum(b.calls for b in blocks) // calls_per_stmt), calls_per_stmt, cfg.min_run_time / 4,
                           sleep_ahead=ahead)
    device_ms, latency_ms = measured.ms_per_call, median * 1e3
    if not ahead:
        return device_ms  # a rank of a sharded run: launch gaps in the figure by design (measuring.md), no row note
    if measured.late:
        notes.append("device time includes launch gaps: the host was still queuing calls when the GPU reached them")
    elif device_ms < DEVICE_IDLE * latency_ms:
        notes.append(f"launch-bound: the GPU works {device_ms * 1e3:.3g} µs of the {latency_ms * 1e3:.3g} µs per call; "
                     "the rest is the CPU launching kernels (eager mode)")
    return device_ms
