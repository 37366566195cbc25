"""Latency verdicts: the statistical decision behind `cbsite compare`, `--rounds` and the gate.

Pure data in, `Verdict`s out: no torch, no rendering. The tests and distributions are scipy.stats'
(`ttest_1samp`, `ttest_ind`, `t`); only Holm's step-down, a few lines of arithmetic on p-values, is
written here.

Units
-----
A *unit* is what carries the noise shared by a whole measurement: one worker **process** of a
paired comparison (base and head timed in interleaved A/B block pairs inside it), or one **round**
(a fresh process) of an independent run. Everything is judged on log ratios head/base, so a ratio
of 1.10 and one of 1/1.10 are equally far from "no change".

* `paired(x)`: x_i is the per-process median over its block pairs of log(head/base)
  (`per_process_log_ratios` derives it from the raw samples). Tests:
  `scipy.stats.ttest_1samp(x, 0, alternative="greater")` gives `p_regressed` (H0: ratio <= 1),
  `alternative="less"` gives `p_improved` (H0: ratio >= 1). `ratio = exp(mean(x))`; the 95 %
  interval is the two-sided result's `confidence_interval(0.95)`, exponentiated.
  `spread = sd(x)` (ddof 1); `n = len(x)`; degrees of freedom n - 1.
* `unpaired(base, head)`: base and head are per-round log medians of two independent runs.
  Welch's test `scipy.stats.ttest_ind(head, base, equal_var=False, alternative=...)`; the interval is
  its `confidence_interval` on mean(head) - mean(base), exponentiated. `n` is the smaller of the two
  round counts (rounds per run); `spread = sqrt(sd(base)**2 + sd(head)**2)`, the spread of the log
  ratio of one head round over one base round, so that spread/sqrt(n) is the standard error with n
  rounds on each side, as in the paired case. `needed` counts rounds per run.

Verdicts (alpha: level, default `ALPHA` = 1 %; floor: smallest relative change worth calling,
default `FLOOR` = 5 %; delta = log(1 + floor))
--------
* **regressed**: p_regressed < alpha and ratio >= 1 + floor.
* **improved**: p_improved < alpha and ratio <= 1 / (1 + floor).
* **unchanged**: equivalence is shown (TOST at alpha): the two-sided (1 - 2 alpha) interval of the
  mean log ratio lies strictly inside (-delta, +delta). A change as large as the floor is ruled out.
* **inconclusive**: anything else. `needed` is the smallest number of units above the current one
  (searched up to `MAX_UNITS` = 1000) at which, keeping the observed mean m and spread s, a decision would be reached:
  either |m| >= delta and |m| > t(1 - alpha, df) * s / sqrt(n) (regressed or improved), or
  |m| + t(1 - alpha, df) * s / sqrt(n) < delta (unchanged); df = n - 1 (paired) or Welch's df with
  n rounds on each side. None when no such n exists (the mean sits on the floor, or too close to it).
* **not judged**: fewer than 2 units (on either side, unpaired) or any non-finite value. The reason
  says what to collect (`cbsite compare` with several processes, `cbsite collect --rounds N`). The
  point estimate `ratio` is still given when every value is finite; nothing else is.
* `detectable`: exp((t(1 - alpha, df) + t(0.8, df)) * s / sqrt(n)) - 1, the smallest relative change
  this n and spread would detect at alpha with 80 % power (the usual t approximation: the exact
  noncentral-t power at that change is 0.78 with 6 units, 0.73 with 3). It ignores the floor: a
  change below the floor is never called regressed whatever the power.

Zero spread (all units identical, sd <= `ZERO_SPREAD`): the t statistic is undefined, so the
decision is made from the mean alone: the interval collapses to the point, p_regressed is 0 when the
mean is above 0 and 1 otherwise (p_improved mirrored), `detectable` is 0. Such a verdict is always
regressed, improved or unchanged, never inconclusive, and its reason says "no spread".

Families (`judge_family`)
-------------------------
A gate rule that covers many components judges them as a family: Holm's step-down adjustment is
applied to the p_regressed values of all judged members and, separately, to their p_improved
values; verdicts are then recomputed with the adjusted p-values (which is what the Verdict's
`p_regressed`/`p_improved` then hold). Equivalence (unchanged) stays per member, unadjusted: it is
an intersection-union test and needs no correction. Members that are "not judged" are left out of
the family (they do not count in its size). In a family, `needed` and `detectable` use alpha / m
(Bonferroni, m the family size) for the regression/improvement side: a Holm-adjusted p-value is at
most m times the raw one, so that estimate suffices whatever the other members do (an upper bound).

Vectorised forms: `paired_many` and `unpaired_many` judge many independent comparisons at once with
exactly the result of calling `paired`/`unpaired` on each, without a family correction.
"""

