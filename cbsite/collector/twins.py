"""Identical components counted once: the 12 blocks of GPT-2 small, and every sublayer inside them,
do the same work on inputs of the same shapes, so their FLOPs, bytes moved and allocator peak are the
same numbers. Counting and peak passes are a third of a large model's untimed work (README: Memory and
scale); a twin takes the first one's counts instead of running them again. Each is still timed on its
own inputs.

Two components are twins when everything that decides which ops run, on which shapes, is equal:
- the module tree: every submodule's class and its plain attributes (sizes, flags, `training`, ...),
  every parameter's and buffer's shape, dtype, stride, device and requires_grad;
- the captured calls of batch 0: per call the pytree of inputs (each tensor's shape, dtype, stride,
  device and requires_grad; every other leaf by value), grad mode and whether it wrote into its inputs.

What could still differ is work decided by tensor *values*: a branch on `.item()`, a boolean mask,
`nonzero`, `unique`. Every such aten op carries the tag `data_dependent_output` or
`dynamic_output_shape`; the counting pass records whether it met one (or any op outside aten and
prims, whose tags we cannot trust: fbgemm's jagged ops), and a component that did is never a source of
counts. Anything the signature cannot describe by value (an object attribute, a hook, an input that is
not a pytree of tensors and plain values) makes the component count for itself.
"""

from __future__ import annotations

import dataclasses
import hashlib
import statistics
import types
from typing import Any, Sequence

import torch
from torch import nn
from torch.utils import _pytree as pytree

_PLAIN = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout)
_MODULE_STATE = {"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"}


TWINS_RULE = ("a component identical to one measured before it (same module classes, attributes, parameter and buffer "
              "shapes, and inputs of the same shapes, dtypes and grad flags), whose counting pass met no op that "
              "depends on tensor values, takes that one's FLOPs, bytes moved and peak memory; it is timed on its own "
              "inputs (--count-every-twin counts every component)")


class _Unknown(Exception):
    """A part the signature cannot describe by value: no twin for this component."""


def _tensor(t: torch.Tensor) -> tuple[Any, ...]:
    return ("T", tuple(t.shape), str(t.dtype), tuple(t.stride()) if t.layout == torch.strided else str(t.layout),
            str(t.device), bool(t.requires_grad))


def _value(v: Any, depth: int = 0) -> Any:
    if isinstance(v, torch.Tensor):
        return _tensor(v)
    if isinstance(v, _PLAIN):
        return (type(v).__name__, repr(v))
    if depth > 4:
        raise _Unknown("nested too deep")
    if isinstance(v, (tuple, list)):
        return (type(v).__name__, tuple(_value(x, depth + 1) for x in v))
    if isinstance(v, dict):
        return ("dict", tuple((repr(k), _value(x, depth + 1)) for k, x in v.items()))
    if isinstance(v, (set, frozenset)):
        return ("set", tuple(sorted(repr(_value(x, depth + 1)) for x in v)))
    if isinstance(v, types.BuiltinFunctionType):
        return ("builtin", getattr(v, "__module__", None), v.__qualname__)
    if isinstance(v, types.FunctionType):  # two lambdas made in a loop differ only in what they closed over
        cells = tuple(_value(c.cell_contents, depth + 1) for c in (v.__closure__ or ()))
        return ("fn", v.__module__, v.__qualname__, cells, _value(v.__defaults__, depth + 1))
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return (type(v).__qualname__, tuple((f.name, _value(getattr(v, f.name), depth + 1)) for f in dataclasses.fields(v)))
    raise _Unknown(type(v).__qualname__)


def _hooks_set(m: nn.Module) -> bool:
    return any(isinstance(d, dict) and d for k, d in vars(m).items() if k.startswith("_") and "hook" in k)


def _module(module: nn.Module) -> tuple[Any, ...]:
    parts = []
    for name, m in module.named_modules(remove_duplicate=False):
        if _hooks_set(m) or "forward" in vars(m):
            raise _Unknown("hooks or a patched forward")
        attrs = tuple((k, _value(v)) for k, v in sorted(vars(m).items())
                      if k not in _MODULE_STATE and not (k.startswith("_") and "hook" in k))
        params = tuple((k, _tensor(p)) for k, p in m._parameters.items() if p is not None)
        buffers = tuple((k, _tensor(b)) for k, b in m._buffers.items() if b is not None)
        parts.append((name, type(m).__module__, type(m).__qualname__, attrs, params, buffers))
    return tuple(parts)


def _calls(calls: Sequence[Any]) -> tuple[Any, ...]:
    out = []
    for c in calls:
        leaves, spec = pytree.tree_flatten((c.args, c.kwargs))
        flat = tuple(_value(x) if isinstance(x, (torch.Tensor,) + _PLAIN) else _refuse(x) for x in leaves)
        out.append((str(spec), flat, tuple(c.requires_grad), c.grad_enabled, c.mutates_inputs))
    return tuple(out)


def _refuse(x: Any) -> Any:
    raise _Unknown(type(x).__qualname__)


def signature(module: nn.Module, calls: Sequence[Any]) -> str | None:
    """A digest equal for twins (module docstring), or None when the component cannot be described."""
    try:
        described = (_module(module), _calls(calls))
    except _Unknown:
        return None
    return hashlib.sha256(repr(described).encode()).hexdigest()


def value_dependent(func: Any) -> bool:
    """Could this op's work or output shape depend on tensor values (or do we not know)?"""
    namespace = getattr(func, "namespace", "aten")
    if namespace not in ("aten", "prims"):
        return True
    tags = func.tags
    return torch.Tag.data_dependent_output in tags or torch.Tag.dynamic_output_shape in tags


