"""Aligning two runs' phases and computing every per-forward number of a diff: deltas, own changes, noise, kinds
and moves, on numpy columns where the numbers allow and on plain lists (the reference) where they do not. The
rules are in cbsite/diff/rundiff.py's docstring; one run's phase as columns is cbsite/diff/sides.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from cbsite import schema
from cbsite.diff.record import (
    ADDITIVE_METRICS,
    DIFF_METRICS,
    REL_TOL,
    ComponentDelta,
    Total,
    is_change,
)
from cbsite.diff.sides import Numbers, Side

# --- one phase ---------------------------------------------------------------------------------


def diff_phase(
    phase: str, base: Side, head: Side, moved_paths: dict[str, str]
) -> tuple[dict[str, Total], list[ComponentDelta]]:
    head_to_base = {i: base.index[p] for i, p in enumerate(head.path) if p in base.index}
    moved = set()
    for hp, bp in moved_paths.items():
        if hp in head.index and bp in base.index:
            head_to_base[head.index[hp]] = base.index[bp]
            moved.add(head.index[hp])
    pairs = _union(base, head, head_to_base)
    bn, hn = base.numbers(), head.numbers()
    if bn is not None and hn is not None and all(bn.total[m].dtype == hn.total[m].dtype for m in DIFF_METRICS):
        return _diff_phase_numpy(phase, base, head, bn, hn, pairs, moved)
    return _diff_phase_reference(phase, base, head, pairs, moved)


_new = object.__new__


@dataclass
class _Aligned:
    """The union tree's positions (`_union`) as numpy columns: where each one is on each side (-1: absent)."""

    h_at: np.ndarray
    b_at: np.ndarray
    parent: np.ndarray
    depth: np.ndarray
    on_h: np.ndarray
    on_b: np.ndarray
    h_i: np.ndarray  # h_at with 0 where absent, to index with
    b_i: np.ndarray

    @staticmethod
    def of(pairs: list[tuple[int, int, int, int]]) -> _Aligned:
        table = np.array(pairs, dtype=np.int64).reshape(len(pairs), 4)
        h_at, b_at = table[:, 0], table[:, 1]
        on_h, on_b = h_at >= 0, b_at >= 0
        return _Aligned(h_at, b_at, table[:, 3], table[:, 2], on_h, on_b, np.where(on_h, h_at, 0), np.where(on_b, b_at, 0))


@dataclass
class _Deltas:
    """Per position and metric: both sides' values (lists, None where unknown or absent), deltas and own changes
    (numpy, with masks of the unknown ones)."""

    bvals: dict[str, list[Any]]
    hvals: dict[str, list[Any]]
    delta: dict[str, np.ndarray]
    delta_missing: dict[str, np.ndarray]
    own: dict[str, np.ndarray]
    own_missing: dict[str, np.ndarray]


def _diff_phase_numpy(phase: str, base: Side, head: Side, bn: Numbers, hn: Numbers,
                      pairs: list[tuple[int, int, int, int]], moved: set[int]) -> tuple[dict[str, Total], list[ComponentDelta]]:
    """`_diff_phase_reference` on numpy columns: the same results, bit for bit (tests/test_build_speed_diff.py)."""
    at = _Aligned.of(pairs)
    d = _numpy_deltas(bn, hn, at)
    _numpy_peak_own(d, at.parent)
    dl, dlm = d.delta["latency_ms"], d.delta_missing["latency_ms"]
    width_known = ~bn.width_missing[at.b_i] & ~hn.width_missing[at.h_i]
    latency_noise = (at.on_h & at.on_b & ~dlm & (dl != 0) & width_known
                     & (np.abs(dl) <= bn.width[at.b_i] + hn.width[at.h_i]))
    totals, root_delta = _numpy_totals(bn, hn, d, latency_noise, np.asarray(_counted(pairs, base, head)))
    kind = _numpy_kinds(bn, hn, d, at, moved, latency_noise)
    return totals, _numpy_components(phase, base, head, at, d, kind, latency_noise, root_delta)