from __future__ import annotations

import math
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import lru_cache
from types import ModuleType
from typing import Any, Hashable, Mapping, Sequence, TypeVar

import numpy as np
import polars as pl

from cbsite import format as cfmt


@lru_cache(maxsize=1)
def _scipy_stats() -> ModuleType:
    # Imported on first use: scipy.stats takes about a second to import, and most commands that import this
    # module (a site build, `ls`) never run a test.
    from scipy import stats

    return stats


__all__ = [
    "ALPHA",
    "FLOOR",
    "MAX_UNITS",
    "VERDICTS",
    "Verdict",
    "holm",
    "judge_family",
    "paired",
    "paired_many",
    "per_process_log_ratios",
    "unpaired",
    "unpaired_many",
]

ALPHA = 0.01
"""Default level of the one-sided tests (and of the equivalence test)."""
FLOOR = 0.05
"""Default magnitude floor: the smallest relative change worth calling (5 %)."""
MAX_UNITS = 1000
"""`needed` is searched up to this many units."""
POWER = 0.8
"""Power behind `detectable`."""
ZERO_SPREAD = 1e-12
"""A sample standard deviation of the log ratios at or below this counts as no spread."""
VERDICTS = ("regressed", "improved", "unchanged", "inconclusive", "not judged")


@dataclass(frozen=True)
class Verdict:
    verdict: str  # "regressed" | "improved" | "unchanged" | "inconclusive" | "not judged"
    ratio: float | None  # head/base point estimate = exp(mean of per-unit log ratios)
    ci_low: float | None  # 95 % interval of the ratio (two-sided, t distribution)
    ci_high: float | None
    p_regressed: float | None  # one-sided p of H0: ratio <= 1 (Holm-adjusted in a family)
    p_improved: float | None  # one-sided p of H0: ratio >= 1
    n: int  # units (processes or rounds per run) behind it
    spread: float | None  # sample sd of the per-unit log ratios
    needed: int | None  # when inconclusive: units estimated to reach a decision
    detectable: float | None  # smallest relative change detectable (0.04 = 4 %)
    reason: str  # one line a reader can act on

    def to_dict(self) -> dict:
        """JSON-safe: plain Python numbers, None for NaN or infinite values."""
        out: dict[str, Any] = {}
        for key, value in asdict(self).items():
            if isinstance(value, (float, np.floating)):
                value = float(value)
                out[key] = value if math.isfinite(value) else None
            elif isinstance(value, np.integer):
                out[key] = int(value)
            else:
                out[key] = value
        return out


# ---------------------------------------------------------------------------------------------
# Estimates (one per comparison) and the decision made from them


@dataclass
class _Estimate:
    paired: bool
    n: int
    mean: float | None = None  # log ratio
    spread: float | None = None
    df: float | None = None  # degrees of freedom at the observed n
    df_factor: float = 1.0  # df at n units = (n - 1) * df_factor (Welch with equal arms)
    p_regressed: float | None = None
    p_improved: float | None = None
    ci95: tuple[float, float] | None = None  # log scale
    ci_equiv: tuple[float, float] | None = None  # log scale, two-sided 1 - 2 alpha
    not_judged: str | None = None

    @property
    def zero_spread(self) -> bool:
        return self.spread is not None and self.spread <= ZERO_SPREAD

    @property
    def unit(self) -> str:
        return "processes" if self.paired else "rounds"


