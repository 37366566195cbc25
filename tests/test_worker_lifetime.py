"""Every worker cbsite spawns dies with its parent, and no run is written after the parent is gone.

The OOM killer (or a CI runner) SIGKILLs the main process of `compare`, `collect --rounds` or `sweep` while a worker
measures: the worker must not go on measuring, saving runs, or holding the caller's stdout open (a CI step waits for
that pipe to close). Each case starts the real CLI, waits until its worker exists (found through /proc's children
lists), kills the parent outright and expects every process it had started gone, and its output pipe closed, within
10 s, and no run published after the kill.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cbsite.collector import clean_worker

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
GONE_WITHIN_S = 10.0


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        pass
    return out


def _descendants(pid: int) -> dict[int, str]:
    """pid -> command line of every process below `pid`."""
    found: dict[int, str] = {}
    todo = _children(pid)
    while todo:
        child = todo.pop()
        if child in found:
            continue
        try:
            found[child] = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        todo += _children(child)
    return found


def _workers(pid: int) -> list[int]:
    return [p for p, cmd in _descendants(pid).items() if "spawn_main" in cmd]


def _runs(root: Path) -> set[Path]:
    return {p.parent for p in root.glob("*/*/*/components.parquet")}


def _kill_parent_when(argv: list[str], tmp_path: Path, ready) -> tuple[dict[int, str], set[Path]]:
    """Start `cbsite ARGV`, wait until `ready(pid, output)`, SIGKILL it; return what it had started and the runs
    published by then. Asserts that all of those processes are gone and its output pipe closed within 10 s."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen([sys.executable, "-m", "cbsite", *argv], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    output: list[bytes] = []
    reader = threading.Thread(target=lambda: [output.append(line) for line in proc.stdout], daemon=True)
    reader.start()
    started: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 300
        while not ready(proc.pid, b"".join(output).decode(errors="replace")):
            assert proc.poll() is None, b"".join(output).decode(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "the worker never started: " + b"".join(output).decode(errors="replace")[-3000:]
            time.sleep(0.05)
        started = _descendants(proc.pid)
        published = _runs(tmp_path / "runs")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        killed_at = time.monotonic()
        while time.monotonic() - killed_at < GONE_WITHIN_S:
            if not any(clean_worker.process_alive(p) for p in started) and not reader.is_alive():
                break
            time.sleep(0.1)
        left = {p: cmd for p, cmd in started.items() if clean_worker.process_alive(p)}
        assert not left, f"still running {GONE_WITHIN_S:.0f} s after their parent was killed: {left}"
        reader.join(timeout=1)
        assert not reader.is_alive(), "a process still holds the killed command's output pipe"
        return started, published
    finally:
        if proc.poll() is None:
            proc.kill()
        for p, cmd in {**started, **_descendants(proc.pid)}.items():  # only ever the processes this test started
            try:
                if Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace") == cmd:
                    os.kill(p, signal.SIGKILL)
            except OSError:
                pass


FAST = ["--no-progress", "--no-step", "--peak-flops", "1e11", "--peak-bandwidth", "1e10", "--runs", "runs"]


@pytest.mark.slow
def test_compare_workers_die_with_a_killed_compare(tmp_path):
    argv = ["compare", "tests.session_models:mlp", "tests.session_models:mlp", "-H", "repeat=1", "--processes", "4",
            "--pairs", "200", "--block-time", "0.05", "--budget", "0.01", "--no-calibrate", *FAST]
    started, published = _kill_parent_when(argv, tmp_path, lambda pid, out: "timing " in out and _workers(pid))
    assert any("spawn_main" in cmd for cmd in started.values())
    time.sleep(1)
    assert _runs(tmp_path / "runs") == published  # compare saves in its parent: nothing after the kill


@pytest.mark.slow
def test_round_workers_die_with_a_killed_collect(tmp_path):
    # The first round (this process) is the wait before the round workers start: a short budget and cap keep it short,
    # and each worker round still times its components for seconds.
    argv = ["collect", "tests.session_models:mlp", "--rounds", "3", "--budget", "0.1", "--max-component-s", "1", *FAST]
    # The collection's calibration worker lives through the whole collection; a second worker is a round's.
    started, published = _kill_parent_when(argv, tmp_path, lambda pid, out: len(_workers(pid)) >= 2)
    assert sum("spawn_main" in cmd for cmd in started.values()) >= 2
    time.sleep(1)
    assert _runs(tmp_path / "runs") == published == set()


@pytest.mark.slow
def test_sweep_points_die_with_a_killed_sweep_and_save_nothing_after(tmp_path):
    argv = ["sweep", "tests.session_models:mlp", "--grid", "width=32,48,64,80", "--budget", "0.3", "--study", "s", *FAST]

    def measuring(pid: int, out: str) -> bool:  # a point's worker, and below it that point's calibration worker
        workers = _workers(pid)
        return any(_workers(w) for w in workers)

    _, published = _kill_parent_when(argv, tmp_path, measuring)
    time.sleep(3)  # a point that went on would save its run within seconds
    assert _runs(tmp_path / "runs") == published


def test_a_worker_knows_its_launcher_and_a_driver_that_is_gone():
    assert clean_worker.process_alive(os.getpid())
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    assert not clean_worker.process_alive(done.pid)