@dataclasses.dataclass
class Source:
    """The first of a set of twins: its path and, per phase, what its passes found."""

    path: str
    counts: dict[str, Any] = dataclasses.field(default_factory=dict)  # phase -> Counts
    peaks: dict[str, int] = dataclasses.field(default_factory=dict)  # phase -> peak bytes
    # phase -> seconds of one timed statement of the set's member measured last (the same code on the same
    # shapes, just before the next one): how warm the next twin already is (measure.Known.warm_s).
    statement_s: dict[str, float] = dataclasses.field(default_factory=dict)
    # phase -> every member timed, the first included: identical work timed at different moments (an A/A, twin_spread)
    members: dict[str, list[str]] = dataclasses.field(default_factory=dict)


class Twins:
    """Sources by signature, filled as components are measured (breadth-first: the first of each set
    is measured in full, the others take its counts)."""

    def __init__(self) -> None:
        self._by_sig: dict[str, Source] = {}
        self.reused = 0  # phases that took a twin's counts

    def source(self, sig: str | None) -> Source | None:
        return self._by_sig.get(sig) if sig is not None else None

    def offer(self, sig: str | None, path: str, phase: str, counts: Any, peak: int, statement_s: float = 0.0) -> None:
        """Keep a measured phase's counts for the twins to come, unless its ops depended on values."""
        if sig is None or counts.value_dependent:
            return
        src = self._by_sig.setdefault(sig, Source(path))
        if src.path == path:
            src.counts[phase] = counts
            src.peaks[phase] = peak
            src.members.setdefault(phase, [path])
        src.statement_s[phase] = statement_s

    def timed(self, sig: str | None, path: str, phase: str, statement_s: float) -> None:
        """A twin of a known set was timed: the next one follows it (Source.statement_s)."""
        src = self.source(sig)
        if src is not None:
            src.statement_s[phase] = statement_s
            src.members.setdefault(phase, [src.path]).append(path)

    def sets(self) -> list[tuple[str, list[str]]]:
        """(phase, paths) of every set with two members or more timed in that phase."""
        return [(phase, paths) for src in self._by_sig.values() for phase, paths in src.members.items()
                if len(paths) >= 2]


# Identical twins timed apart whose intervals do not overlap and whose medians differ by this factor or more make
# a run warning: the machine's speed drifted between components by at least that much.
TWIN_SPREAD_WARN = 1.5
DEVICE_AGREE = 1.1  # twins' device times within this factor: the GPU's work was the same, the drift is the host's
TWIN_SPREAD_RULE = ("per set of twins and phase: spread = slowest median / fastest median of its measured members; "
                    f"a run warning where a spread is {TWIN_SPREAD_WARN}x or more and the slowest one's p25 lies "
                    "above the fastest one's p75; device_spread_max: the largest such ratio of device times (GPU)")


def twin_spread(twins: Twins | None, rows: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """Twins as a free A/A: the same work on inputs of the same shapes, timed at different moments of one run. Returns
    run.json `noise.twins` and the run warning it makes, if any. On a GPU the same is read from the device times
    (`device_spread_max`): where they agree and the latencies do not, the host launched the same work at different
    speeds."""
    by_key = {(r["path"], r["phase"]): r for r in rows if r["status"] == "measured" and r.get("latency_ms")}
    spreads, device_spreads = [], []  # (ratio, phase, slowest row, fastest row); device time ratios
    for phase, paths in twins.sets() if twins is not None else []:
        members = [by_key[(p, phase)] for p in paths if (p, phase) in by_key]
        if len(members) >= 2:
            slow = max(members, key=lambda r: r["latency_ms"])
            fast = min(members, key=lambda r: r["latency_ms"])
            spreads.append((slow["latency_ms"] / fast["latency_ms"], phase, slow, fast))
            device = [float(d) for r in members if (d := r.get("device_time_ms")) is not None and d > 0]
            if len(device) == len(members):
                device_spreads.append(max(device) / min(device))
    if not spreads:
        return {"sets": 0, "spread_median": None, "spread_max": None, "device_spread_max": None, "worst": None,
                "rule": TWIN_SPREAD_RULE}, []
    ratio, phase, slow, fast = max(spreads, key=lambda s: s[0])
    device_max = max(device_spreads) if len(device_spreads) == len(spreads) else None
    record = {"sets": len(spreads), "spread_median": statistics.median(s[0] for s in spreads), "spread_max": ratio,
              "device_spread_max": device_max,
              "worst": {"phase": phase, "slowest": slow["path"], "fastest": fast["path"]}, "rule": TWIN_SPREAD_RULE}
    apart = (slow.get("latency_p25_ms") or slow["latency_ms"]) > (fast.get("latency_p75_ms") or fast["latency_ms"])
    if ratio < TWIN_SPREAD_WARN or not apart:
        return record, []
    device_words = ""
    if device_max is not None and device_max < DEVICE_AGREE:
        device_words = (f"; their device times differ by at most {device_max:.2f}x, so the GPU did the same work and the "
                        "host launched it at different speeds: device_time_ms is the steadier figure")
    return record, [
        f"identical twins timed apart differ: {slow['path']} took {ratio:.2f}x as long as {fast['path']} ({phase}; the "
        f"same modules on inputs of the same shapes, intervals apart). This machine's speed drifted between "
        f"components by that much, so one run's latencies are good to about {ratio:.1f}x; compare versions with "
        f"--rounds or `cbsite compare`, which interleave them{device_words}"]
