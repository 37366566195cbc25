"""The collector: the only package that imports torch. `profile()` is the notebook entry point."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from cbsite.archive import Run
    from cbsite.collector.config import CollectConfig

__all__ = ["CollectConfig", "profile", "profile_model"]


def __getattr__(name: str) -> Any:
    """The collector's names on first use: the calibration worker imports only cbsite.collector.device."""
    if name == "CollectConfig":
        from cbsite.collector.config import CollectConfig

        return CollectConfig
    if name == "profile_model":
        from cbsite.collector.profiler import profile_model

        return profile_model
    raise AttributeError(f"module 'cbsite.collector' has no attribute {name!r}")


def profile(
    model: nn.Module,
    *args: Any,
    model_name: str = "model",
    version: str = "v0",
    config: CollectConfig | None = None,
    **kwargs: Any,
) -> Run:
    """Profile every submodule of `model` on one example call `model(*args, **kwargs)`.

    Returns a `Run`: `run.table()` gives the rows as a polars DataFrame, `run.save("runs")` archives it.
    Keyword arguments named model_name, version and config are cbsite's; every other one goes to the model.
    Progress is shown as `cbsite collect` shows it (a bar in a terminal or a notebook, lines in a log) unless
    `config` says `progress=False`.
    """
    from cbsite.collector.config import CollectConfig
    from cbsite.collector.profiler import profile_model

    return profile_model(model, [(args, kwargs)], config or CollectConfig(), model_name=model_name, version=version)
