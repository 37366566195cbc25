"""Model providers: where a run's model and its example batches come from.

A provider is named by a built-in name (`dlrm`, `deepfm`, `dlrm-synthetic`, `nanogpt`) or by
`package.module:function`. `provide()` validates the options up front (every bad key at once),
builds the model and draws one or more example batches.

Built-ins are imported lazily: torchrec takes seconds to import, and `nanogpt` needs none of it.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from cbsite.errors import CbsiteError

if TYPE_CHECKING:
    from torch import nn

SIZES = ("tiny", "small", "medium")


@dataclass
class Inputs:
    """One example batch: positional and keyword arguments of the model's forward."""

    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


@dataclass
class Provided:
    """What a provider hands the collector.

    `inputs` holds several distinct batches (drawn with different seeds) so the collector can rotate
    them: replaying one batch keeps the same embedding rows hot in cache and flatters latency.
    `options` are the effective options, defaults included, ready for run.json.
    """

    model: "nn.Module"
    inputs: list[Inputs]
    name: str
    options: dict[str, Any]
    description: str
    # What the provider measured of its own model and inputs (JSON values), kept in run.json's
    # provider.details: e.g. dlrm-synthetic's tables and their unique-id footprint.
    details: dict[str, Any] = field(default_factory=dict)


# A built-in's entry point: (validated options, batches, seed) -> Provided.
BuiltinProvider = Callable[..., Provided]


def _lazy(module: str) -> BuiltinProvider:
    def provide_builtin(options: Mapping[str, Any] | None = None, *, batches: int = 1, seed: int = 0) -> Provided:
        builtin = importlib.import_module(f"{__name__}.{module}")
        return builtin.provide(dict(options or {}), batches=batches, seed=seed)

    provide_builtin.__name__ = f"provide_{module}"
    provide_builtin.__doc__ = f"The built-in provider in cbsite.collector.providers.{module}."
    return provide_builtin


PROVIDERS: dict[str, BuiltinProvider] = {
    "dlrm": _lazy("dlrm"),
    "deepfm": _lazy("deepfm"),
    "dlrm-synthetic": _lazy("synthetic"),
    "nanogpt": _lazy("nanogpt"),
}

# The optional packages a built-in imports (the `torchrec` extra), checked by the CLI before any work starts so a
# missing one is a one-line install hint rather than the provider's import error.
NEEDS: dict[str, tuple[str, ...]] = {
    "dlrm": ("torchrec",),
    "deepfm": ("torchrec",),
    "dlrm-synthetic": ("torchrec",),
}


def needs(spec: str) -> tuple[str, ...]:
    """The modules provider `spec` needs besides torch: those of a built-in; none known for any other."""
    return NEEDS.get(spec, ())


def provide(
    spec: str, options: dict[str, Any] | None = None, *, batches: int = 1, seed: int = 0
) -> Provided:
    """Build the model and `batches` example batches named by `spec`.

    `spec` is a built-in name (see `PROVIDERS`) or `package.module:function`. Built-ins take a
    `size` option (`tiny`, `small` = default, `medium`) plus their own options; `seed` seeds the
    weights and the batches (an explicit `seed` option wins over the keyword).

    A `module:function` is imported and called with the options as keyword arguments. It returns
    `(model, args)` or `(model, args, kwargs)`: `args` is the tuple of positional arguments of the
    model's forward (a value that is not a tuple is taken as the single positional argument) and
    `kwargs` a dict of keyword arguments. A dict inside `args` stays a positional argument; return
    kwargs as the third element. The function gives one batch, so `batches > 1` repeats it.
    """
    if not isinstance(batches, int) or batches < 1:
        raise CbsiteError(f"batches must be a positive integer, got {batches!r}")
    if spec in PROVIDERS:
        return PROVIDERS[spec](options, batches=batches, seed=seed)
    if ":" in spec:
        return _provide_function(spec, dict(options or {}), batches)
    # Third-party providers register under the `cbsite.providers` entry point group (as do the built-ins).
    from cbsite.collector.plugins.registry import available

    installed = available("providers")
    if spec in installed:
        return installed[spec].load()(dict(options or {}), batches=batches, seed=seed)
    raise CbsiteError(
        f"unknown provider {spec!r}: use one of {', '.join(sorted(set(PROVIDERS) | set(installed)))} "
        f"or 'package.module:function' for your own model"
    )


def resolve_options(
    provider: str, given: Mapping[str, Any], presets: Mapping[str, Mapping[str, Any]], seed: int
) -> dict[str, Any]:
    """Merge the given options over the preset of the chosen size; refuse unknown names, all at once.

    `presets` maps each size to its defaults; every preset has the same keys, which are the valid
    option names besides `size` and `seed`.
    """
    valid = ["size", *presets["small"], "seed"]
    unknown = [k for k in given if k not in valid]
    if unknown:
        raise CbsiteError(
            f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} for provider "
            f"{provider!r}; valid options: {', '.join(valid)}"
        )
    size = given.get("size", "small")
    if size not in presets:
        raise CbsiteError(f"option size={size!r} for provider {provider!r}: use one of {', '.join(presets)}")
    return {"size": size, **presets[size], "seed": seed, **{k: v for k, v in given.items() if k != "size"}}


