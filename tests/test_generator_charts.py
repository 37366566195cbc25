"""The model page's trend charts: made with one row standing for the rows (charts._trend_chart, for speed), they
are the Vega-Lite Altair writes with every row, for any rows: with or without a band, one version or many."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cbsite.generator import charts

_ROW = st.fixed_dictionaries(
    {"version": st.sampled_from(["v1", "v2", "v10"]), "run_id": st.text("abc0123-", min_size=1, max_size=6),
     "phase": st.sampled_from(["forward", "backward", "static", "train step"]), "metric": st.just("latency_ms"),
     "value": st.one_of(st.integers(0, 10**12), st.floats(0, 1e9)), "newest": st.booleans(),
     "href": st.text(min_size=1, max_size=12)},
    optional={"lo": st.floats(0, 10), "hi": st.floats(0, 10)},
)


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(_ROW, min_size=1, max_size=12), many=st.booleans(), series=st.sampled_from(["phase", "mode"]))
def test_a_trend_chart_made_with_a_stand_in_row_is_altairs_with_every_row(rows, many, series):
    versions = [f"v{i}" for i in range(1, 12 if many else 3)]  # past 6 versions the labels are angled
    for title, axis in (("Latency per forward (ms)", charts.MS_FORMAT), ("FLOPs per forward", "~s")):
        assert charts._trend_chart(rows, versions, title, axis, series) == charts._trend_chart_of(rows, versions, title, axis, series)


def test_the_stand_in_row_leaves_the_rows_as_they_were():
    rows = [{"version": "v1", "run_id": "a", "phase": "forward", "metric": "flops", "value": 3, "newest": True, "href": "x"},
            {"version": "v2", "run_id": "b", "phase": "forward", "metric": "flops", "value": 4, "newest": True, "href": "y",
             "lo": 1.0, "hi": 2.0}]
    before = [dict(r) for r in rows]
    spec = charts._trend_chart(rows, ["v1", "v2"], "FLOPs per forward", "~s", "phase")
    assert rows == before
    assert [layer["data"]["values"] for layer in spec["layer"]] == [rows] * 3  # the band, the line, the points
