"""The GPU device time's control flow (cbsite/collector/timing/gpu_time.py), on a simulated CUDA stream: CI has no GPU,
and the `gpu` tests run only where one is lent. The stream runs its work in order; the host's clock advances as it
launches; an event's time is when the stream reaches it."""

from __future__ import annotations

import pytest

from cbsite.collector.timing import gpu_time


class Stream:
    """One CUDA stream and the host's clock, in seconds."""

    def __init__(self, launch_s: float) -> None:
        self.launch_s = launch_s  # host seconds to launch one kernel
        self.host = 0.0
        self.free = 0.0  # when the stream has run everything queued so far

    def enqueue(self, seconds: float) -> float:
        """Queue `seconds` of work; returns when the stream finishes it."""
        self.host += self.launch_s
        self.free = max(self.free, self.host) + seconds
        return self.free

    def synchronize(self) -> None:
        self.host = max(self.host, self.free)


class Simulated:
    """What gpu_time uses of torch.cuda, on a Stream: events, _sleep and synchronize."""

    CYCLES_PER_S = 1.5e9

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        sim = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.at: float | None = None

            def record(self) -> None:
                self.at = sim.stream.enqueue(0.0)

            def query(self) -> bool:
                return self.at is not None and self.at <= sim.stream.host

            def synchronize(self) -> None:
                sim.stream.host = max(sim.stream.host, self.at or 0.0)

            def elapsed_time(self, end: "Event") -> float:
                return (end.at - self.at) * 1e3

        self.Event = Event

    def _sleep(self, cycles: int) -> None:
        self.stream.enqueue(cycles / self.CYCLES_PER_S)

    def synchronize(self) -> None:
        self.stream.synchronize()


@pytest.fixture
def stream(monkeypatch):
    def make(launch_s: float) -> Stream:
        s = Stream(launch_s)
        monkeypatch.setattr(gpu_time, "torch", type("T", (), {"cuda": Simulated(s)}))
        monkeypatch.setattr(gpu_time.time, "perf_counter", lambda: s.host)
        monkeypatch.setattr(gpu_time, "_cycles_per_s", None)
        return s
    return make


def _statement(s: Stream, kernels: int, kernel_s: float, syncs: bool = False):
    calls = []

    def fn() -> None:
        calls.append(1)
        for _ in range(kernels):
            s.enqueue(kernel_s)
        if syncs:  # a statement that reads a value back (.item()) waits for the stream
            s.synchronize()
    return fn, calls


def _wall(launch_s: float, kernels: int, kernel_s: float) -> float:
    """The statement's wall time in the blocks: launching, or the GPU's work where that is longer."""
    return max(launch_s, kernel_s) * kernels


@pytest.mark.parametrize("launch_s,kernels,kernel_s", [(30e-6, 1, 10e-6), (30e-6, 10, 2e-6), (5e-6, 1, 500e-6),
                                                     (5e-6, 3, 0.3)])
def test_device_time_is_the_kernels_back_to_back_whatever_the_launch_cost(stream, launch_s, kernels, kernel_s):
    s = stream(launch_s)
    fn, _ = _statement(s, kernels, kernel_s)
    got = gpu_time.device_time(fn, lambda n: None, _wall(launch_s, kernels, kernel_s), 10_000, 1, budget_s=0.025)
    assert not got.late
    assert got.ms_per_call == pytest.approx(kernels * kernel_s * 1e3, rel=1e-6)


def test_a_statement_that_waits_for_the_gpu_is_kept_and_marked_late(stream):
    s = stream(30e-6)
    fn, calls = _statement(s, 1, 10e-6, syncs=True)
    got = gpu_time.device_time(fn, lambda n: None, 40e-6, 10_000, 1, budget_s=0.025)
    assert got.late  # its launch gaps are in the figure: an upper bound, which the row's notes say
    assert got.ms_per_call > 10e-6 * 1e3


def test_measurements_stay_within_the_budget(stream):
    s = stream(5e-6)
    fn, calls = _statement(s, 1, 0.3)  # a statement of 0.3 s: one loop of one call, once, within a 25 ms budget
    gpu_time.device_time(fn, lambda n: None, 0.3, 10_000, 1, budget_s=0.025)
    assert len(calls) == 1
    fn, calls = _statement(s, 1, 10e-6)  # 10 µs statements: five loops of about 2 ms
    gpu_time.device_time(fn, lambda n: None, 10e-6, 10_000, 1, budget_s=0.025)
    assert len(calls) == 5 * int(gpu_time.WINDOW_S / 10e-6)


def test_a_sleep_too_short_for_the_queuing_is_taken_again_longer(stream):
    """The blocks' wall time understated the queuing (the host slowed down after them): the first sleep ends before
    the loop is queued, and the measurement is taken again behind a longer one."""
    s = stream(100e-6)
    fn, _ = _statement(s, 1, 10e-6)
    got = gpu_time.device_time(fn, lambda n: None, 20e-6, 10_000, 1, budget_s=0.025)
    assert not got.late and got.ms_per_call == pytest.approx(10e-6 * 1e3, rel=1e-6)


def test_a_rank_of_a_sharded_run_measures_as_the_cpu_feeds_the_loop(stream):
    """Ranks would each sleep for their own length, and a collective in the loop would wait for the others' sleeps:
    without the sleep the figure has the launch gaps in it, and says so."""
    s = stream(30e-6)
    fn, _ = _statement(s, 1, 10e-6)
    got = gpu_time.device_time(fn, lambda n: None, 30e-6, 10_000, 1, budget_s=0.025, sleep_ahead=False)
    assert got.late and got.ms_per_call == pytest.approx(30e-6 * 1e3, rel=0.05)  # the launches, not the 10 µs kernels
