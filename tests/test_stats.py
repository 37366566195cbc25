"""The latency decision (cbsite.stats) under Monte-Carlo: known false-alarm rate and power on
synthetic log ratios, seeded, with the real scipy.stats. Runs in seconds (vectorised forms)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings

import numpy as np
import polars as pl
import pytest

from cbsite import stats
from cbsite.stats import (
    ALPHA,
    FLOOR,
    Verdict,
    holm,
    judge_family,
    paired,
    paired_many,
    per_process_log_ratios,
    unpaired,
    unpaired_many,
)

SESSIONS = 4000
UNITS = 6
PLUS10 = math.log(1.10)  # 0.0953
NO_FLOOR = 1e-9  # the test's own level, no magnitude floor


def share(verdicts: list[Verdict], kind: str) -> float:
    return sum(v.verdict == kind for v in verdicts) / len(verdicts)


def exact_sample(mean: float, sd: float, n: int, seed: int = 0) -> np.ndarray:
    """n values with exactly this sample mean and standard deviation (ddof 1)."""
    z = np.random.default_rng(seed).standard_normal(n)
    z = (z - z.mean()) / z.std(ddof=1)
    return mean + sd * z


# ---------------------------------------------------------------------------------------------
# Paired: false alarms, power, equivalence


@pytest.mark.parametrize("noise", ["normal", "t3"])
def test_false_alarms_aa(noise):
    rng = np.random.default_rng(20240901)
    if noise == "normal":
        x = rng.normal(0.0, 0.03, (SESSIONS, UNITS))
    else:  # heavier tails: Student t with 3 df, scale 0.03 (sd 0.052)
        x = 0.03 * rng.standard_t(3, (SESSIONS, UNITS))
    verdicts = paired_many(x)
    regressed = share(verdicts, "regressed")
    assert regressed <= 0.015
    assert share(verdicts, "improved") <= 0.015
    # The one-sided test alone (no floor) holds its level too.
    bare = paired_many(x, floor=NO_FLOOR)
    assert share(bare, "regressed") <= 0.015
    assert share(bare, "improved") <= 0.015
    print(f"\nA/A {noise}: regressed {regressed:.2%} (floor {FLOOR:.0%}), "
          f"{share(bare, 'regressed'):.2%} (no floor)")


def test_power_plus10_small_spread():
    rng = np.random.default_rng(7)
    verdicts = paired_many(rng.normal(PLUS10, 0.03, (SESSIONS, UNITS)))
    power = share(verdicts, "regressed")
    assert power >= 0.95
    assert share(verdicts, "improved") == 0 and share(verdicts, "unchanged") == 0
    down = paired_many(rng.normal(-PLUS10, 0.03, (SESSIONS, UNITS)))
    assert share(down, "improved") >= 0.95
    print(f"\n+10 %, sd 0.03, 6 processes: regressed {power:.2%}; -10 %: improved {share(down, 'improved'):.2%}")


def test_power_plus10_large_spread_is_inconclusive_with_needed():
    rng = np.random.default_rng(8)
    verdicts = paired_many(rng.normal(PLUS10, 0.15, (SESSIONS, UNITS)))
    inconclusive = [v for v in verdicts if v.verdict == "inconclusive"]
    assert len(inconclusive) / len(verdicts) >= 0.6
    assert all(v.needed is None or v.needed > UNITS for v in inconclusive)
    with_needed = [v.needed for v in inconclusive if v.needed is not None]
    assert len(with_needed) >= 0.8 * len(inconclusive)
    assert share(verdicts, "unchanged") == 0
    assert all("processes needed" in v.reason or "would decide" in v.reason for v in inconclusive)
    print(f"\n+10 %, sd 0.15, 6 processes: inconclusive {len(inconclusive) / len(verdicts):.1%}, "
          f"regressed {share(verdicts, 'regressed'):.1%}, median needed {np.median(with_needed):.0f}")


def test_unchanged_for_quiet_aa_never_for_plus20():
    rng = np.random.default_rng(9)
    quiet = paired_many(rng.normal(0.0, 0.005, (SESSIONS, UNITS)))
    assert share(quiet, "unchanged") >= 0.95
    for sd in (0.005, 0.03, 0.15):
        plus20 = paired_many(rng.normal(math.log(1.2), sd, (SESSIONS, UNITS)))
        assert share(plus20, "unchanged") == 0
        assert share(plus20, "improved") == 0
    print(f"\nA/A sd 0.005: unchanged {share(quiet, 'unchanged'):.2%}")


def test_detectable_is_the_80_percent_power_change():
    x = exact_sample(0.0, 0.03, UNITS)
    v = paired(x)
    df = UNITS - 1
    from scipy.stats import t

    expected = (t.ppf(1 - ALPHA, df) + t.ppf(0.8, df)) * 0.03 / math.sqrt(UNITS)
    assert v.detectable == pytest.approx(math.expm1(expected), rel=1e-9)
    rng = np.random.default_rng(10)
    hits = paired_many(rng.normal(math.log1p(v.detectable), 0.03, (SESSIONS, UNITS)), floor=NO_FLOOR)
    power = share(hits, "regressed")
    assert 0.70 <= power <= 0.86  # exact noncentral-t power: 0.78
    print(f"\ndetectable at 6 processes, sd 0.03: {v.detectable:.2%}; observed power there {power:.1%}")


def test_needed_is_where_the_decision_flips():
    """Kept mean and spread: at `needed` units the verdict is reached, one unit fewer it is not."""
    cases = [(0.07, 0.08, "regressed"), (-0.07, 0.08, "improved"), (0.01, 0.05, "unchanged")]
    for mean, sd, then in cases:
        v = paired(exact_sample(mean, sd, UNITS))
        assert v.verdict == "inconclusive"
        assert v.needed is not None and v.needed > UNITS
        assert f"about {v.needed} processes needed" in v.reason
        assert paired(exact_sample(mean, sd, v.needed)).verdict == then
        assert paired(exact_sample(mean, sd, v.needed - 1)).verdict == "inconclusive"


def test_needed_none_just_under_the_floor():
    # Just under the floor: never regressed, and equivalence would take far more than MAX_UNITS.
    v = paired(exact_sample(math.log1p(FLOOR) - 1e-4, 0.05, UNITS))
    assert v.verdict == "inconclusive" and v.needed is None
    assert "would decide" in v.reason and "floor" in v.reason
    # On the floor exactly, ratio >= 1 + floor holds: regressed is reachable with enough processes.
    on = paired(exact_sample(math.log1p(FLOOR), 0.05, UNITS))
    assert on.verdict == "inconclusive" and on.needed is not None


def test_needed_matches_a_brute_force_search():
    """`needed` scans from a normal-quantile bound; it equals the plain search over every n."""
    from scipy.stats import t

    delta = math.log1p(FLOOR)
    rng = np.random.default_rng(18)
    n_all = np.arange(2, stats.MAX_UNITS + 1, dtype=float)
    checked = 0
    for _ in range(150):
        base = rng.normal(0.0, rng.uniform(0.01, 0.3), int(rng.integers(2, 8)))
        head = rng.normal(rng.normal(0.0, 0.08), rng.uniform(0.01, 0.3), int(rng.integers(2, 8)))
        for v, factor in ((paired(head), 1.0), (unpaired(base, head), None)):
            if v.verdict != "inconclusive":
                continue
            if factor is None:  # Welch's df with n rounds on each side
                a, b = np.var(base, ddof=1), np.var(head, ddof=1)
                factor = (a + b) ** 2 / (a * a + b * b)
            m, se = abs(math.log(v.ratio)), v.spread / np.sqrt(n_all)
            q = t.ppf(1 - ALPHA, (n_all - 1) * factor) * se
            ok = ((m - q > 0) & (m >= delta)) | (m + q < delta)
            ok &= n_all > v.n
            assert v.needed == (int(n_all[np.argmax(ok)]) if ok.any() else None)
            checked += 1
    assert checked > 50


def test_interval_and_pvalues_are_scipys():
    from scipy.stats import ttest_1samp

    x = np.array([0.05, 0.08, 0.11, 0.02, 0.09, 0.07])
    v = paired(x)
    ci = ttest_1samp(x, 0).confidence_interval(0.95)
    assert v.ratio == pytest.approx(math.exp(x.mean()))
    assert (v.ci_low, v.ci_high) == pytest.approx((math.exp(ci.low), math.exp(ci.high)))
    assert v.p_regressed == pytest.approx(ttest_1samp(x, 0, alternative="greater").pvalue)
    assert v.p_improved == pytest.approx(ttest_1samp(x, 0, alternative="less").pvalue)
    assert v.spread == pytest.approx(x.std(ddof=1))
    assert v.n == 6 and v.verdict == "regressed"


def test_many_equals_one_by_one():
    rng = np.random.default_rng(11)
    rows = [rng.normal(0.05, 0.05, int(n)) for n in rng.integers(1, 9, 40)] + [[0.1] * 3, [float("nan")] * 3]
    assert paired_many(rows) == [paired(r) for r in rows]
    pairs = [(rng.normal(0, 0.05, int(a)), rng.normal(0.05, 0.05, int(b))) for a, b in rng.integers(1, 7, (30, 2))]
    assert unpaired_many(pairs) == [unpaired(b, h) for b, h in pairs]


# ---------------------------------------------------------------------------------------------
# Unpaired (rounds of independent runs, Welch)

ROUND_SESSIONS = 2000


def test_unpaired_false_alarms_and_power():
    rng = np.random.default_rng(12)
    base = rng.normal(0.0, 0.03, (ROUND_SESSIONS, UNITS))
    head = rng.normal(0.0, 0.03, (ROUND_SESSIONS, UNITS))
    aa = unpaired_many(list(zip(base, head)))
    assert share(aa, "regressed") <= 0.015 and share(aa, "improved") <= 0.015
    bare = unpaired_many(list(zip(base, head)), floor=NO_FLOOR)
    assert share(bare, "regressed") <= 0.015 and share(bare, "improved") <= 0.015
    heavy = unpaired_many(list(zip(0.03 * rng.standard_t(3, (ROUND_SESSIONS, UNITS)),
                                   0.03 * rng.standard_t(3, (ROUND_SESSIONS, UNITS)))))
    assert share(heavy, "regressed") <= 0.015

    up = unpaired_many(list(zip(rng.normal(0.0, 0.03, (ROUND_SESSIONS, UNITS)),
                                rng.normal(PLUS10, 0.03, (ROUND_SESSIONS, UNITS)))))
    power = share(up, "regressed")
    assert power >= 0.95

    noisy = unpaired_many(list(zip(rng.normal(0.0, 0.15, (ROUND_SESSIONS, UNITS)),
                                   rng.normal(PLUS10, 0.15, (ROUND_SESSIONS, UNITS)))))
    inconclusive = [v for v in noisy if v.verdict == "inconclusive"]
    assert len(inconclusive) / len(noisy) >= 0.6
    assert all(v.needed is None or v.needed > UNITS for v in inconclusive)
    assert all("rounds per run" in v.reason for v in inconclusive)
    assert share(noisy, "unchanged") == 0

    quiet = unpaired_many(list(zip(rng.normal(0.0, 0.005, (ROUND_SESSIONS, UNITS)),
                                   rng.normal(0.0, 0.005, (ROUND_SESSIONS, UNITS)))))
    assert share(quiet, "unchanged") >= 0.95
    plus20 = unpaired_many(list(zip(rng.normal(0.0, 0.03, (ROUND_SESSIONS, UNITS)),
                                    rng.normal(math.log(1.2), 0.03, (ROUND_SESSIONS, UNITS)))))
    assert share(plus20, "unchanged") == 0
    print(f"\nrounds A/A: regressed {share(aa, 'regressed'):.2%} ({share(bare, 'regressed'):.2%} no floor), "
          f"t3 {share(heavy, 'regressed'):.2%}; +10 % sd 0.03: {power:.2%}; sd 0.15 inconclusive "
          f"{len(inconclusive) / len(noisy):.1%}; quiet unchanged {share(quiet, 'unchanged'):.2%}")


def test_unpaired_is_welch():
    from scipy.stats import ttest_ind

    base, head = [0.0, 0.02, -0.01, 0.01], [0.12, 0.09, 0.15, 0.11, 0.10]
    v = unpaired(base, head)
    res = ttest_ind(head, base, equal_var=False)
    ci = res.confidence_interval(0.95)
    assert v.ratio == pytest.approx(math.exp(np.mean(head) - np.mean(base)))
    assert (v.ci_low, v.ci_high) == pytest.approx((math.exp(ci.low), math.exp(ci.high)))
    assert v.p_regressed == pytest.approx(ttest_ind(head, base, equal_var=False, alternative="greater").pvalue)
    assert v.n == 4 and v.verdict == "regressed"
    assert v.spread == pytest.approx(math.sqrt(np.var(base, ddof=1) + np.var(head, ddof=1)))


def test_unpaired_needed_is_where_the_decision_flips():
    b, h = exact_sample(0.0, 0.06, 4, seed=1), exact_sample(0.08, 0.06, 4, seed=2)
    v = unpaired(b, h)
    assert v.verdict == "inconclusive" and v.needed is not None and v.needed > 4
    k = v.needed
    assert unpaired(exact_sample(0.0, 0.06, k, 1), exact_sample(0.08, 0.06, k, 2)).verdict == "regressed"
    assert unpaired(exact_sample(0.0, 0.06, k - 1, 1), exact_sample(0.08, 0.06, k - 1, 2)).verdict == "inconclusive"


# ---------------------------------------------------------------------------------------------
# Holm and families


def test_holm_hand_computed():
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> monotone: 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.6]) == [1.0, 1.0]  # capped at 1
    assert holm([0.01, None, 0.02]) == pytest.approx([0.02, None, 0.02])  # None is not in the family
    assert holm([0.2]) == [0.2]
    assert holm([]) == []
    assert holm([0.01, 0.01, 0.04]) == pytest.approx([0.03, 0.03, 0.04])  # ties
    out = holm([0.001, 0.002, 0.003])
    assert out == pytest.approx([0.003, 0.004, 0.004])
    nan = holm([0.01, float("nan")])
    assert nan[0] == pytest.approx(0.01) and math.isnan(nan[1])
    with pytest.raises(ValueError):
        holm([1.5])


def test_holm_is_monotone_and_dominates():
    rng = np.random.default_rng(13)
    p = rng.uniform(0, 0.2, 30)
    adj = np.array(holm(p))
    order = np.argsort(p)
    assert np.all(np.diff(adj[order]) >= 0)
    assert np.all(adj >= p) and np.all(adj <= 1.0)
    assert np.all(adj <= np.minimum(1.0, 30 * p) + 1e-15)  # never worse than Bonferroni


def test_family_adjusts_pvalues_and_recomputes_verdicts():
    rng = np.random.default_rng(14)
    units = {("m", i): rng.normal(0.0, 0.03, UNITS) for i in range(19)}
    units[("m", "slow")] = exact_sample(0.12, 0.06, UNITS)  # raw p ~ 0.003: regressed alone
    alone = paired(units[("m", "slow")])
    assert alone.verdict == "regressed"
    fam = judge_family(units)
    raw = paired_many(list(units.values()))
    assert [fam[k].p_regressed for k in units] == pytest.approx(holm([v.p_regressed for v in raw]))
    assert [fam[k].p_improved for k in units] == pytest.approx(holm([v.p_improved for v in raw]))
    slow = fam[("m", "slow")]
    assert slow.p_regressed > ALPHA and slow.verdict == "inconclusive"
    assert slow.needed is not None and slow.needed > alone.n
    # Equivalence is per member: the unchanged verdicts are those of the members alone.
    assert [fam[k].verdict == "unchanged" for k in units] == [v.verdict == "unchanged" for v in raw]


def test_family_not_judged_members_are_left_out():
    fam = judge_family({"a": [0.2, 0.21, 0.19], "b": [0.1], "c": [float("nan"), 0.0]})
    assert fam["a"].verdict == "regressed"
    assert fam["a"].p_regressed == paired([0.2, 0.21, 0.19]).p_regressed  # family of one
    assert fam["b"].verdict == fam["c"].verdict == "not judged"


def test_family_unpaired():
    fam = judge_family({"x": ([0.0, 0.01, -0.01], [0.2, 0.21, 0.19]), "y": ([0.0], [0.1])}, paired=False)
    assert fam["x"].verdict == "regressed" and fam["y"].verdict == "not judged"
    assert "--rounds" in fam["y"].reason


@pytest.mark.parametrize("floor,limit", [(FLOOR, 0.015), (NO_FLOOR, 0.02)])
def test_family_of_50_aa_members(floor, limit):
    families, members = 300, 50
    rng = np.random.default_rng(15)
    x = rng.normal(0.0, 0.03, (families, members, UNITS))
    any_regressed = 0
    for f in range(families):
        fam = judge_family({i: x[f, i] for i in range(members)}, floor=floor)
        any_regressed += any(v.verdict == "regressed" for v in fam.values())
    rate = any_regressed / families
    assert rate <= limit
    if floor == NO_FLOOR:  # without Holm, the same families would alarm about 40 % of the time
        raw = paired_many(x.reshape(-1, UNITS), floor=floor)
        per_family = np.array([v.verdict == "regressed" for v in raw]).reshape(families, members).any(axis=1)
        assert per_family.mean() > 0.2
        print(f"\n50-member A/A families, no floor: any regressed {rate:.2%} with Holm, "
              f"{per_family.mean():.1%} without")
    else:
        print(f"\n50-member A/A families: any regressed {rate:.2%}")


def test_family_still_detects_a_real_regression():
    rng = np.random.default_rng(16)
    hits = 0
    for _ in range(100):
        units = {i: rng.normal(0.0, 0.03, UNITS) for i in range(49)}
        units["planted"] = rng.normal(math.log(1.2), 0.03, UNITS)
        fam = judge_family(units)
        hits += fam["planted"].verdict == "regressed"
        assert not any(fam[i].verdict == "regressed" for i in range(49))
    assert hits >= 90


# ---------------------------------------------------------------------------------------------
# Edges: not judged, zero spread, JSON


@pytest.mark.parametrize("x", [[], [0.1], [0.1, float("nan")], [0.0, float("inf"), 0.1], [None, 0.1]])
def test_not_judged(x):
    v = paired(x)
    assert v.verdict == "not judged"
    assert "cbsite compare" in v.reason
    assert v.p_regressed is None and v.ci_low is None and v.needed is None and v.detectable is None
    assert v.n == len(x)
    json.dumps(v.to_dict(), allow_nan=False)


def test_not_judged_single_round_runs():
    v = unpaired([0.0], [0.1])
    assert v.verdict == "not judged" and "--rounds" in v.reason and "single-round" in v.reason
    assert v.ratio == pytest.approx(math.exp(0.1))  # the point estimate is still shown
    assert unpaired([0.0, 0.1], [0.1]).verdict == "not judged"
    assert unpaired([0.0, float("nan")], [0.1, 0.2]).verdict == "not judged"


def test_zero_spread_decides_from_the_mean():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        up, flat, small, down = paired([0.1] * 6), paired([0.0] * 6), paired([0.02] * 3), paired([-0.1] * 2)
        same_rounds = unpaired([1.0, 1.0, 1.0], [1.1, 1.1, 1.1])
        one_arm_constant = unpaired([1.0, 1.0, 1.0], [1.2, 1.21, 1.19])
    assert up.verdict == "regressed" and up.p_regressed == 0.0 and up.ci_low == up.ci_high == up.ratio
    assert flat.verdict == "unchanged" and flat.ratio == 1.0
    assert small.verdict == "unchanged"
    assert down.verdict == "improved"
    assert same_rounds.verdict == "regressed"
    assert one_arm_constant.verdict == "regressed"
    for v in (up, flat, small, down, same_rounds):
        assert v.spread == 0.0 and v.detectable == 0.0 and v.needed is None
        assert "no spread" in v.reason
        json.dumps(v.to_dict(), allow_nan=False)


def test_to_dict_is_json_safe_for_every_verdict():
    rng = np.random.default_rng(17)
    samples = [rng.normal(PLUS10, 0.03, 6), rng.normal(-PLUS10, 0.03, 6), rng.normal(0, 0.005, 6),
               rng.normal(PLUS10, 0.15, 6), [0.1], [0.1, float("inf")], [0.05] * 4]
    seen = set()
    for x in samples:
        v = paired(x)
        seen.add(v.verdict)
        d = v.to_dict()
        assert set(d) == {"verdict", "ratio", "ci_low", "ci_high", "p_regressed", "p_improved", "n",
                          "spread", "needed", "detectable", "reason"}
        text = json.dumps(d, allow_nan=False)
        assert json.loads(text) == d
        assert all(type(val) in (str, int, float, type(None)) for val in d.values())
    assert seen == set(stats.VERDICTS)


def test_reason_reads():
    v = paired(exact_sample(0.07, 0.08, 6))
    assert v.reason.startswith("inconclusive: +7.3 % ±")
    assert v.reason.endswith(f"at 6 processes; about {v.needed} processes needed")
    r = paired(exact_sample(PLUS10, 0.01, 6))
    assert r.reason.startswith("regressed: +10 % (95 % CI +8.") and r.reason.endswith("at 6 processes")
    u = paired(exact_sample(0.0, 0.01, 6))
    assert "a change of ±5 % is ruled out at 6 processes" in u.reason


def test_bad_levels():
    with pytest.raises(ValueError):
        paired([0.1, 0.2], alpha=0.0)
    with pytest.raises(ValueError):
        paired([0.1, 0.2], floor=-0.1)


def test_core_module_imports_neither_torch_nor_jinja2():
    code = "import sys, cbsite.stats; bad = {'torch', 'jinja2'} & set(sys.modules); assert not bad, bad"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------
# per_process_log_ratios


def test_per_process_log_ratios():
    rows = []

    def block(path, process, pair, arm, seconds, phase="forward"):
        rows.append({"path": path, "phase": phase, "process": process, "pair": pair, "arm": arm,
                     "seconds_per_call": seconds, "order": 0})

    # a, process 0: ratios 1.1, 1.2, 1.3 -> median log(1.2); pair 3 has no head block (ignored)
    for pair, (b, h) in enumerate([(1.0, 1.1), (2.0, 2.4), (1.0, 1.3)]):
        block("a", 0, pair, "base", b)
        block("a", 0, pair, "head", h)
    block("a", 0, 3, "base", 1.0)
    # a, process 1: two pairs, ratios 0.9 and 1.0 -> median of logs = mean of the two; plus an arm
    # that is neither base nor head, and a null head (a pair missing an arm)
    block("a", 1, 0, "base", 1.0)
    block("a", 1, 0, "head", 0.9)
    block("a", 1, 1, "head", 3.0)
    block("a", 1, 1, "base", 3.0)
    block("a", 1, 1, "other", 100.0)
    block("a", 1, 2, "base", 1.0)
    block("a", 1, 2, "head", None)
    # a, backward: its own row
    block("a", 0, 0, "base", 1.0, phase="backward")
    block("a", 0, 0, "head", 2.0, phase="backward")
    # b, process 0: a zero time poisons the process (NaN, judged "not judged" downstream)
    block("b", 0, 0, "base", 1.0)
    block("b", 0, 0, "head", 1.5)
    block("b", 0, 1, "base", 0.0)
    block("b", 0, 1, "head", 1.0)
    # c: only base blocks -> no row
    block("c", 0, 0, "base", 1.0)

    out = per_process_log_ratios(pl.DataFrame(rows))
    assert out.columns == ["path", "phase", "process", "log_ratio", "pairs"]
    assert out.schema["log_ratio"] == pl.Float64 and out.schema["pairs"] == pl.Int64
    got = {(r["path"], r["phase"], r["process"]): (r["log_ratio"], r["pairs"]) for r in out.to_dicts()}
    assert set(got) == {("a", "backward", 0), ("a", "forward", 0), ("a", "forward", 1), ("b", "forward", 0)}
    assert got[("a", "forward", 0)] == (pytest.approx(math.log(1.2)), 3)
    assert got[("a", "forward", 1)] == (pytest.approx(math.log(0.9) / 2), 2)
    assert got[("a", "backward", 0)] == (pytest.approx(math.log(2.0)), 1)
    assert math.isnan(got[("b", "forward", 0)][0]) and got[("b", "forward", 0)][1] == 2
    assert out.select("path", "phase", "process").rows() == sorted(got)

    # Custom arm names, and the result feeds `paired` directly.
    renamed = pl.DataFrame(rows).with_columns(pl.col("arm").replace({"base": "A", "head": "A'"}))
    again = per_process_log_ratios(renamed, base_arm="A", head_arm="A'")
    assert again.equals(out)
    a = out.filter((pl.col("path") == "a") & (pl.col("phase") == "forward"))["log_ratio"].to_list()
    assert paired(a).n == 2
    b = out.filter(pl.col("path") == "b")["log_ratio"].to_list()
    assert paired(b).verdict == "not judged"


def test_per_process_log_ratios_empty_and_missing_columns():
    empty = pl.DataFrame(schema={"path": pl.String, "phase": pl.String, "process": pl.Int64,
                                 "pair": pl.Int64, "arm": pl.String, "seconds_per_call": pl.Float64})
    out = per_process_log_ratios(empty)
    assert out.height == 0 and out.columns == ["path", "phase", "process", "log_ratio", "pairs"]
    with pytest.raises(ValueError, match="seconds_per_call"):
        per_process_log_ratios(empty.drop("seconds_per_call"))
