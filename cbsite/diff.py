"""Align two runs component by component, classify each change and attribute it to submodules.

One implementation serves the site's diff pages and the CLI's `cbsite diff`, PR summary and gate.
Pure data: polars rows in, dataclasses out; presentation lives elsewhere.

The rules
---------
* **Alignment.** Components are aligned by `path` within each phase. Only phases present in both runs
  are compared; a phase present in one run only is named in `RunDiff.warnings`. With
  `match_moved=True`, components present on one side only are also matched by structure
  (see `_match_moved`) and reported as `moved`; components whose paths match are never moved.
* **Per-forward totals.** Every value compared is a total per forward of the whole model:
  per-call value x `call_count` for the per-call metrics (FLOPs, latency, bytes moved), with
  `call_count == 0` (a container that is never called) counted as 1, so a module called twice counts
  twice. `param_bytes` is static (the unique parameters of the subtree) and is never multiplied.
  `peak_memory_bytes` is a maximum, not a sum, and is never multiplied either.
* **Attribution (additive metrics: FLOPs, latency, bytes moved, parameter bytes).** A component's own
  share on one side is its total minus the totals of its children on that side; its `self_delta` is
  own(head) - own(base) (an absent side counts 0). With unchanged structure this is exactly
  "delta minus the sum of the children's deltas", so delta = sum of children's deltas + self_delta;
  with moved components it still credits the old and new parent correctly. Over a phase the
  self_deltas telescope to the root's delta, so `share = self_delta / root delta` sums to 1
  (None when the root delta is 0 or unknown). Rows are used as stored: an estimated container holds
  its children's sums (own share 0); a measured container's own share is its number minus its
  children's. Float own shares within 1e-9 (relative) of zero are rounding and are snapped to 0.
* **Attribution (peak memory).** Peaks do not add up, so a component's `self_delta` is the part of its
  peak change that no single child shows: delta minus the largest child delta in the same direction,
  clipped between 0 and delta. A change planted in one leaf is then owned by that leaf alone, and the
  ancestors that merely inherit it get 0 (with self_delta = delta every ancestor would tie with the
  leaf and crowd `top()`). `share = self_delta / root delta`; these shares do not sum to 1 and may
  exceed 1, since any one of several components can explain the same peak.
* **Missing values.** A value that is missing (None: failed or skipped component, metric not
  measured) on a side where the component exists is never read as 0: the delta is None, the metric is
  listed in `ComponentDelta.missing`, and the own share of its parent on that side is unknown too
  (None). A total that excludes such a value has `Total.complete == False`.
* **Noise (latency).** The spread of a component is its per-forward IQR width (p75 - p25, times calls);
  a component without percentiles (an estimated container) takes the sum of its children's widths,
  an upper bound that errs towards "noise" so the gate never fails on what could be noise. A latency
  change is noise when |delta| <= base width + head width; noise is never a change.
* **Classification** of a component present on both sides: the first metric of `DIFF_METRICS`
  (flops, param_bytes, peak_memory_bytes, latency_ms, bytes_moved) whose delta is a change decides
  `increased` or `decreased`; a change is |delta| > 1e-9 x max(|base|, |head|) and, for latency, not
  noise. So a component whose FLOPs went up and latency went down is `increased` (exact counts come
  before timings). Metrics that are None on a side are skipped by the classification; `missing`
  says which. Nothing changed: `unchanged`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import polars as pl

from cbsite import schema
from cbsite.archive import Run
from cbsite.errors import CbsiteError
from cbsite.tree import Node, Tree, build_tree

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
# Singular form used in "the FLOP growth".
_GROWTH_LABELS = {**LABELS, "flops": "FLOP"}
MINUS = "\u2212"  # typographic minus, as in "−12%"


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
    """One aligned component in one phase. Values are per-forward totals (see the module docstring)."""

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


@dataclass
class RunDiff:
    """The comparison of two runs: totals per phase and every aligned component."""

    base_meta: dict[str, Any]
    head_meta: dict[str, Any]
    totals: dict[str, dict[str, Total]]  # phase -> metric -> Total
    components: list[ComponentDelta]  # phase by phase, each in pre-order of head (removed where they were)
    warnings: list[str] = field(default_factory=list)

    @property
    def phases(self) -> list[str]:
        """The phases compared, in schema order."""
        return list(self.totals)

    def for_phase(self, phase: str) -> list[ComponentDelta]:
        """The components of one phase, in pre-order."""
        self._check_phase(phase)
        return [c for c in self.components if c.phase == phase]

    def get(self, path: str, phase: str = "forward") -> ComponentDelta:
        """The component at `path` (its head path; base path for a removed one) in `phase`."""
        for c in self.components:
            if c.phase == phase and c.path == path:
                return c
        raise CbsiteError(f"no component {path!r} in the {phase} diff; paths are torch FQNs, the root is ''")

    def top(self, metric: str, phase: str = "forward", n: int = 10) -> list[ComponentDelta]:
        """The `n` components with the largest |self_delta| of `metric`: the deepest ones that explain it.

        Components with no own change, an unknown one, or a latency change within noise are left out.
        Ties go to the deeper component, then to pre-order.
        """
        _check_metric(metric)
        rows = [
            (i, c)
            for i, c in enumerate(self.for_phase(phase))
            if c.self_delta[metric] not in (None, 0) and not c.noise[metric]
        ]
        rows.sort(key=lambda ic: (-abs(ic[1].self_delta[metric]), -ic[1].depth, ic[0]))
        return [c for _, c in rows[:n]]

    def counts(self, phase: str = "forward") -> dict[str, int]:
        """How many components of each kind (every kind present, in KINDS order) in `phase`."""
        self._check_phase(phase, compared_only=False)
        counts = dict.fromkeys(KINDS, 0)
        for c in self.components:
            if c.phase == phase:
                counts[c.kind] += 1
        return counts

    def summary(self) -> str:
        """One plain-text paragraph in words: totals with ratios, where the change is, counts, warnings."""
        base_model, head_model = self.base_meta.get("model", "?"), self.head_meta.get("model", "?")
        model = head_model
        title = (
            f"{model} {self.head_meta.get('version', '?')} vs {self.base_meta.get('version', '?')}"
            if base_model == head_model
            else f"{head_model} {self.head_meta.get('version', '?')} vs {base_model} {self.base_meta.get('version', '?')}"
        )
        if not self.totals:
            return f"{title}: no phase in common, nothing compared. " + " ".join(w + "." for w in self.warnings)
        main = "forward" if "forward" in self.totals else self.phases[0]

        changed: list[str] = []
        same: list[str] = []
        noisy: list[str] = []
        unknown: list[str] = []
        # Parameter memory is static: say it once, not per phase.
        items = [("param_bytes", main, LABELS["param_bytes"])]
        for phase in self.phases:
            for metric in ("flops", "peak_memory_bytes", "latency_ms"):
                items.append((metric, phase, f"{phase} {LABELS[metric]}"))
        for metric, phase, label in items:
            total = self.totals[phase][metric]
            if total.delta is None:
                unknown.append(label)
            elif total.noise:
                noisy.append(f"{label} ({format_delta(metric, total.delta)})")
            elif _is_change(metric, total.base, total.head, total.delta):
                changed.append(f"{format_ratio(total)} {label} ({format_delta(metric, total.delta)})")
            else:
                same.append(label)
        parts = list(changed)
        if noisy:
            parts.append(f"{', '.join(noisy)} within noise")
        if same:
            parts.append(f"unchanged {', '.join(same)}")
        if unknown:
            parts.append(f"unknown {', '.join(unknown)}")
        sentences = [f"{title}: {', '.join(parts)}."]

        where = []
        for metric in ("flops", "param_bytes", "peak_memory_bytes", "latency_ms"):
            total = self.totals[main][metric]
            if total.delta in (None, 0) or total.noise or not _is_change(metric, total.base, total.head, total.delta):
                continue
            best = self.top(metric, main, 1)
            if not best or best[0].share[metric] is None:
                continue
            c, share = best[0], best[0].share[metric]
            name = display_path(c.path, model) + (" (own)" if c.path == "" else "")
            what = f"{_GROWTH_LABELS[metric]} {'growth' if total.delta > 0 else 'reduction'}"
            if 0.5 <= share <= 1 + REL_TOL:
                where.append(f"most of the {what} ({_pct(share)}) is in {name} ({_short_type(c.module_type)})")
            elif share > 1:
                where.append(f"{name} accounts for {_pct(share)} of the {what}, partly offset elsewhere")
            else:
                where.append(f"the largest part of the {what} ({_pct(share)}) is in {name}")
        if where:
            sentences.append(_capitalise("; ".join(where)) + ".")

        counts = self.counts(main)
        listed = [f"{counts[k]} {k}" for k in KINDS if counts[k]]
        sentences.append(f"{_capitalise(main)} components: {', '.join(listed)}.")

        flagged = sorted({display_path(c.path, model) for c in self.components if c.flagged})
        if flagged:
            shown = ", ".join(flagged[:5]) + (f" and {len(flagged) - 5} more" if len(flagged) > 5 else "")
            sentences.append(
                f"{len(flagged)} component{'s' * (len(flagged) != 1)} lack numbers in a run "
                f"(failed, skipped or not measured), so some deltas are unknown: {shown}."
            )
        sentences.extend(_capitalise(w) + "." for w in self.warnings)
        return " ".join(sentences)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict with a stable key order (insertion order; no NaN or infinity)."""
        return {
            "base": _identity(self.base_meta),
            "head": _identity(self.head_meta),
            "phases": self.phases,
            "warnings": list(self.warnings),
            "summary": self.summary(),
            "counts": {phase: self.counts(phase) for phase in self.phases},
            "totals": {
                phase: {
                    m: {
                        "base": _json(t.base),
                        "head": _json(t.head),
                        "delta": _json(t.delta),
                        "ratio": _json(t.ratio),
                        "noise": t.noise,
                        "complete": t.complete,
                    }
                    for m, t in metrics.items()
                }
                for phase, metrics in self.totals.items()
            },
            "components": [
                {
                    "path": c.path,
                    "base_path": c.base_path,
                    "phase": c.phase,
                    "module_type": c.module_type,
                    "depth": c.depth,
                    "kind": c.kind,
                    "status_base": c.status_base,
                    "status_head": c.status_head,
                    "missing": list(c.missing),
                    **{
                        key: {m: _json(getattr(c, key)[m]) for m in DIFF_METRICS}
                        for key in ("base", "head", "delta", "self_delta", "share")
                    },
                    "noise": {m: c.noise[m] for m in DIFF_METRICS},
                }
                for c in self.components
            ],
        }

    def _check_phase(self, phase: str, compared_only: bool = True) -> None:
        if phase not in schema.PHASES:
            raise CbsiteError(f"unknown phase {phase!r}: use one of {', '.join(schema.PHASES)}")
        if compared_only and phase not in self.totals:
            raise CbsiteError(
                f"the {phase} phase was not compared (compared: {', '.join(self.phases) or 'none'}); "
                "collect both runs with that phase"
            )


