"""cbsite: component-level profiling of PyTorch models, and a versioned offline site of the results.

Public API:
    profile(model, *args, **kwargs) -> Run     (needs torch; imported lazily)
    Run, read_run, list_runs, resolve_run     (archive; no torch)
    CbsiteError
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cbsite.errors import CbsiteError

if TYPE_CHECKING:
    from cbsite.archive import Run

__version__ = "0.1.0"
__all__ = ["CbsiteError", "Run", "list_runs", "profile", "read_run", "resolve_run", "__version__"]
_FROM_ARCHIVE = ("Run", "list_runs", "read_run", "resolve_run")


def __getattr__(name: str) -> Any:
    """The archive's names on first use: a process that only needs a submodule (the calibration worker imports
    cbsite.collector.device) does not pay for polars and pyarrow."""
    if name in _FROM_ARCHIVE:
        from cbsite import archive

        return getattr(archive, name)
    raise AttributeError(f"module 'cbsite' has no attribute {name!r}")


def profile(model: Any, *args: Any, **kwargs: Any) -> Run:
    """Profile every submodule of `model` on the example inputs `args`/`kwargs`; see collector.profile."""
    from cbsite.collector import profile as _profile  # torch is imported only when profiling

    return _profile(model, *args, **kwargs)