def _numpy_deltas(bn: Numbers, hn: Numbers, at: _Aligned) -> _Deltas:
    def side_values(num: dict[str, np.ndarray], miss: dict[str, np.ndarray], m: str, idx: np.ndarray,
                    on: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # an absent side counts 0 ... a missing value never does
        v = num[m][idx]
        return np.where(on, v, np.zeros(1, dtype=v.dtype)), miss[m][idx] & on

    d = _Deltas({}, {}, {}, {}, {}, {})
    for m in DIFF_METRICS:
        hv, hm = side_values(hn.total, hn.total_missing, m, at.h_i, at.on_h)
        bv, bm = side_values(bn.total, bn.total_missing, m, at.b_i, at.on_b)
        d.delta[m], d.delta_missing[m] = hv - bv, hm | bm
        d.hvals[m] = _with_none(hv, hm | ~at.on_h)
        d.bvals[m] = _with_none(bv, bm | ~at.on_b)
        if m in ADDITIVE_METRICS:
            oh, ohm = side_values(hn.own, hn.own_missing, m, at.h_i, at.on_h)
            ob, obm = side_values(bn.own, bn.own_missing, m, at.b_i, at.on_b)
            d.own[m], d.own_missing[m] = oh - ob, ohm | obm
            if d.own[m].dtype.kind == "f":
                # Each side's own share is rounded to 0 against that side's totals (_compute_lists), so one side
                # may round and the other not; a self delta within rounding of the larger total is no change.
                d.own[m][np.abs(d.own[m]) <= REL_TOL * np.maximum(np.abs(hv), np.abs(bv))] = 0.0
    return d


def _numpy_peak_own(d: _Deltas, parent: np.ndarray) -> None:
    """Peak memory: the part of the change that no single child shows (cbsite/diff/rundiff.py's docstring)."""
    delta, dm = d.delta["peak_memory_bytes"], d.delta_missing["peak_memory_bytes"]
    zero = np.zeros(len(delta), dtype=delta.dtype)
    up, down = zero.copy(), zero.copy()
    kids = np.flatnonzero(~dm & (parent >= 0))
    np.maximum.at(up, parent[kids], delta[kids])
    np.minimum.at(down, parent[kids], delta[kids])
    d.own["peak_memory_bytes"] = delta - np.where(delta > 0, np.minimum(up, delta),
                                                  np.where(delta < 0, np.maximum(down, delta), zero))
    d.own_missing["peak_memory_bytes"] = dm


def _numpy_totals(bn: Numbers, hn: Numbers, d: _Deltas, latency_noise: np.ndarray,
                  counted: np.ndarray) -> tuple[dict[str, Total], dict[str, Any]]:
    totals: dict[str, Total] = {}
    root_delta: dict[str, Any] = {}
    for m in DIFF_METRICS:
        b_root = None if bn.total_missing[m][0] else bn.total[m][0].item()
        h_root = None if hn.total_missing[m][0] else hn.total[m][0].item()
        root_delta[m] = None if d.delta_missing[m][0] else d.delta[m][0].item()
        totals[m] = Total(
            metric=m,
            base=b_root,
            head=h_root,
            delta=root_delta[m],
            ratio=h_root / b_root if b_root not in (None, 0) and h_root is not None else None,
            noise=bool(latency_noise[0]) if m == "latency_ms" else False,
            complete=not (d.delta_missing[m] & counted).any(),
        )
    return totals, root_delta


def _numpy_kinds(bn: Numbers, hn: Numbers, d: _Deltas, at: _Aligned, moved: set[int],
                 latency_noise: np.ndarray) -> np.ndarray:
    """Classification: the first metric whose delta is a change decides (`_classify`, `is_change`)."""
    both = at.on_h & at.on_b
    kind = np.full(len(at.h_at), "unchanged", dtype=object)
    kind[~at.on_b] = "added"
    kind[~at.on_h] = "removed"
    if moved:
        kind[both & np.isin(at.h_at, list(moved))] = "moved"
    open_ = both & (kind == "unchanged")
    for m in DIFF_METRICS:
        dv = d.delta[m]
        change = ~d.delta_missing[m] & (dv != 0)
        if m == "latency_ms":
            change &= ~latency_noise
        if dv.dtype.kind == "f":
            hv, bv = hn.total[m][at.h_i], bn.total[m][at.b_i]
            change &= np.abs(dv) > REL_TOL * np.maximum(np.abs(bv), np.abs(hv))
        decided = open_ & change
        kind[decided & (dv > 0)] = "increased"
        kind[decided & (dv < 0)] = "decreased"
        open_ &= ~decided
    return kind


def _numpy_components(phase: str, base: Side, head: Side, at: _Aligned, d: _Deltas, kind: np.ndarray,
                      latency_noise: np.ndarray, root_delta: dict[str, Any]) -> list[ComponentDelta]:
    n = len(at.h_at)
    gaps = np.zeros(n, dtype=bool)
    for m in DIFF_METRICS:
        gaps |= d.delta_missing[m]
    missing: list[tuple[str, ...]] = [()] * n
    for k in np.flatnonzero(gaps).tolist():
        missing[k] = tuple(m for m in DIFF_METRICS if d.delta_missing[m][k])

    metrics = DIFF_METRICS
    deltas = [_with_none(d.delta[m], d.delta_missing[m]) for m in metrics]
    selfs = [_with_none(d.own[m], d.own_missing[m]) for m in metrics]
    shares = [_with_none(d.own[m] / root_delta[m], d.own_missing[m]) if root_delta[m] else [None] * n for m in metrics]
    noise_lists = [latency_noise.tolist() if m == "latency_ms" else [False] * n for m in metrics]
    # Each component's six dicts by metric, made column-wise by a dict display (a quarter of dict(zip(...))'s time:
    # twelve thousand dicts a diff of 1,000 components).
    bases = list(map(_by_metric, *(d.bvals[m] for m in metrics)))
    heads = list(map(_by_metric, *(d.hvals[m] for m in metrics)))
    delta_dicts = list(map(_by_metric, *deltas))
    self_dicts = list(map(_by_metric, *selfs))
    share_dicts = list(map(_by_metric, *shares))
    noise_dicts = list(map(_by_metric, *noise_lists))

    b_path, h_path, b_type, h_type = base.path, head.path, base.module_type, head.module_type
    b_status, h_status = base.status, head.status
    components = []
    for h, b, depth, kind_k, bv, hv, dv, sv, shv, nv, miss in zip(
            at.h_at.tolist(), at.b_at.tolist(), at.depth.tolist(), kind.tolist(), bases, heads, delta_dicts, self_dicts,
            share_dicts, noise_dicts, missing):
        c = _new(ComponentDelta)  # what the dataclass's __init__ sets, without its per-field object.__setattr__
        c.__dict__.update({
            "path": h_path[h] if h >= 0 else b_path[b],
            "phase": phase,
            "module_type": h_type[h] if h >= 0 else b_type[b],
            "depth": depth,
            "kind": kind_k,
            "base_path": b_path[b] if b >= 0 else None,
            "base": bv,
            "head": hv,
            "delta": dv,
            "self_delta": sv,
            "share": shv,
            "noise": nv,
            "status_base": b_status[b] if b >= 0 else None,
            "status_head": h_status[h] if h >= 0 else None,
            "missing": miss,
        })
        components.append(c)
    return components


def _by_metric(flops: Any, param_bytes: Any, peak_memory_bytes: Any, latency_ms: Any, bytes_moved: Any) -> dict[str, Any]:
    """One value per metric of DIFF_METRICS as a dict in its order (a display of constant keys: the quickest dict)."""
    return {"flops": flops, "param_bytes": param_bytes, "peak_memory_bytes": peak_memory_bytes, "latency_ms": latency_ms,
            "bytes_moved": bytes_moved}


if tuple(_by_metric(*DIFF_METRICS)) != DIFF_METRICS:  # a metric added or reordered must be added here too
    raise AssertionError("alignment._by_metric does not list DIFF_METRICS in order")


def _with_none(values: np.ndarray, missing: np.ndarray) -> list[Any]:
    """A numpy column as a list of Python ints or floats, with None where `missing`."""
    out = values.tolist()
    for k in np.flatnonzero(missing).tolist():
        out[k] = None
    return out


def _counted(pairs: list[tuple[int, int, int, int]], base: Side, head: Side) -> list[bool]:
    """Per aligned position: does its missing value leave a total incomplete? Not for a module that no forward
    called on any side it is on (skipped, call_count 0): it adds nothing to the model's totals."""
    def never(side: Side) -> list[bool]:
        calls = side.rows.get_column("call_count").to_list()
        return [c == 0 and st == "skipped" for c, st in zip(calls, side.status)]

    bn, hn = never(base), never(head)
    return [not ((h < 0 or hn[h]) and (b < 0 or bn[b])) for h, b, _, _ in pairs]


def _diff_phase_reference(phase: str, base: Side, head: Side, pairs: list[tuple[int, int, int, int]],
                          moved: set[int]) -> tuple[dict[str, Total], list[ComponentDelta]]:
    n = len(pairs)
    delta: dict[str, list[Any]] = {m: [None] * n for m in DIFF_METRICS}
    own: dict[str, list[Any]] = {m: [None] * n for m in DIFF_METRICS}
    latency_noise = [False] * n
    missing: list[tuple[str, ...]] = [()] * n
    # Largest child peak change in each direction, gathered children first (reverse pre-order).
    up: list[Any] = [0] * n
    down: list[Any] = [0] * n
    for k in range(n - 1, -1, -1):
        h, b, _, parent = pairs[k]
        gaps = []
        for m in DIFF_METRICS:
            hv = head.total[m][h] if h >= 0 else 0  # an absent side counts 0 ...
            bv = base.total[m][b] if b >= 0 else 0
            if hv is None or bv is None:  # ... a missing value never does
                gaps.append(m)
            else:
                delta[m][k] = hv - bv
        missing[k] = tuple(gaps)
        for m in ADDITIVE_METRICS:
            oh = head.own[m][h] if h >= 0 else 0
            ob = base.own[m][b] if b >= 0 else 0
            o = None if oh is None or ob is None else oh - ob
            hv = head.total[m][h] if h >= 0 else 0
            bv = base.total[m][b] if b >= 0 else 0
            if isinstance(o, float) and abs(o) <= REL_TOL * max(abs(hv or 0), abs(bv or 0)):
                o = 0.0  # within rounding of the larger side's total: no change (as _diff_phase_numpy)
            own[m][k] = o
        d = delta["peak_memory_bytes"][k]
        if d is not None:
            # Peak memory: the part of the change that no single child shows (cbsite/diff/rundiff.py's docstring).
            own["peak_memory_bytes"][k] = d - (min(up[k], d) if d > 0 else max(down[k], d) if d < 0 else 0)
            if parent >= 0:
                up[parent], down[parent] = max(up[parent], d), min(down[parent], d)
        dl = delta["latency_ms"][k]
        if h >= 0 and b >= 0 and dl:
            width = _add(base.width[b], head.width[h])
            latency_noise[k] = width is not None and abs(dl) <= width

    totals: dict[str, Total] = {}
    for m in DIFF_METRICS:
        b_root, h_root, d = base.total[m][0], head.total[m][0], delta[m][0]
        totals[m] = Total(
            metric=m,
            base=b_root,
            head=h_root,
            delta=d,
            ratio=h_root / b_root if b_root not in (None, 0) and h_root is not None else None,
            noise=latency_noise[0] if m == "latency_ms" else False,
            complete=not any(m in gaps for gaps, c in zip(missing, _counted(pairs, base, head)) if c),
        )

    components = []
    absent = dict.fromkeys(DIFF_METRICS)
    for k, (h, b, depth, _) in enumerate(pairs):
        side, i = (head, h) if h >= 0 else (base, b)
        noise = {m: latency_noise[k] if m == "latency_ms" else False for m in DIFF_METRICS}
        d = {m: delta[m][k] for m in DIFF_METRICS}
        bvals = {m: base.total[m][b] for m in DIFF_METRICS} if b >= 0 else dict(absent)
        hvals = {m: head.total[m][h] for m in DIFF_METRICS} if h >= 0 else dict(absent)
        if b < 0:
            kind = "added"
        elif h < 0:
            kind = "removed"
        elif h in moved:
            kind = "moved"
        else:
            kind = _classify(bvals, hvals, d, noise)
        components.append(
            ComponentDelta(
                path=side.path[i],
                phase=phase,
                module_type=side.module_type[i],
                depth=depth,
                kind=kind,
                base_path=base.path[b] if b >= 0 else None,
                base=bvals,
                head=hvals,
                delta=d,
                self_delta={m: own[m][k] for m in DIFF_METRICS},
                share={
                    m: own[m][k] / totals[m].delta if own[m][k] is not None and totals[m].delta else None
                    for m in DIFF_METRICS
                },
                noise=noise,
                status_base=base.status[b] if b >= 0 else None,
                status_head=head.status[h] if h >= 0 else None,
                missing=missing[k],
            )
        )
    return totals, components


def _classify(base: dict[str, Any], head: dict[str, Any], delta: dict[str, Any], noise: dict[str, bool]) -> str:
    """The first metric of DIFF_METRICS that changed decides (cbsite/diff/rundiff.py's docstring)."""
    for m in DIFF_METRICS:
        if delta[m] is None or noise[m]:
            continue
        if is_change(m, base[m], head[m], delta[m]):
            return "increased" if delta[m] > 0 else "decreased"
    return "unchanged"




def _union(base: Side, head: Side, head_to_base: dict[int, int]) -> list[tuple[int, int, int, int]]:
    """The union tree in pre-order as (head index, base index, depth, parent position), -1 for absent:
    head's order, each removed component right after its predecessor among its base siblings."""
    matched_base = set(head_to_base.values())
    out: list[tuple[int, int, int, int]] = []
    stack = [(0, 0, 0, -1)]
    while stack:
        h, b, depth, parent = stack.pop()
        me = len(out)
        out.append((h, b, depth, parent))
        head_kids = head.children[h] if h >= 0 else []
        base_kids = base.children[b] if b >= 0 else []
        kids = [(k, head_to_base.get(k, -1)) for k in head_kids]
        if base_kids:
            position = {head_to_base[k]: i for i, k in enumerate(head_kids) if k in head_to_base}
            after: dict[int, list[int]] = {}
            anchor = -1
            for k in base_kids:
                if k in position:
                    anchor = position[k]
                elif k not in matched_base:  # removed (a moved one is listed where it is now)
                    after.setdefault(anchor, []).append(k)
            if after:
                merged = [(-1, r) for r in after.get(-1, ())]
                for i, kid in enumerate(kids):
                    merged.append(kid)
                    merged.extend((-1, r) for r in after.get(i, ()))
                kids = merged
        stack.extend((hk, bk, depth + 1, me) for hk, bk in reversed(kids))
    return out


# --- moved components --------------------------------------------------------------------------


def match_moved(base: Side, head: Side) -> dict[str, str]:
    """Match components present on one side only by structure: head path -> base path.

    A removed component (base pre-order, so parents first) is matched to an added one
      1. under the new place of its moved parent with the same name and module type (the rest of a
         renamed or wrapped subtree follows its root, even where a layer inside it changed), else
      2. with the same module type, parameter count and child names, else
      3. for containers, with the same module type and child names (their content may have changed);
    among several candidates the one with the same name, then the closest depth, then the closest
    relative position wins. Parameter shapes are not in the rows; the parameter count stands in.
    """
    added = [i for i, p in enumerate(head.path) if p not in base.index]
    removed = [i for i, p in enumerate(base.path) if p not in head.index]
    if not added or not removed:
        return {}

    def signature(side: Side, i: int, strict: bool) -> tuple[Any, ...]:
        names = tuple(side.name[c] for c in side.children[i])
        return (side.module_type[i], side.param_count[i], names) if strict else (side.module_type[i], names)

    strict: dict[tuple[Any, ...], list[int]] = {}
    loose: dict[tuple[Any, ...], list[int]] = {}
    for a in added:
        strict.setdefault(signature(head, a, True), []).append(a)
        if head.children[a]:
            loose.setdefault(signature(head, a, False), []).append(a)
    added_set = set(added)
    head_of: dict[int, int] = {}  # base index -> head index, for matched removed components
    taken: set[int] = set()
    n_base, n_head = len(base.path), len(head.path)
    for r in removed:
        new_parent = head_of.get(base.parent[r])
        if new_parent is not None:
            candidate = head.index.get(_child_path(head.path[new_parent], base.name[r]), -1)
            if candidate in added_set and candidate not in taken and head.module_type[candidate] == base.module_type[r]:
                head_of[r] = candidate
                taken.add(candidate)
                continue
        pools = [strict.get(signature(base, r, True), [])]
        if base.children[r]:
            pools.append(loose.get(signature(base, r, False), []))
        for pool in pools:
            free = [a for a in pool if a not in taken]
            if free:
                best = min(
                    free,
                    key=lambda a: (
                        head.name[a] != base.name[r],
                        abs(head.depth[a] - base.depth[r]),
                        abs(a / n_head - r / n_base),
                    ),
                )
                head_of[r] = best
                taken.add(best)
                break
    return {head.path[h]: base.path[b] for b, h in head_of.items()}


def _child_path(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name


# --- the runs' metadata ------------------------------------------------------------------------


def meta_from_rows(rows: pl.DataFrame) -> dict[str, Any]:
    if rows.height == 0:
        return {}
    first = rows.row(0, named=True)
    return {k: first.get(k) for k in ("model", "version", "run_id")}


def warnings(
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
    b_dev, h_dev = device_name(base_meta), device_name(head_meta)
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


def device_name(meta: dict[str, Any]) -> str | None:
    device = meta.get("device")
    return device.get("name") if isinstance(device, dict) else None



def _add(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b