# --- entry points ------------------------------------------------------------------------------


def diff_runs(base: Run, head: Run, *, match_moved: bool = False) -> RunDiff:
    """Compare two runs: `head` (the newer) against `base`. See the module docstring for the rules."""
    return diff_tables(base.rows, head.rows, match_moved=match_moved, base_meta=base.meta, head_meta=head.meta)


def diff_tables(
    base_rows: pl.DataFrame,
    head_rows: pl.DataFrame,
    *,
    match_moved: bool = False,
    base_meta: dict[str, Any] | None = None,
    head_meta: dict[str, Any] | None = None,
) -> RunDiff:
    """Compare two tables of component rows (the components.parquet schema); metadata is optional."""
    base_by_phase = _rows_by_phase(base_rows, "base")
    head_by_phase = _rows_by_phase(head_rows, "head")
    base_meta = base_meta if base_meta is not None else _meta_from_rows(base_rows)
    head_meta = head_meta if head_meta is not None else _meta_from_rows(head_rows)
    phases = [p for p in schema.PHASES if p in base_by_phase and p in head_by_phase]
    warnings = _warnings(base_meta, head_meta, base_by_phase, head_by_phase)
    if not phases:
        raise CbsiteError(
            f"the runs have no phase in common (base: {', '.join(base_by_phase) or 'none'}; "
            f"head: {', '.join(head_by_phase) or 'none'}); collect both with the same phases"
        )
    base_trees = {p: _tree(rows, "base", base_meta) for p, rows in base_by_phase.items() if p in phases}
    head_trees = {p: _tree(rows, "head", head_meta) for p, rows in head_by_phase.items() if p in phases}

    # Moves are matched once, on the forward structure when there is one, and applied to every phase,
    # so a component is moved in both phases or in neither.
    moved: dict[str, str] = {}
    if match_moved:
        moved = _match_moved(base_trees[phases[0]], head_trees[phases[0]])

    totals: dict[str, dict[str, Total]] = {}
    components: list[ComponentDelta] = []
    for phase in phases:
        phase_totals, phase_components = _diff_phase(phase, base_trees[phase], head_trees[phase], moved)
        totals[phase] = phase_totals
        components.extend(phase_components)
    return RunDiff(base_meta=base_meta, head_meta=head_meta, totals=totals, components=components, warnings=warnings)


