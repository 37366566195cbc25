"""The diff's numpy path (cbsite/diff/rundiff.py `_Numbers`, `_diff_phase_numpy`) gives what its plain-Python
reference gives, bit for bit: every component's values, their types (an integer stays an integer) and every float's
bits (sums in the reference's order), so a site built with it is byte for byte the one built before it."""

from __future__ import annotations

import random
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cbsite import archive
from cbsite.diff import alignment, sides
from cbsite.diff import rundiff as cdiff
from tests.helpers.runfactory import revisions
from tests.helpers.site_archives import synthetic_rows

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def both_paths(base: pl.DataFrame, head: pl.DataFrame, match_moved: bool,
               monkeypatch: pytest.MonkeyPatch) -> tuple[cdiff.RunDiff, cdiff.RunDiff]:
    """The diff by the numpy path (checked to be taken) and by the reference."""
    taken: list[bool] = []
    real = alignment._diff_phase_numpy

    def spy(*args: Any, **kwargs: Any) -> Any:
        taken.append(True)
        return real(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(alignment, "_diff_phase_numpy", spy)
        fast = cdiff.diff_tables(base, head, match_moved=match_moved)
    assert taken, "the numpy path was not taken"
    with monkeypatch.context() as m:
        m.setattr(sides.Side, "numbers", lambda self: None)
        ref = cdiff.diff_tables(base, head, match_moved=match_moved)
    return fast, ref


def assert_same(fast: cdiff.RunDiff, ref: cdiff.RunDiff) -> None:
    # repr tells 1 from 1.0 and -0.0 from 0.0, and writes every float's shortest exact form.
    assert repr(fast.totals) == repr(ref.totals)
    assert len(fast.components) == len(ref.components)
    for a, b in zip(fast.components, ref.components):
        assert repr(a) == repr(b)
        assert all(type(a.delta[m]) is type(b.delta[m]) for m in cdiff.DIFF_METRICS)
    assert fast.summary() == ref.summary()
    assert fast.to_dict() == ref.to_dict()


def frame(*args: Any, **kwargs: Any) -> pl.DataFrame:
    """synthetic_rows as the archive stores them (its schema's types)."""
    out = pl.from_arrow(archive.rows_to_table(synthetic_rows(*args, **kwargs)))
    assert isinstance(out, pl.DataFrame)
    return out


@PROPERTY
@given(revisions(), st.booleans())
def test_numpy_diff_equals_the_reference_on_random_revisions(pair: Any, match_moved: bool) -> None:
    base_tree, head_tree = pair
    base, head = base_tree.run(version="v1"), head_tree.run(version="v2")
    with pytest.MonkeyPatch.context() as mp:
        assert_same(*both_paths(base.rows, head.rows, match_moved, mp))


def test_a_self_delta_within_rounding_of_the_totals_is_no_change_on_both_paths() -> None:
    """A root of 2.4e-48 ms over a child of 1 ms, the child gone in the head: the root's own share moves by the
    child's whole latency minus a rounding error; both paths call what is left of it within rounding the same."""
    from tests.helpers.runfactory import SyntheticTree

    tiny = {"status": "measured", "flops": 0, "latency_ms": 2.364344473396382e-48, "bytes_moved": 0,
            "peak_memory_bytes": 0, "iqr": 0.0, "call_count": 1, "param_bytes": 0}
    leaf = {"flops": 0, "latency_ms": 1.0, "bytes_moved": 0, "param_bytes": 0, "peak_memory_bytes": 0, "iqr": 0.0,
            "call_count": 1}
    base = SyntheticTree(spec={"": {"0": None}}, metrics={"": tiny, "0": leaf}).run(version="v1")
    head = SyntheticTree(spec={"": None}, metrics={"": tiny}).run(version="v2")
    with pytest.MonkeyPatch.context() as mp:
        assert_same(*both_paths(base.rows, head.rows, False, mp))


def _damage(frame: pl.DataFrame, seed: int) -> pl.DataFrame:
    """Missing values, NaN and lost percentiles at random rows: the cases where the two paths could part."""
    rng = random.Random(seed)
    n = frame.height
    out = frame
    for column, value in (("flops", None), ("latency_ms", float("nan")), ("latency_ms", None),
                          ("bytes_moved", None), ("peak_memory_bytes", None), ("param_bytes", None),
                          ("latency_p25_ms", None), ("latency_p75_ms", float("nan")), ("call_count", None)):
        hit = [rng.random() < 0.02 for _ in range(n)]
        out = out.with_columns(
            pl.when(pl.Series(hit)).then(pl.lit(value, dtype=out.schema[column])).otherwise(pl.col(column)).alias(column))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("damaged", [False, True])
@pytest.mark.parametrize("same_tree", [True, False])
def test_numpy_diff_equals_the_reference_on_synthetic_runs(seed: int, damaged: bool, same_tree: bool,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # The same tree with other numbers (every component on both sides: increased, decreased, noise), or another
    # tree (added, removed and moved components); float latencies whose sums depend on their order.
    base = frame("m", "v1", "r1", n=300, seed=seed, branching=5)
    head = frame("m", "v2", "r2", n=300 if same_tree else 320, seed=seed if same_tree else seed + 10,
                 scale=1.3 if seed % 2 else 1.0, branching=5)
    if same_tree:  # fewer FLOPs here, a latency within its noise there, the rest as it was
        head = head.with_columns(
            pl.when(pl.col("order") % 7 == 0).then(pl.col("flops") - 1).otherwise(pl.col("flops")).alias("flops"),
            pl.when(pl.col("order") % 5 == 0).then(pl.col("latency_ms") * 1.001).otherwise(pl.col("latency_ms"))
            .alias("latency_ms"))
    if damaged:
        base, head = _damage(base, seed), _damage(head, seed + 100)
    for match_moved in (False, True):
        fast, ref = both_paths(base, head, match_moved, monkeypatch)
        assert_same(fast, ref)
        if same_tree:
            counts = fast.counts("forward")
            assert counts["added"] == 0 and counts["decreased"] + counts["increased"] > 0


def test_integers_beyond_float_precision_take_the_reference_path(monkeypatch: pytest.MonkeyPatch) -> None:
    base = frame("m", "v1", "r1", n=40, seed=5)
    head = base.with_columns(pl.col("flops") * 2 ** 40)  # FLOP counts past 2**52 in sum
    side = sides.sides(head, "head", {})["forward"]
    assert side.numbers() is None
    assert sides.sides(base, "base", {})["forward"].numbers() is not None
    diff = cdiff.diff_tables(base, head)  # the reference, for the phases where one side has no numpy columns
    assert isinstance(diff.totals["forward"]["flops"].delta, int)


@pytest.mark.parametrize("same_tree", [True, False])
def test_diff_files_from_the_run_pages_data_equal_those_computed(tmp_path: Any, same_tree: bool) -> None:
    """The build's workers hand the head run's page data (rundata.components_json) to the diff's data files
    (diffdata._run_columns) instead of computing its columns again: the files are the same, to the byte."""
    from cbsite.generator import diffdata, latencydata, runpagedata, templating
    from tests.helpers.site_archives import synthetic_run

    base = archive.read_run(synthetic_run(tmp_path, "m", "v1", n=200, seed=1, trace_every=7))
    head = archive.read_run(synthetic_run(tmp_path, "m", "v2", n=200 if same_tree else 230, seed=1 if same_tree else 2,
                                          scale=1.2, minutes=1, trace_every=7))
    rd = cdiff.diff_runs(base, head)
    judged = latencydata.judge(None, base, head, rd)
    page = runpagedata.run_data(head, [])[1]
    computed = diffdata.diff_files(rd, judged, head)
    taken = diffdata.diff_files(rd, judged, head, page)
    assert set(taken) == set(computed)
    for name in computed:
        a, b = tmp_path / f"a-{name}", tmp_path / f"b-{name}"
        templating.dump_json(computed[name], a)
        templating.dump_json(taken[name], b)
        assert a.read_bytes() == b.read_bytes(), name
    kinds = {c.kind for c in rd.components}
    assert ("removed" in kinds and "added" in kinds) if not same_tree else kinds <= {"increased", "decreased", "unchanged"}


@pytest.mark.parametrize("same_tree", [True, False])
def test_diff_bounds_from_the_base_runs_page_data_equal_those_read(tmp_path: Any, same_tree: bool) -> None:
    """The build's workers take the base run's bounds from its page data (diffdata.RunFacts.know_page) instead of
    reading them from its rows (diffbounds.run_bounds): the same labels, so the page and its data are the same."""
    from cbsite.generator import diffdata, latencydata, runpagedata
    from tests.helpers.site_archives import synthetic_run

    base = archive.read_run(synthetic_run(tmp_path, "m", "v1", n=200, seed=1, trace_every=7))
    head = archive.read_run(synthetic_run(tmp_path, "m", "v2", n=200 if same_tree else 230, seed=1 if same_tree else 2,
                                          scale=1.6, minutes=1, trace_every=7))
    rd = cdiff.diff_runs(base, head)
    judged = latencydata.judge(None, base, head, rd)
    read = diffdata.RunFacts.of(rd, base, head)
    taken = diffdata.RunFacts.of(rd, base, head)
    taken.know_page("base", runpagedata.run_data(base, [])[1])
    for phase in rd.phases:
        labels = read.bounds.side("base", phase)
        assert taken.bounds._read[("base", phase)] == labels  # taken, not read again
        assert any(labels.values())
    assert diffdata.answer(rd, "m", judged, taken) == diffdata.answer(rd, "m", judged, read)
    taken_files, read_files = diffdata.diff_files(rd, judged, head, None, taken), diffdata.diff_files(rd, judged, head, None, read)
    assert taken_files == read_files
    # Another tree: some components' labels changed (the column names the older one), so the base side was read.
    changed = [v for phase in rd.phases for v in read_files[f"diff.{phase}.json"]["bound_was"] if v is not None]
    assert bool(changed) is not same_tree


def _rounded_reference(values: list[Any], digits: int) -> list[Any]:
    from cbsite.generator.diffdata import _floats, _whole
    from cbsite.generator.rundata import compact_column

    return _whole(compact_column(_floats(values), digits))


_NUMBERS = st.one_of(
    st.none(), st.integers(-(2 ** 60), 2 ** 60), st.integers(-(10 ** 6), 10 ** 6),
    # a tie at the last kept digit (…5 followed by zeros), where rounding goes to the even digit
    st.builds(lambda q, k, s: s * (q * 10 ** k + 5 * 10 ** (k - 1)), st.integers(100, 99999), st.integers(1, 14),
              st.sampled_from([1, -1])),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans())


@PROPERTY
@given(st.lists(_NUMBERS, max_size=60), st.sampled_from([3, 4]))
def test_diff_numbers_rounded_as_integers_equal_those_rounded_as_floats(values: list[Any], digits: int) -> None:
    """diffdata.rounded rounds the integers of a diff column (FLOPs, bytes) in integer arithmetic: the values
    and their types are those of formatting each as a float and reading it back (compact_column), 2**53 and beyond
    included."""
    from cbsite.generator.diffdata import rounded

    assert repr(rounded(values, digits)) == repr(_rounded_reference(values, digits))


@PROPERTY
@given(st.lists(st.one_of(st.none(), st.integers(-(2 ** 60), 2 ** 60), st.integers(-(10 ** 6), 10 ** 6)), max_size=60),
       st.sampled_from([3, 4]))
def test_integer_columns_rounded_at_once_equal_those_rounded_as_floats(values: list[Any], digits: int) -> None:
    """A column of integers and unknowns only (FLOPs, bytes: rounded all at once), the same as the float way."""
    from cbsite.generator.diffdata import rounded

    assert repr(rounded(values, digits)) == repr(_rounded_reference(values, digits))


def test_diff_numbers_rounded_at_their_edges() -> None:
    from cbsite.generator.diffdata import rounded

    values = [0, 999, 1000, 1005, 1015, 9995, 12350, 12250, -12350, 2 ** 53 - 1, -(2 ** 53 - 1), 2 ** 53, 9006999999999999]
    # rounded up to 2**53 or beyond: a float, as the float way leaves it
    assert repr(rounded(values)) == repr([0, 999, 1000, 1000, 1020, 10000, 12400, 12200, -12400, 9.01e15, -9.01e15,
                                          9.01e15, 9.01e15])
    assert repr(rounded(values)) == repr(_rounded_reference(values, 3))