@contextmanager
def _quiet():
    """scipy warns on nearly identical samples (one constant arm); the result is still right."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Precision loss", category=RuntimeWarning)
        yield


def _as_array(values: Sequence[float]) -> np.ndarray:
    return np.asarray([np.nan if v is None else v for v in values], dtype=np.float64).ravel()


def _plural(n: int, unit: str) -> str:
    return f"{n} {unit}" if n != 1 else f"1 {unit[:-2] if unit == 'processes' else unit[:-1]}"


def _estimate_paired(rows: Sequence[Sequence[float]], alpha: float) -> list[_Estimate]:
    arrays = [_as_array(r) for r in rows]
    out: list[_Estimate | None] = [None] * len(arrays)
    groups: dict[int, list[int]] = {}
    for i, x in enumerate(arrays):
        n = len(x)
        if not np.all(np.isfinite(x)):
            out[i] = _Estimate(True, n, not_judged=(
                f"not judged: a non-finite value among the {_plural(n, 'processes')} (a failed or "
                "missing block); re-collect with `cbsite compare`"))
        elif n < 2:
            out[i] = _Estimate(True, n, mean=float(x[0]) if n else None, not_judged=(
                f"not judged: {_plural(n, 'processes')}; collect with `cbsite compare` "
                "(2 or more processes, about 6)"))
        else:
            groups.setdefault(n, []).append(i)
    for n, idx in groups.items():
        X = np.stack([arrays[i] for i in idx])
        mean = X.mean(axis=1)
        sd = X.std(axis=1, ddof=1)
        live = sd > ZERO_SPREAD
        res = {}
        if live.any():
            Y = X[live]
            with _quiet():
                two = _scipy_stats().ttest_1samp(Y, 0.0, axis=1)
                greater = _scipy_stats().ttest_1samp(Y, 0.0, axis=1, alternative="greater")
                less = _scipy_stats().ttest_1samp(Y, 0.0, axis=1, alternative="less")
                ci95 = two.confidence_interval(0.95)
                cieq = two.confidence_interval(1.0 - 2.0 * alpha)
            for j, row in enumerate(np.flatnonzero(live)):
                res[int(row)] = (float(greater.pvalue[j]), float(less.pvalue[j]),
                                 (float(ci95.low[j]), float(ci95.high[j])),
                                 (float(cieq.low[j]), float(cieq.high[j])))
        for k, i in enumerate(idx):
            m = float(mean[k])
            est = _Estimate(True, n, mean=m, spread=float(sd[k]), df=float(n - 1))
            if k in res:
                est.p_regressed, est.p_improved, est.ci95, est.ci_equiv = res[k]
            else:
                _zero_spread(est)
            out[i] = est
    return out  # type: ignore[return-value]


def _estimate_unpaired(rows: Sequence[tuple[Sequence[float], Sequence[float]]],
                       alpha: float) -> list[_Estimate]:
    arrays = [(_as_array(b), _as_array(h)) for b, h in rows]
    out: list[_Estimate | None] = [None] * len(arrays)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (b, h) in enumerate(arrays):
        n = min(len(b), len(h))
        if not (np.all(np.isfinite(b)) and np.all(np.isfinite(h))):
            out[i] = _Estimate(False, n, not_judged=(
                f"not judged: a non-finite round (base {len(b)}, head {len(h)} rounds); "
                "re-collect with `cbsite collect --rounds N` or `cbsite compare`"))
        elif n < 2:
            mean = float(h.mean() - b.mean()) if len(b) and len(h) else None
            what = "single-round runs" if len(b) <= 1 and len(h) <= 1 else (
                f"base {_plural(len(b), 'rounds')}, head {_plural(len(h), 'rounds')}")
            out[i] = _Estimate(False, n, mean=mean, not_judged=(
                f"not judged: {what}; collect with `cbsite compare` or "
                "`cbsite collect --rounds N` (N >= 2)"))
        else:
            groups.setdefault((len(b), len(h)), []).append(i)
    for (nb, nh), idx in groups.items():
        B = np.stack([arrays[i][0] for i in idx])
        H = np.stack([arrays[i][1] for i in idx])
        mean = H.mean(axis=1) - B.mean(axis=1)
        vb = B.var(axis=1, ddof=1)
        vh = H.var(axis=1, ddof=1)
        spread = np.sqrt(vb + vh)
        live = spread > ZERO_SPREAD
        res = {}
        if live.any():
            with _quiet():
                two = _scipy_stats().ttest_ind(H[live], B[live], axis=1, equal_var=False)
                greater = _scipy_stats().ttest_ind(H[live], B[live], axis=1, equal_var=False, alternative="greater")
                less = _scipy_stats().ttest_ind(H[live], B[live], axis=1, equal_var=False, alternative="less")
                ci95 = two.confidence_interval(0.95)
                cieq = two.confidence_interval(1.0 - 2.0 * alpha)
            for j, row in enumerate(np.flatnonzero(live)):
                res[int(row)] = (float(greater.pvalue[j]), float(less.pvalue[j]),
                                 (float(ci95.low[j]), float(ci95.high[j])),
                                 (float(cieq.low[j]), float(cieq.high[j])), float(two.df[j]))
        for k, i in enumerate(idx):
            est = _Estimate(False, min(nb, nh), mean=float(mean[k]), spread=float(spread[k]))
            if k in res:
                est.p_regressed, est.p_improved, est.ci95, est.ci_equiv, est.df = res[k]
                a, c = float(vb[k]), float(vh[k])
                est.df_factor = (a + c) ** 2 / (a * a + c * c)  # Welch's df with n rounds a side
            else:
                est.df = float(nb + nh - 2)
                _zero_spread(est)
            out[i] = est
    return out  # type: ignore[return-value]


def _zero_spread(est: _Estimate) -> None:
    m = est.mean
    assert m is not None  # both estimators set the mean of every estimate they judge
    est.spread = 0.0
    est.p_regressed = 0.0 if m > 0 else 1.0
    est.p_improved = 0.0 if m < 0 else 1.0
    est.ci95 = (m, m)
    est.ci_equiv = (m, m)


def _needed(est: _Estimate, alpha_effect: float, alpha: float, delta: float) -> int | None:
    """Smallest n > est.n (up to MAX_UNITS) at which the observed mean and spread would decide.

    With |m| >= delta only regressed/improved is reachable: |m| > t(1 - alpha_effect, df) s / sqrt(n);
    below it only unchanged: |m| + t(1 - alpha, df) s / sqrt(n) < delta. Both conditions are monotone
    in n; the normal quantile (below every t quantile) gives a lower bound to start the scan from, so
    only a few t quantiles are ever computed.
    """
    assert est.mean is not None and est.spread is not None  # a judged estimate (see `_decide`)
    m, s = abs(est.mean), est.spread
    if m >= delta:
        q, margin = 1.0 - alpha_effect, m
    else:
        q, margin = 1.0 - alpha, delta - m
    if margin <= 0:  # a mean of exactly 0 against a zero floor: no number of units decides
        return None
    bound = (_z(q) * s / margin) ** 2  # n must exceed this even with infinite df
    if bound >= MAX_UNITS:
        return None
    lo = max(est.n + 1, 2, int(bound))
    chunk = 16
    while lo <= MAX_UNITS:
        hi = min(lo + chunk, MAX_UNITS + 1)
        n = np.arange(lo, hi, dtype=np.float64)
        ok = _t_quantiles(q, est.df_factor, lo, hi) * s / np.sqrt(n) < margin
        if ok.any():
            return int(n[np.argmax(ok)])
        lo = hi
        chunk *= 2
    return None


@lru_cache(maxsize=64)
def _z(q: float) -> float:
    return float(_scipy_stats().norm.ppf(q))


@lru_cache(maxsize=4096)
def _t_quantiles(q: float, df_factor: float, lo: int, hi: int) -> np.ndarray:
    """t(q, (n - 1) * df_factor) for n in [lo, hi); cached (paired comparisons repeat these)."""
    n = np.arange(lo, hi, dtype=np.float64)
    out = _scipy_stats().t.ppf(q, (n - 1.0) * df_factor)
    out.flags.writeable = False
    return out


@lru_cache(maxsize=1024)
def _t_sum(q: float, df: float) -> float:
    return float(_scipy_stats().t.ppf(q, df) + _scipy_stats().t.ppf(POWER, df))


def _detectable(est: _Estimate, alpha_effect: float) -> float | None:
    if est.zero_spread:
        return 0.0
    assert est.df is not None and est.spread is not None  # a judged estimate (see `_decide`)
    width = _t_sum(1.0 - alpha_effect, est.df) * est.spread / math.sqrt(est.n)
    return float(math.expm1(width))


def _decide(est: _Estimate, p_reg: float | None, p_imp: float | None, *, alpha: float,
            floor: float, alpha_effect: float) -> Verdict:
    if est.not_judged is not None:
        ratio = math.exp(est.mean) if est.mean is not None else None
        return Verdict("not judged", ratio, None, None, None, None, est.n, None, None, None,
                       est.not_judged)
    delta = math.log1p(floor)
    m, n, unit = est.mean, est.n, est.unit
    # Judged: the estimators (or `_zero_spread`) set every figure, and judged estimates' p-values are numbers.
    assert m is not None and est.ci95 is not None and est.ci_equiv is not None
    assert p_reg is not None and p_imp is not None
    ratio = math.exp(m)
    lo, hi = est.ci95
    elo, ehi = est.ci_equiv
    detectable = _detectable(est, alpha_effect)
    at = f"at {_plural(n, unit)}" + ("" if est.paired else " per run")
    change = cfmt.pct_spaced(math.expm1(m))
    interval = f"95 % CI {cfmt.pct_spaced(math.expm1(lo))} to {cfmt.pct_spaced(math.expm1(hi))}"
    needed = None
    if p_reg < alpha and m >= delta:
        verdict = "regressed"
        reason = f"regressed: {change} ({interval}, p = {p_reg:.2g}) {at}"
    elif p_imp < alpha and m <= -delta:
        verdict = "improved"
        reason = f"improved: {change} ({interval}, p = {p_imp:.2g}) {at}"
    elif -delta < elo and ehi < delta:
        verdict = "unchanged"
        reason = f"unchanged: {change} ({interval}); a change of ±{cfmt.pct_spaced(floor, False)} is ruled out {at}"
    else:
        verdict = "inconclusive"
        half = math.expm1((hi - lo) / 2.0)
        needed = _needed(est, alpha_effect, alpha, delta)
        head = f"inconclusive: {change} ±{cfmt.pct_spaced(half, False)} {at}"
        if needed is not None:
            per = "" if est.paired else " per run"
            reason = f"{head}; about {needed} {unit}{per} needed"
        else:
            reason = (f"{head}; no number of {unit} up to {MAX_UNITS} would decide "
                      f"(the change sits on the {cfmt.pct_spaced(floor, False)} floor)")
    if est.zero_spread:  # never inconclusive: the interval is the point
        reason = f"{verdict}: {change} {at} (no spread: identical units, decided from the mean)"
    return Verdict(verdict, ratio, math.exp(lo), math.exp(hi), p_reg, p_imp, n, est.spread,
                   needed, detectable, reason)


def _check_levels(alpha: float, floor: float) -> None:
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha must lie in (0, 0.5), got {alpha!r}")
    # A zero floor is a judgement by significance alone: no change is too small to call, and "unchanged" is never
    # shown (equivalence needs a margin), so what is not significant stays inconclusive.
    if not (floor >= 0.0 and math.isfinite(floor)):
        raise ValueError(f"floor must be a finite number >= 0, got {floor!r}")


# ---------------------------------------------------------------------------------------------
# Public API


def paired(log_ratios: Sequence[float], *, alpha: float = ALPHA, floor: float = FLOOR) -> Verdict:
    """Judge one paired comparison from its per-process median log(head/base) ratios."""
    return paired_many([log_ratios], alpha=alpha, floor=floor)[0]


def paired_many(rows: Sequence[Sequence[float]], *, alpha: float = ALPHA,
                floor: float = FLOOR) -> list[Verdict]:
    """`paired` for each row, vectorised; no family correction."""
    _check_levels(alpha, floor)
    return [_decide(e, e.p_regressed, e.p_improved, alpha=alpha, floor=floor, alpha_effect=alpha)
            for e in _estimate_paired(rows, alpha)]


def unpaired(base: Sequence[float], head: Sequence[float], *, alpha: float = ALPHA,
             floor: float = FLOOR) -> Verdict:
    """Judge two independent runs from their per-round log medians (Welch's t test)."""
    return unpaired_many([(base, head)], alpha=alpha, floor=floor)[0]


def unpaired_many(rows: Sequence[tuple[Sequence[float], Sequence[float]]], *, alpha: float = ALPHA,
                  floor: float = FLOOR) -> list[Verdict]:
    """`unpaired` for each (base, head) row, vectorised; no family correction."""
    _check_levels(alpha, floor)
    return [_decide(e, e.p_regressed, e.p_improved, alpha=alpha, floor=floor, alpha_effect=alpha)
            for e in _estimate_unpaired(rows, alpha)]


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values, in the input order.

    Sorted ascending p_(1) <= ... <= p_(m): adjusted p_(i) = max over j <= i of min(1, (m - j + 1) p_(j)),
    so the result is monotone in p and capped at 1. None or NaN entries are not part of the family
    (they do not count in m) and come back as they went in.
    """
    values = list(pvalues)
    live = {i: float(p) for i, p in enumerate(values) if p is not None and not math.isnan(p)}
    m = len(live)
    out: list[float | None] = list(values)
    running = 0.0
    for rank, i in enumerate(sorted(live, key=lambda i: live[i])):
        p = live[i]
        if p < 0.0 or p > 1.0:
            raise ValueError(f"p-value out of [0, 1]: {p!r}")
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


_Key = TypeVar("_Key", bound=Hashable)  # a family's keys come back as they went in


def judge_family(units: Mapping[_Key, Any], *, alpha: float = ALPHA, floor: float = FLOOR,
                 paired: bool = True) -> dict[_Key, Verdict]:
    """Judge many comparisons as one family (a gate rule covering many components), Holm-adjusted.

    `units` maps a key (e.g. (path, phase)) to the per-process log ratios (paired=True) or to a
    (base, head) pair of per-round log medians (paired=False).
    """
    _check_levels(alpha, floor)
    keys = list(units)
    if paired:
        ests = _estimate_paired([units[k] for k in keys], alpha)
    else:
        ests = _estimate_unpaired([tuple(units[k]) for k in keys], alpha)
    p_reg = holm([e.p_regressed if e.not_judged is None else None for e in ests])
    p_imp = holm([e.p_improved if e.not_judged is None else None for e in ests])
    size = max(1, sum(e.not_judged is None for e in ests))
    return {k: _decide(e, pr, pi, alpha=alpha, floor=floor, alpha_effect=alpha / size)
            for k, e, pr, pi in zip(keys, ests, p_reg, p_imp)}


_SAMPLE_COLUMNS = ("path", "phase", "process", "pair", "arm", "seconds_per_call")
_KEYS = ["path", "phase", "process"]


def per_process_log_ratios(samples: pl.DataFrame, base_arm: str = "base",
                           head_arm: str = "head") -> pl.DataFrame:
    """One row per (path, phase, process): the median over its block pairs of log(head/base).

    `samples` is the raw samples table (columns path, phase, process, pair, arm, seconds_per_call;
    others are ignored). Each (path, phase, process, pair) base block is paired with its head block;
    a pair missing an arm (or whose seconds_per_call is null) is ignored; should an arm have several
    blocks in one pair, their median is used. A non-positive or non-finite time makes that pair's
    ratio, and so the process's `log_ratio`, NaN, which `paired` reports as "not judged" rather than
    silently dropping it. Columns: path, phase, process, log_ratio (Float64), pairs (Int64: pairs used).
    """
    missing = [c for c in _SAMPLE_COLUMNS if c not in samples.columns]
    if missing:
        raise ValueError(f"samples table lacks column(s): {', '.join(missing)}")
    pair_keys = [*_KEYS, "pair"]
    blocks = (
        samples.select(_SAMPLE_COLUMNS)
        .with_columns(pl.col("arm").cast(pl.String), pl.col("seconds_per_call").cast(pl.Float64))
        .filter(pl.col("arm").is_in([base_arm, head_arm]) & pl.col("seconds_per_call").is_not_null())
        .group_by([*pair_keys, "arm"])
        .agg(pl.col("seconds_per_call").median())
    )
    base = blocks.filter(pl.col("arm") == base_arm).drop("arm").rename({"seconds_per_call": "b"})
    head = blocks.filter(pl.col("arm") == head_arm).drop("arm").rename({"seconds_per_call": "h"})
    good = lambda c: pl.col(c).is_finite() & (pl.col(c) > 0)  # noqa: E731
    pairs = base.join(head, on=pair_keys, how="inner").with_columns(
        pl.when(good("b") & good("h"))
        .then(pl.col("h").log() - pl.col("b").log())
        .otherwise(float("nan"))
        .alias("lr")
    )
    return (
        pairs.group_by(_KEYS)
        .agg(
            pl.when(pl.col("lr").is_nan().any())
            .then(float("nan"))
            .otherwise(pl.col("lr").median())
            .cast(pl.Float64)
            .alias("log_ratio"),
            pl.len().cast(pl.Int64).alias("pairs"),
        )
        .sort(_KEYS)
    )