# --- formatting shared by the summary, the site and the CLI ------------------------------------


def format_ratio(total: Total) -> str:
    """A total's change in words: "2.8×" from double up, "+39%", "−12%", "±0%", "new", or "n/a"."""
    base, head = total.base, total.head
    if base is None or head is None:
        return "n/a"
    if base == 0:
        return "±0%" if head == 0 else "new"
    ratio = head / base
    if ratio >= 2:
        return f"{ratio:.1f}×" if ratio < 10 else f"{ratio:.0f}×"
    return _signed_pct(ratio - 1)


def format_delta(metric: str, value: float | None) -> str:
    """A signed change with its unit: "+12.3 MB", "−1.2 GFLOP", "+0.0123 ms"; "n/a" when unknown."""
    if value is None:
        return "n/a"
    sign = "+" if value > 0 else (MINUS if value < 0 else "±")
    return sign + format_amount(metric, abs(value))


def format_amount(metric: str, value: float) -> str:
    """A value with its unit: FLOPs and bytes with decimal SI prefixes, latency in ms."""
    if metric in ("latency_ms",):
        return f"{_sig3(value)} ms"
    unit = "FLOP" if metric == "flops" else "B"
    prefixes = ["", "k", "M", "G", "T", "P", "E"]
    i = 0
    while i < len(prefixes) - 1 and abs(float(_sig3(value))) >= 1000:
        value /= 1000
        i += 1
    return f"{_sig3(value)} {prefixes[i]}{unit}"


