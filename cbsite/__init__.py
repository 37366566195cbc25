"""cbsite: component-level profiling of PyTorch models, and a versioned offline site of the results.

Public API (docs/api.md):
    profile(model, *args, model_name=, version=, config=, **kwargs) -> Run   (needs torch; imported lazily)
    CollectConfig                             (the collection's options; needs torch)
    Run, read_run, list_runs, resolve_run     (archive; no torch)
    diff_report(base, head, runs=)            (what `cbsite diff --format json` prints, as a dict)
    CbsiteError
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cbsite.errors import CbsiteError

if TYPE_CHECKING:
    from cbsite.api import diff_report
    from cbsite.archive import Run, list_runs, read_run, resolve_run
    from cbsite.collector.config import CollectConfig

__version__ = "0.1.0"
__all__ = ["CbsiteError", "CollectConfig", "Run", "diff_report", "list_runs", "profile", "read_run", "resolve_run",
           "__version__"]
_FROM_ARCHIVE = ("Run", "list_runs", "read_run", "resolve_run")


def __getattr__(name: str) -> Any:
    """The API's names on first use: a process that only needs a submodule (the calibration worker imports
    cbsite.collector.device) does not pay for polars and pyarrow, and `import cbsite` does not import torch."""
    if name in _FROM_ARCHIVE:
        from cbsite import archive

        return getattr(archive, name)
    if name == "diff_report":
        from cbsite.api import diff_report

        return diff_report
    if name == "CollectConfig":
        from cbsite.collector.config import CollectConfig

        return CollectConfig
    raise AttributeError(f"module 'cbsite' has no attribute {name!r}")


def profile(model: Any, *args: Any, **kwargs: Any) -> Run:
    """Profile every submodule of `model` on the example call `model(*args, **kwargs)`; cbsite's own options by
    keyword: `model_name=`, `version=`, `config=CollectConfig(...)` (see cbsite.collector.profile)."""
    from cbsite.collector import profile as _profile  # torch is imported only when profiling

    return _profile(model, *args, **kwargs)
