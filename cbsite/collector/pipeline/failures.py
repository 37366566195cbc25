"""An exception as a row records it: one line for `error`, the full text for the log plugin; and the one line a
collection stops with when the model's own forward raises."""

from __future__ import annotations

import traceback

from cbsite.collector import memory
from cbsite.errors import CbsiteError, user_code_error


def error_text(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" (at {last[0].filename.rsplit('/', 1)[-1]}:{last[0].lineno})" if last else ""
    oom = f"{memory.OOM_PREFIX}: " if memory.is_out_of_memory(exc) else ""
    return f"{oom}{type(exc).__name__}: {exc}{where}"[:2000]


def traceback_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-20000:]


def forward_error(exc: Exception, index: int) -> CbsiteError:
    """The one line a collection stops with when the model's own forward raises or does not fit."""
    if memory.is_out_of_memory(exc):
        return CbsiteError(
            f"the model's own forward on example batch {index} does not fit in memory ({error_text(exc)}); "
            "give a larger --memory-limit, a smaller batch (-o batch_size=...) or a smaller model"
        )
    return user_code_error(f"the model's forward on example batch {index}", exc, "forward")