def display_path(path: str, model: str) -> str:
    """The root is shown with the model's name; every other component with its FQN."""
    return path if path else model


# --- one phase ---------------------------------------------------------------------------------


@dataclass
class _Pair:
    """A node of the union tree: a component in head, in base, or both."""

    head: Node | None
    base: Node | None
    children: list["_Pair"] = field(default_factory=list)
    depth: int = 0


def _diff_phase(phase: str, base: Tree, head: Tree, moved: dict[str, str]) -> tuple[dict[str, Total], list[ComponentDelta]]:
    moved = {h: b for h, b in moved.items() if h in head.by_path and b in base.by_path}
    pairs = _union(base, head, moved)  # pre-order
    b_total, b_own, b_width = _side(base)
    h_total, h_own, h_width = _side(head)

    # Per pair: totals, deltas, own-share deltas and noise, computed bottom-up for peak memory.
    info: dict[int, dict[str, Any]] = {}
    for pair in reversed(pairs):
        bp = pair.base.path if pair.base else None
        hp = pair.head.path if pair.head else None
        bv = b_total[bp] if bp is not None else dict.fromkeys(DIFF_METRICS)
        hv = h_total[hp] if hp is not None else dict.fromkeys(DIFF_METRICS)
        delta: dict[str, Any] = {}
        self_delta: dict[str, Any] = {}
        noise: dict[str, bool] = {}
        missing = [m for m in DIFF_METRICS if (bp is not None and bv[m] is None) or (hp is not None and hv[m] is None)]
        for m in DIFF_METRICS:
            if m in missing:
                delta[m] = None
            else:
                delta[m] = (hv[m] if hp is not None else 0) - (bv[m] if bp is not None else 0)
            if m in ADDITIVE_METRICS:
                own_h = h_own[hp][m] if hp is not None else 0
                own_b = b_own[bp][m] if bp is not None else 0
                self_delta[m] = None if own_h is None or own_b is None else own_h - own_b
            else:
                self_delta[m] = _peak_self(delta[m], [info[id(c)]["delta"][m] for c in pair.children])
            noise[m] = False
        if bp is not None and hp is not None and delta["latency_ms"]:
            width = _add(b_width[bp], h_width[hp])
            noise["latency_ms"] = width is not None and abs(delta["latency_ms"]) <= width
        info[id(pair)] = {"base": bv if bp is not None else dict.fromkeys(DIFF_METRICS),
                          "head": hv if hp is not None else dict.fromkeys(DIFF_METRICS),
                          "delta": delta, "self": self_delta, "noise": noise, "missing": tuple(missing)}

    root = info[id(pairs[0])]
    totals: dict[str, Total] = {}
    for m in DIFF_METRICS:
        b, h, d = root["base"][m], root["head"][m], root["delta"][m]
        complete = not any(m in info[id(p)]["missing"] for p in pairs)
        ratio = h / b if b not in (None, 0) and h is not None else None
        totals[m] = Total(metric=m, base=b, head=h, delta=d, ratio=ratio, noise=root["noise"][m], complete=complete)

    components = []
    for pair in pairs:
        i = info[id(pair)]
        row = (pair.head or pair.base).row  # type: ignore[union-attr]
        share = {
            m: i["self"][m] / totals[m].delta if i["self"][m] is not None and totals[m].delta else None
            for m in DIFF_METRICS
        }
        components.append(
            ComponentDelta(
                path=(pair.head or pair.base).path,  # type: ignore[union-attr]
                phase=phase,
                module_type=row["module_type"],
                depth=pair.depth,
                kind=_kind(pair, i, moved),
                base_path=pair.base.path if pair.base else None,
                base=i["base"],
                head=i["head"],
                delta=i["delta"],
                self_delta=i["self"],
                share=share,
                noise=i["noise"],
                status_base=pair.base["status"] if pair.base else None,
                status_head=pair.head["status"] if pair.head else None,
                missing=i["missing"],
            )
        )
    return totals, components


