"""What `cbsite collect` is asked for (`CollectRequest`) and how it becomes a model and its batches: the provider, then
the preprocessing. Deterministic for a request, so a worker process (rounds, the step's) rebuilds the same model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cbsite.collector.config import CollectConfig
from cbsite.collector.plugins.registry import load
from cbsite.collector.preprocess import describe_inputs
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
    except Exception as exc:
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
