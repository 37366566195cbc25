"""torch.profiler without its native chatter on the process's stderr."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Iterator


@contextlib.contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """Kineto writes lines to the process's stderr at every profiler start and stop (hundreds per
    run), and the CPU allocator one per free of a block it saw no allocation of; KINETO_LOG_LEVEL does
    not reach them once pyarrow is loaded. Silence fd 2 for just those calls."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def quiet_profiler(prof: Any, *, whole: bool = False) -> Iterator[Any]:
    """Run `prof` (a torch.profiler.profile) around the block, its native start/stop lines silenced;
    `whole` silences the block too (the allocator's per-free warnings under profile_memory)."""
    with native_stderr_silenced():
        prof.start()
    try:
        with native_stderr_silenced() if whole else contextlib.nullcontext():
            yield prof
    finally:
        with native_stderr_silenced():
            prof.stop()
