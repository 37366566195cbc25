"""One run's phase as the diff reads it: the component tree in pre-order (plain lists) and its per-forward totals,
own shares and latency widths (numpy columns, with the plain-list reference they reproduce bit for bit). The
rules are in cbsite/diff/rundiff.py's docstring."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from cbsite import schema
from cbsite.diff.record import ADDITIVE_METRICS, DIFF_METRICS, PER_CALL_METRICS, REL_TOL
from cbsite.errors import CbsiteError

# Columns the diff reads; everything else in a row is presentation.
_COLUMNS = ("path", "parent", "phase", "order", "status", "call_count", "module_type", "param_count",
            "latency_p25_ms", "latency_p75_ms") + DIFF_METRICS
# Integer sums below this (and their differences) stay exact in int64 and in float64, so numpy gives what Python's integers give, to the bit
# (sums, differences and true divisions alike); an archive with larger numbers takes the plain-Python path.
_EXACT = float(2 ** 52)


class Side:
    """One run's phase in pre-order: structure as plain lists indexed by pre-order position (`_union` and
    `match_moved` walk them), and per-forward totals, own shares and IQR widths as numpy columns (`numbers`), so a
    diff of 1,000 components takes milliseconds (a site of many runs computes many diffs).

    `total`, `own` and `width` are the same numbers as plain lists (None for missing), computed the first time they
    are asked for: the reference that the numpy path reproduces bit for bit (tests/test_build_speed_diff.py), and the path
    taken where numpy could not (integers beyond 2**53, a metric of another type; see `numbers`).
    """

    def __init__(self, rows: pl.DataFrame, broken: Any) -> None:
        rows = rows.sort("order")
        self.rows = rows
        n = rows.height
        col = {c: rows.get_column(c).to_list() for c in ("path", "parent", "module_type", "status", "param_count")}
        self.path: list[str] = col["path"]
        self.name = [p.rsplit(".", 1)[-1] for p in self.path]
        self.module_type: list[str] = col["module_type"]
        self.status: list[str] = col["status"]
        self.param_count: list[int | None] = col["param_count"]
        self.index: dict[str, int] = {}
        for i, p in enumerate(self.path):
            if p in self.index:
                raise broken(f"component {p!r} appears twice")
            self.index[p] = i
        if n == 0 or self.path[0] != "":
            raise broken("the root component (path '') is missing or not first in `order`")
        self.parent = [-1] * n
        self.depth = [0] * n
        self.children: list[list[int]] = [[] for _ in range(n)]
        for i, pp in enumerate(col["parent"]):
            if i == 0:
                continue
            j = self.index.get(pp, -1) if pp is not None else -1
            if not 0 <= j < i:  # pre-order: a parent comes before its children
                raise broken(f"component {self.path[i]!r} names parent {pp!r}, which has no row before it")
            self.parent[i] = j
            self.depth[i] = self.depth[j] + 1
            self.children[j].append(i)
        self._lists: tuple[Any, Any, Any] | None = None
        self._numbers: Any = False  # not computed yet

    # --- the numbers as plain lists (the reference) ---

    @property
    def total(self) -> dict[str, list[Any]]:
        return self._reference()[0]

    @property
    def own(self) -> dict[str, list[Any]]:
        return self._reference()[1]

    @property
    def width(self) -> list[float | None]:
        return self._reference()[2]

    def _reference(self) -> tuple[Any, Any, Any]:
        if self._lists is None:
            self._lists = self._compute_lists()
        return self._lists

    def _compute_lists(self) -> tuple[Any, Any, Any]:
        n = len(self.path)
        col = {c: self.rows.get_column(c).to_list()
               for c in ("call_count", "latency_p25_ms", "latency_p75_ms") + DIFF_METRICS}
        calls = [max(c or 0, 1) for c in col["call_count"]]  # a never-called container counts once
        totals: dict[str, list[Any]] = {}
        for m in DIFF_METRICS:
            values = [None if v is None or v != v else v for v in col[m]]  # NaN is missing too
            if m in PER_CALL_METRICS:
                values = [None if v is None else v * c for v, c in zip(values, calls)]
            totals[m] = values

        # Own share = total - children's totals; unknown when any of them is unknown.
        owns: dict[str, list[Any]] = {}
        for m in ADDITIVE_METRICS:
            total = totals[m]
            rest: list[Any] = [0] * n
            unknown = [False] * n
            for i in range(n - 1, 0, -1):
                if total[i] is None:
                    unknown[self.parent[i]] = True
                else:
                    rest[self.parent[i]] += total[i]
            own: list[Any] = [None] * n
            for i in range(n):
                if total[i] is None or unknown[i]:
                    continue
                o = total[i] - rest[i]
                if isinstance(o, float) and abs(o) <= REL_TOL * max(abs(total[i]), abs(rest[i])):
                    o = 0.0  # rounding of an estimated container's float sum, not a share
                own[i] = o
            owns[m] = own

        # Per-forward latency spread; a node without percentiles (an estimate) takes the sum of its
        # children's, an upper bound.
        p25, p75 = col["latency_p25_ms"], col["latency_p75_ms"]
        width: list[float | None] = [None] * n
        kids_width = [0.0] * n
        kids_unknown = [False] * n
        for i in range(n - 1, -1, -1):
            if p25[i] is not None and p75[i] is not None:
                width[i] = (p75[i] - p25[i]) * calls[i]
            elif self.children[i] and not kids_unknown[i]:
                width[i] = kids_width[i]
            if i:
                if width[i] is None:
                    kids_unknown[self.parent[i]] = True
                else:
                    kids_width[self.parent[i]] += width[i]  # type: ignore[operator]
        return totals, owns, width

    # --- the same numbers as numpy columns ---

    def numbers(self) -> Numbers | None:
        """The numbers as numpy columns; None where they would not be bit for bit the reference's: a metric
        neither integer nor float, or integers whose sums reach 2**53."""
        if self._numbers is False:
            self._numbers = Numbers.of(self)
        return self._numbers


@dataclass
class Numbers:
    """A side's per-forward totals, own shares and latency widths as numpy columns, with masks of the unknown
    ones. Sums run in the reference's order (children in reverse pre-order), so float results are the same bits."""

    total: dict[str, np.ndarray]
    total_missing: dict[str, np.ndarray]
    own: dict[str, np.ndarray]
    own_missing: dict[str, np.ndarray]
    width: np.ndarray
    width_missing: np.ndarray

    @staticmethod
    def of(side: Side) -> Numbers | None:
        rows, n = side.rows, len(side.path)
        # Series.to_numpy, not polars' own null handling: each polars operation on a Series costs a query, and a
        # diff would make hundreds of them.
        calls_col = _array(rows.get_column("call_count"))
        if calls_col is None or calls_col[0].dtype.kind != "i":
            return None
        calls = np.maximum(calls_col[0], 1)  # a never-called container (or none recorded) counts once
        parent = np.asarray(side.parent, dtype=np.int64)
        rev = np.arange(n - 1, 0, -1)  # every child, in reverse pre-order
        total: dict[str, np.ndarray] = {}
        total_missing: dict[str, np.ndarray] = {}
        for m in DIFF_METRICS:
            column = _array(rows.get_column(m))
            if column is None:
                return None
            values, missing = column
            if values.dtype.kind == "f":
                missing = missing | np.isnan(values)  # NaN is missing too
            if values.dtype.kind == "i":
                size = np.abs(values.astype(np.float64))
                if (size * calls if m in PER_CALL_METRICS else size).sum() >= _EXACT:
                    return None
            if m in PER_CALL_METRICS:
                values = values * calls
            values = np.where(missing, np.zeros(1, dtype=values.dtype), values)
            total[m], total_missing[m] = values, missing

        own: dict[str, np.ndarray] = {}
        own_missing: dict[str, np.ndarray] = {}
        for m in ADDITIVE_METRICS:
            t, miss = total[m], total_missing[m]
            unknown = np.zeros(n, dtype=bool)
            unknown[parent[rev[miss[rev]]]] = True
            known = rev[~miss[rev]]
            rest = np.zeros(n, dtype=t.dtype)
            np.add.at(rest, parent[known], t[known])  # one by one, in this order: the reference's sums
            o = t - rest
            if o.dtype.kind == "f":
                # rounding of an estimated container's float sum, not a share
                o[np.abs(o) <= REL_TOL * np.maximum(np.abs(t), np.abs(rest))] = 0.0
            own[m], own_missing[m] = o, miss | unknown

        # Per-forward latency spread, level by level from the deepest: a node without percentiles takes the sum
        # of its children's widths (all one level below it), added in reverse pre-order as the reference does.
        p25s, p75s = _array(rows.get_column("latency_p25_ms")), _array(rows.get_column("latency_p75_ms"))
        if p25s is None or p75s is None:
            return None
        has = ~(p25s[1] | p75s[1])  # percentiles present (a NaN is present, and gives a NaN width, as in the reference)
        width = np.where(has, (p75s[0].astype(np.float64) - p25s[0]) * calls, 0.0)
        width_missing = ~has
        has_kids = np.bincount(parent[1:], minlength=n)[:n] > 0 if n > 1 else np.zeros(n, dtype=bool)
        kids_width = np.zeros(n)
        kids_unknown = np.zeros(n, dtype=bool)
        depth = np.asarray(side.depth, dtype=np.int64)
        by_depth = depth[rev]
        for d in range(int(depth.max()), 0, -1):
            level = rev[by_depth == d]  # this level's nodes, in reverse pre-order
            est = level[~has[level]]
            ok = has_kids[est] & ~kids_unknown[est]
            width[est[ok]] = kids_width[est[ok]]
            width_missing[est] = ~ok
            miss = width_missing[level]
            kids_unknown[parent[level[miss]]] = True
            np.add.at(kids_width, parent[level[~miss]], width[level[~miss]])
        if not has[0]:
            if has_kids[0] and not kids_unknown[0]:
                width[0], width_missing[0] = kids_width[0], False
            else:
                width_missing[0] = True
        return Numbers(total, total_missing, own, own_missing, width, width_missing)


