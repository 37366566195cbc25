"""The diff's vocabulary: the metrics it compares, the kinds of change, their labels, the records it returns
(`Total`, `ComponentDelta`, `Cancelled`) and the rule that says what a change is. Data only; the rules of
alignment and attribution are in cbsite/diff/rundiff.py's docstring."""

from __future__ import annotations

from dataclasses import dataclass

from cbsite.errors import CbsiteError

# Order matters: it is the classification order (exact counts first, timings last) and the column order.
DIFF_METRICS = ("flops", "param_bytes", "peak_memory_bytes", "latency_ms", "bytes_moved")
KINDS = ("added", "removed", "increased", "decreased", "unchanged", "moved")

PER_CALL_METRICS = frozenset({"flops", "latency_ms", "bytes_moved"})  # per-forward = per-call x calls
ADDITIVE_METRICS = frozenset({"flops", "latency_ms", "bytes_moved", "param_bytes"})  # own = total - children
REL_TOL = 1e-9  # below this relative difference two values are the same number

LABELS = {
    "flops": "FLOPs",
    "param_bytes": "parameter memory",
    "peak_memory_bytes": "peak memory",
    "latency_ms": "latency",
    "bytes_moved": "bytes moved",
}
# Peak memory is a maximum: own changes do not add up to the model's, so no share of it is ever given.
NO_SHARE = frozenset({"peak_memory_bytes"})
# Own changes up and down above CANCEL x |net change|: the parts cancel out and no share of the net is given (it
# would read as thousands of percent). The one definition, for the summary and the diff page (generator/diffdata.py).
CANCEL = 4.0


@dataclass(frozen=True)
class Total:
    """One metric of the whole model (the root's per-forward total) in one phase, base vs head."""

    metric: str
    base: float | None
    head: float | None
    delta: float | None
    ratio: float | None  # head / base; None when base is 0 or a side is unknown
    noise: bool  # latency only: |delta| within the combined IQR of the two roots
    complete: bool = True  # False when some component lacks this metric, so the total excludes it


@dataclass(frozen=True)
class ComponentDelta:
    """One aligned component in one phase. Values are per-forward totals (cbsite/diff/rundiff.py's docstring)."""

    path: str
    phase: str
    module_type: str
    depth: int
    kind: str  # one of KINDS
    base_path: str | None  # path in base; differs from `path` only when moved; None when added
    base: dict[str, float | None]
    head: dict[str, float | None]
    delta: dict[str, float | None]  # head - base; an absent side counts 0 (added/removed)
    self_delta: dict[str, float | None]  # the component's own part of the delta
    share: dict[str, float | None]  # self_delta / the root's delta of the metric
    noise: dict[str, bool]  # latency change within the combined IQR (False for other metrics)
    status_base: str | None
    status_head: str | None
    missing: tuple[str, ...] = ()  # metrics without a value on a side where the component exists

    @property
    def flagged(self) -> bool:
        """True when some delta is unknown because a value is missing (failed or skipped component)."""
        return bool(self.missing)


@dataclass(frozen=True)
class Cancelled:
    """Own changes of one metric in one phase that cancel out: the sums up (>= 0), down (<= 0) and the net.
    `complete` is False when some component's own change is unknown, so up + down need not equal net."""

    up: float
    down: float
    net: float
    complete: bool



def is_change(metric: str, base: float | None, head: float | None, delta: float | None) -> bool:
    """Integer counts differ when they differ; floats when |delta| > REL_TOL x the larger magnitude
    (below that it is rounding, e.g. of an estimated container's float sums)."""
    if delta is None or delta == 0:
        return False
    if isinstance(delta, int):
        return True
    scale = max(abs(base or 0), abs(head or 0))
    return abs(delta) > REL_TOL * scale


def display_path(path: str, model: str) -> str:
    """The root is shown with the model's name; every other component with its FQN."""
    return path if path else model


def check_metric(metric: str) -> None:
    if metric not in DIFF_METRICS:
        raise CbsiteError(f"unknown diff metric {metric!r}: use one of {', '.join(DIFF_METRICS)}")


def short_type(module_type: str) -> str:
    """A module type without its package: "torch.nn.Linear" -> "Linear"."""
    return module_type.rsplit(".", 1)[-1]