def _kind(pair: _Pair, info: dict[str, Any], moved: dict[str, str]) -> str:
    if pair.base is None:
        return "added"
    if pair.head is None:
        return "removed"
    if pair.head.path in moved:
        return "moved"
    for m in DIFF_METRICS:  # the first metric that changed decides (see the module docstring)
        d = info["delta"][m]
        if d is None or info["noise"][m]:
            continue
        if _is_change(m, info["base"][m], info["head"][m], d):
            return "increased" if d > 0 else "decreased"
    return "unchanged"


def _is_change(metric: str, base: float | None, head: float | None, delta: float | None) -> bool:
    """A difference beyond rounding: |delta| > REL_TOL x the larger magnitude."""
    if delta is None or delta == 0:
        return False
    scale = max(abs(base or 0), abs(head or 0))
    return abs(delta) > REL_TOL * scale


def _peak_self(delta: float | None, child_deltas: list[float | None]) -> float | None:
    """Peak memory: the part of the change that no single child shows (see the module docstring)."""
    if delta is None:
        return None
    known = [d for d in child_deltas if d is not None]
    if delta > 0:
        explained = min(max([d for d in known if d > 0], default=0), delta)
    elif delta < 0:
        explained = max(min([d for d in known if d < 0], default=0), delta)
    else:
        explained = 0
    return delta - explained


def _side(tree: Tree) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]], dict[str, float | None]]:
    """Per path of one run's phase: per-forward totals, own shares (additive metrics) and IQR width."""
    totals = {node.path: {m: _per_forward(node.row, m) for m in DIFF_METRICS} for node in tree}
    own: dict[str, dict[str, Any]] = {}
    width: dict[str, float | None] = {}
    for node in reversed(list(tree)):  # children before parents
        own[node.path] = {}
        for m in ADDITIVE_METRICS:
            own[node.path][m] = _own(totals[node.path][m], [totals[c.path][m] for c in node.children])
        p25, p75 = node["latency_p25_ms"], node["latency_p75_ms"]
        if p25 is not None and p75 is not None:
            width[node.path] = (p75 - p25) * _calls(node.row)
        elif node.children:
            # No spread of its own (an estimate): the sum of its children's, an upper bound.
            width[node.path] = _sum([width[c.path] for c in node.children])
        else:
            width[node.path] = None
    return totals, own, width


def _own(total: float | None, children: list[float | None]) -> float | None:
    if total is None:
        return None
    rest = _sum(children)
    if rest is None:
        return None  # a child's value is unknown, so is how much of the total is the parent's own
    own = total - rest
    if isinstance(own, float) and abs(own) <= REL_TOL * max(abs(total), abs(rest)):
        return 0.0  # rounding of an estimated container's float sum, not a share
    return own


def _per_forward(row: dict[str, Any], metric: str) -> float | None:
    value = row.get(metric)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value * _calls(row) if metric in PER_CALL_METRICS else value