def _array(column: pl.Series) -> tuple[np.ndarray, np.ndarray] | None:
    """A numeric column as numpy: int64 (integers) or float64 values, 0 where null, and the nulls' mask; None for
    a column of another type, or integers that a float64 would not hold exactly."""
    n = column.len()
    if column.dtype == pl.Null:
        return np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool)
    nulls = column.null_count()
    if column.dtype.is_integer():
        values = column.to_numpy()  # float64 with NaN for the nulls when there are any
        if not nulls:
            if values.dtype.kind == "u" and n and values.max() >= 2 ** 62:
                return None
            return values.astype(np.int64, copy=False), np.zeros(n, dtype=bool)
        missing = np.isnan(values)
        values = np.where(missing, 0.0, values)
        if n and np.abs(values).max() >= _EXACT:
            return None
        return values.astype(np.int64), missing
    if column.dtype.is_float():
        values = column.to_numpy().astype(np.float64, copy=False)
        if not nulls:
            return values, np.zeros(n, dtype=bool)
        missing = column.is_null().to_numpy()
        return np.where(missing, 0.0, values), missing
    return None


def sides(rows: pl.DataFrame, side: str, meta: dict[str, Any]) -> dict[str, Side]:
    absent = sorted(set(_COLUMNS) - set(rows.columns))
    if absent:
        raise CbsiteError(f"the {side} rows lack columns {absent}; are they components.parquet rows?")
    where = f"{meta.get('model', '?')}@{meta.get('version', '?')} ({meta.get('run_id', '?')})"

    def broken(problem: str) -> CbsiteError:
        return CbsiteError(f"the {side} run {where} has a broken component tree: {problem}; collect it again")

    by_phase = rows.select(_COLUMNS).partition_by("phase", as_dict=True)
    return {phase: Side(by_phase[(phase,)], broken) for phase in schema.PHASES if (phase,) in by_phase}


