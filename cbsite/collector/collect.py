"""provider -> preprocess -> profile: what `cbsite collect` and `cbsite demo` run."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from cbsite.archive import Run
from cbsite.collector.device import kept_worker, start_calibration
from cbsite.collector.plugins.registry import load
from cbsite.collector.preprocess import describe_inputs
from cbsite.collector.profiler import DTYPES, CollectConfig, profile_model, threads_for
from cbsite.collector.providers import provide
from cbsite.errors import CbsiteError, user_code_error


@dataclass(frozen=True)
class Preprocessing:
    shrink_factor: float | None = None
    shrink_cap: int | None = None
    batch_size: int | None = None  # replicate the captured example batch up to this size


@dataclass(frozen=True)
class CollectRequest:
    provider: str
    options: dict[str, Any] = field(default_factory=dict)
    model_name: str | None = None
    version: str = "v0"
    batches: int = 3
    seed: int = 0
    preprocessing: Preprocessing = Preprocessing()
    config: CollectConfig = CollectConfig()
    tags: tuple[str, ...] = ()
    notes: str = ""


@dataclass
class Prepared:
    """A request's model and batches after its preprocessing, and what run.json says of them."""

    model: Any
    batches: list[tuple[tuple[Any, ...], dict[str, Any]]]
    name: str
    provider: dict[str, Any]
    steps: list[dict[str, Any]]
    inputs_description: dict[str, Any]


def prepare(request: CollectRequest) -> Prepared:
    """Provider then preprocessing: deterministic for a request, so a worker process rebuilds the same model."""
    if request.batches < 1:
        raise CbsiteError(f"--batches must be at least 1, got {request.batches}")
    try:
        provided = provide(request.provider, dict(request.options), batches=request.batches, seed=request.seed)
    except CbsiteError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's provider raised: one line, the traceback in a file
        raise user_code_error(f"the provider {request.provider!r}", exc, "provider") from exc
    model, inputs = provided.model, list(provided.inputs)
    steps: list[dict[str, Any]] = []
    pre = request.preprocessing
    # The flags select the built-in preprocessor plugins; plugins selected by name run after them.
    chosen = []
    if pre.shrink_factor is not None or pre.shrink_cap is not None:
        chosen.append(load("preprocessors", "shrink-hash")({"factor": pre.shrink_factor, "cap": pre.shrink_cap}))
    if pre.batch_size is not None:
        chosen.append(load("preprocessors", "replicate-batch")({"batch_size": pre.batch_size}))
    chosen += request.config.selection().instances("preprocessors")
    for step in chosen:
        model, inputs, record = step.apply(model, inputs)
        steps.append(record)
    name = request.model_name or provided.name.replace(":", "-").replace("/", "-")[-64:]
    return Prepared(
        model=model,
        batches=[(i.args, i.kwargs) for i in inputs],
        name=name,
        provider={"name": provided.name, "options": provided.options, "description": provided.description,
                  **({"details": provided.details} if provided.details else {})},
        steps=steps,
        inputs_description=describe_inputs(inputs[0]),
    )


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