def _calls(row: dict[str, Any]) -> int:
    return max(int(row["call_count"] or 0), 1)  # a never-called container counts once


def _union(base: Tree, head: Tree, moved: dict[str, str]) -> list[_Pair]:
    """The union tree in pre-order: head's order, each removed component right after its base predecessor."""
    head_to_base = {p: p for p in head.by_path if p in base.by_path}
    head_to_base.update(moved)
    matched_base = set(head_to_base.values())

    root = _Pair(head=head.root, base=base.root)
    out: list[_Pair] = []
    stack = [root]
    while stack:
        pair = stack.pop()
        out.append(pair)
        head_kids = pair.head.children if pair.head else []
        base_kids = pair.base.children if pair.base else []
        index = {head_to_base.get(k.path): i for i, k in enumerate(head_kids)}
        after: dict[int, list[Node]] = {}
        anchor = -1
        for k in base_kids:
            if k.path in index:
                anchor = index[k.path]
            elif k.path not in matched_base:  # removed (a moved one is listed where it is now)
                after.setdefault(anchor, []).append(k)
        kids = [_Pair(head=None, base=k) for k in after.get(-1, [])]
        for i, k in enumerate(head_kids):
            b = head_to_base.get(k.path)
            kids.append(_Pair(head=k, base=base.by_path[b] if b is not None else None))
            kids.extend(_Pair(head=None, base=r) for r in after.get(i, []))
        for kid in kids:
            kid.depth = pair.depth + 1
        pair.children = kids
        stack.extend(reversed(kids))
    return out


# --- moved components (issue 5) ----------------------------------------------------------------


def _match_moved(base: Tree, head: Tree) -> dict[str, str]:
    """Match components present on one side only by structure: head path -> base path.

    A removed component (base pre-order, so parents first) is matched to an added one
      1. under the new place of its moved parent with the same name and module type (the rest of a
         renamed or wrapped subtree follows its root, even where a layer inside it changed), else
      2. with the same module type, parameter count and child names, else
      3. for containers, with the same module type and child names (their content may have changed);
    among several candidates the one with the same name, then the closest depth, then the closest
    relative position wins. Parameter shapes are not in the rows; the parameter count stands in.
    """
    added = [n for n in head if n.path not in base.by_path]
    removed = [n for n in base if n.path not in head.by_path]
    if not added or not removed:
        return {}
    strict: dict[tuple[Any, ...], list[Node]] = {}
    loose: dict[tuple[Any, ...], list[Node]] = {}
    for n in added:
        strict.setdefault(_signature(n, strict=True), []).append(n)
        if n.children:
            loose.setdefault(_signature(n, strict=False), []).append(n)
    added_paths = {n.path for n in added}
    head_of: dict[str, str] = {}  # base path -> head path, for matched removed components
    taken: set[str] = set()
    n_base, n_head = max(len(base), 1), max(len(head), 1)
    for r in removed:
        parent = r.parent.path if r.parent else None
        new_parent = head_of.get(parent) if parent is not None else None
        if new_parent is not None:
            candidate = f"{new_parent}.{r['name']}" if new_parent else r["name"]
            if candidate in added_paths and candidate not in taken:
                node = head[candidate]
                if node["module_type"] == r["module_type"]:
                    head_of[r.path] = candidate
                    taken.add(candidate)
                    continue
        pools = [strict.get(_signature(r, strict=True), [])]
        if r.children:
            pools.append(loose.get(_signature(r, strict=False), []))
        for pool in pools:
            free = [a for a in pool if a.path not in taken]
            if free:
                best = min(
                    free,
                    key=lambda a: (
                        a["name"] != r["name"],
                        abs(a["depth"] - r["depth"]),
                        abs(a["order"] / n_head - r["order"] / n_base),
                    ),
                )
                head_of[r.path] = best.path
                taken.add(best.path)
                break
    return {h: b for b, h in head_of.items()}


def _signature(node: Node, strict: bool) -> tuple[Any, ...]:
    names = tuple(c["name"] for c in node.children)
    if strict:
        return (node["module_type"], node["is_leaf"], node["param_count"], names)
    return (node["module_type"], names)


# --- helpers -----------------------------------------------------------------------------------