class OptionCheck:
    """Checks option values and collects every problem, so one error reports them all.

    Use: `check = OptionCheck(name, options)`, read values through its methods, then `check.done()`.
    """

    def __init__(self, provider: str, options: Mapping[str, Any]) -> None:
        self.provider = provider
        self.options = options
        self.problems: list[str] = []

    def _bad(self, name: str, what: str) -> None:
        self.problems.append(f"{name}={self.options[name]!r} ({what})")

    def integer(self, name: str, low: int = 1, high: int | None = None) -> int:
        value = self.options[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
            self._bad(name, f"use an integer from {low} to {high}" if high is not None else f"use an integer >= {low}")
            return low
        return value

    def number(self, name: str, low: float) -> float:
        value = self.options[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= low:
            self._bad(name, f"use a number >= {low}")
            return float(low)
        return float(value)

    def sizes(self, name: str) -> list[int]:
        """A non-empty list of positive layer sizes."""
        value = self.options[name]
        if (
            not isinstance(value, (list, tuple))
            or not value
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
        ):
            self._bad(name, "use a non-empty list of positive integers")
            return [1]
        return list(value)

    def per_table(self, name: str, count: int, low: float, integer: bool) -> list[Any]:
        """One value for every table, or a list with one value per table."""
        value = self.options[name]
        values = list(value) if isinstance(value, (list, tuple)) else [value] * count
        kind = int if integer else (int, float)
        ok = len(values) == count and all(
            isinstance(v, kind) and not isinstance(v, bool) and v >= low for v in values
        )
        if not ok:
            noun = "an integer" if integer else "a number"
            self._bad(name, f"use {noun} >= {low}, or a list of {count} of them, one per table")
            return [low] * count
        return values

    def one_of(self, name: str, choices: tuple[Any, ...]) -> Any:
        value = self.options[name]
        if value not in choices:
            self._bad(name, f"use one of {', '.join(map(repr, choices))}")
            return choices[0]
        return value

    def require(self, ok: bool, name: str, what: str) -> None:
        if not ok:
            self._bad(name, what)

    def done(self) -> None:
        if self.problems:
            raise CbsiteError(f"bad options for provider {self.provider!r}: " + "; ".join(self.problems))


def batch_seed(seed: int, index: int) -> int:
    """A seed for batch `index` of a run seeded with `seed`, distinct for every (seed, index) pair.

    Plain `seed + index` would make batch 1 of seed 0 equal batch 0 of seed 1.
    """
    digest = hashlib.sha256(f"cbsite-batch:{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def _provide_function(spec: str, options: dict[str, Any], batches: int) -> Provided:
    from torch import nn

    fn = _import_function(spec)
    _check_function_options(spec, fn, options)
    result = fn(**options)
    if not isinstance(result, tuple) or len(result) not in (2, 3):
        raise CbsiteError(
            f"provider {spec} returned {type(result).__name__}; return (model, args) or (model, args, kwargs)"
        )
    model, args = result[0], result[1]
    kwargs = result[2] if len(result) == 3 else {}
    if not isinstance(model, nn.Module):
        raise CbsiteError(f"provider {spec} returned a {type(model).__name__} as model; return an nn.Module")
    if not isinstance(args, tuple):
        args = (args,)
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise CbsiteError(f"provider {spec} returned {type(kwargs).__name__} as kwargs; return a dict keyed by name")
    one = Inputs(args=args, kwargs=kwargs)
    description = f"{type(model).__name__} from {spec}"
    if batches > 1:
        description += f"; the function gives one batch, repeated {batches} times"
    return Provided(
        model=model,
        inputs=[one] * batches,
        name=spec,
        options=_effective_options(fn, options),
        description=description,
    )


def _import_function(spec: str) -> Callable[..., Any]:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise CbsiteError(f"provider {spec!r}: write it as 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only the module the user named is their mistake; a missing import inside it keeps its traceback.
        if exc.name is None or not module_name.startswith(exc.name):
            raise
        raise CbsiteError(
            f"provider {spec}: cannot import module {module_name!r} ({exc}); "
            f"check the name and that it is on PYTHONPATH"
        ) from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise CbsiteError(f"provider {spec}: module {module_name!r} has no function {attr!r}")
    return fn


def _check_function_options(spec: str, fn: Callable[..., Any], options: Mapping[str, Any]) -> None:
    """Refuse options the function cannot take, all at once, unless it accepts **kwargs."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # some builtins have no signature: let the call decide
        return
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    valid = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [k for k in options if k not in valid]
    if unknown:
        listed = ", ".join(valid) if valid else "none"
        raise CbsiteError(
            f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} for provider "
            f"{spec}; valid options: {listed}"
        )


def _effective_options(fn: Callable[..., Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """The given options plus the function's defaults, as JSON values (repr for anything else)."""
    merged: dict[str, Any] = {}
    try:
        for name, param in inspect.signature(fn).parameters.items():
            if param.default is not param.empty:
                merged[name] = param.default
    except (TypeError, ValueError):
        pass
    merged.update(options)
    return {k: _jsonable(v) for k, v in merged.items()}


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value
