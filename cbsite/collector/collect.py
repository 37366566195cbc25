"""provider -> preprocess (request.py) -> profile (profiler.py): what `cbsite collect` and `cbsite demo` run."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from cbsite.archive import Run
from cbsite.collector.clean_worker import kept_worker
from cbsite.collector.config import DTYPES, threads_for
from cbsite.collector.device import start_calibration
from cbsite.collector.profiler import profile_model
from cbsite.collector.request import CollectRequest, Prepared, prepare


def collect(request: CollectRequest) -> Run:
    """Collect one run; with `config.rounds > 1` its timing is repeated in fresh worker processes."""
    config = request.config
    calibrates = config.calibrate and config.device == "cpu"
    # The calibration worker starts now, and the start calibration with it: the worker's interpreter, its torch
    # import and the calibration run while this process builds the model and takes its census, none of which is
    # timed. The build leaves the calibration its core (device.start_calibration).
    with kept_worker(start_now=calibrates):
        left = start_calibration(DTYPES[config.dtype], threads_for(config)) if calibrates else None
        with _threads_at_most(left):
            prepared = prepare(request)
        return _collect(request, prepared)


@contextlib.contextmanager
def _threads_at_most(threads: int | None) -> Iterator[None]:
    """This process's intra-op threads capped at `threads` inside the block (None: unchanged)."""
    before = torch.get_num_threads()
    if threads is not None and threads < before:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _collect(request: CollectRequest, prepared: Prepared) -> Run:
    return profile_model(
        prepared.model,
        prepared.batches,
        request.config,
        model_name=prepared.name,
        version=request.version,
        provider=prepared.provider,
        preprocessing=prepared.steps,
        inputs_description=prepared.inputs_description,
        tags=request.tags,
        notes=request.notes,
        request=request,
        keep_model=False,  # built by the provider for this collection and dropped after it: nothing to put back
    )