def _rows_by_phase(rows: pl.DataFrame, side: str) -> dict[str, list[dict[str, Any]]]:
    needed = ("path", "parent", "phase", "order", "status", "call_count", "module_type", "depth", "name", "is_leaf")
    columns = set(needed) | set(DIFF_METRICS) | {"latency_p25_ms", "latency_p75_ms", "param_count"}
    absent = sorted(columns - set(rows.columns))
    if absent:
        raise CbsiteError(f"the {side} rows lack columns {absent}; are they components.parquet rows?")
    by_phase: dict[str, list[dict[str, Any]]] = {}
    for row in rows.select(sorted(columns)).to_dicts():
        by_phase.setdefault(row["phase"], []).append(row)
    return by_phase


def _tree(rows: list[dict[str, Any]], side: str, meta: dict[str, Any]) -> Tree:
    try:
        return build_tree(rows)
    except ValueError as exc:
        where = f"{meta.get('model', '?')}@{meta.get('version', '?')} ({meta.get('run_id', '?')})"
        raise CbsiteError(f"the {side} run {where} has a broken component tree: {exc}; collect it again") from exc


def _meta_from_rows(rows: pl.DataFrame) -> dict[str, Any]:
    if rows.height == 0:
        return {}
    first = rows.row(0, named=True)
    return {k: first.get(k) for k in ("model", "version", "run_id")}


def _warnings(
    base_meta: dict[str, Any],
    head_meta: dict[str, Any],
    base_by_phase: dict[str, Any],
    head_by_phase: dict[str, Any],
) -> list[str]:
    """Things that make the comparison less than like for like, in words."""
    out = []
    if base_meta.get("model") != head_meta.get("model"):
        out.append(
            f"comparing different models ({base_meta.get('model')} and {head_meta.get('model')}): "
            "components are aligned by path only"
        )
    for phase in schema.PHASES:
        if (phase in base_by_phase) != (phase in head_by_phase):
            side = "base" if phase in base_by_phase else "head"
            out.append(f"the {phase} phase is only in the {side} run and is not compared")
    b_dev, h_dev = _device_name(base_meta), _device_name(head_meta)
    if b_dev and h_dev and b_dev != h_dev:
        out.append(f"the runs were measured on different devices ({b_dev} and {h_dev}): latency deltas mix both")
    if base_meta.get("dtype") and head_meta.get("dtype") and base_meta["dtype"] != head_meta["dtype"]:
        out.append(f"the runs use different dtypes ({base_meta['dtype']} and {head_meta['dtype']})")
    b_depth = (base_meta.get("config") or {}).get("depth")
    h_depth = (head_meta.get("config") or {}).get("depth")
    if b_depth != h_depth and (base_meta.get("config") is not None and head_meta.get("config") is not None):
        out.append(
            f"the runs were collected to different depths ({b_depth} and {h_depth}): components below "
            "the shallower limit show as added or removed"
        )
    return out


def _device_name(meta: dict[str, Any]) -> str | None:
    device = meta.get("device")
    return device.get("name") if isinstance(device, dict) else None


def _identity(meta: dict[str, Any]) -> dict[str, Any]:
    return {k: meta.get(k) for k in ("model", "version", "run_id", "created_at")} | {
        "device": _device_name(meta),
        "dtype": meta.get("dtype"),
    }


def _check_metric(metric: str) -> None:
    if metric not in DIFF_METRICS:
        raise CbsiteError(f"unknown diff metric {metric!r}: use one of {', '.join(DIFF_METRICS)}")


def _sum(values: Iterable[float | None]) -> float | None:
    total: float = 0
    for v in values:
        if v is None:
            return None
        total += v
    return total


def _add(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def _json(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _sig3(value: float) -> str:
    text = f"{value:.3g}"
    return f"{value:.0f}" if "e" in text else text


def _pct(fraction: float) -> str:
    return f"{fraction * 100:.0f}%"


def _signed_pct(change: float) -> str:
    pct = change * 100
    if pct == 0:
        return "±0%"
    if abs(pct) >= 1:
        text = f"{abs(pct):.0f}%"
    elif abs(pct) >= 0.001:
        text = f"{abs(pct):.2g}%"
    else:
        text = "<0.001%"  # a real but tiny change: never shown as ±0%
    return ("+" if pct > 0 else MINUS) + text


def _short_type(module_type: str) -> str:
    return module_type.rsplit(".", 1)[-1]


def _capitalise(text: str) -> str:
    return text[:1].upper() + text[1:]
