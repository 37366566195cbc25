"""The site's data files (templating.dump_json): compact, keys sorted, the same bytes for the same data, read back
as the data they were made from; an integer past 64 bits (which orjson refuses) is written all the same."""

from __future__ import annotations

import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from cbsite.generator.templating import dump_json

_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=60, deadline=None)
@given(data=_VALUES)
def test_a_data_file_reads_back_as_its_data_with_sorted_keys_and_no_spaces(data, tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "d.json"
    dump_json(data, path)
    text = path.read_text(encoding="utf-8")

    def sorted_pairs(pairs):
        assert [k for k, _ in pairs] == sorted(k for k, _ in pairs)
        return dict(pairs)

    assert json.loads(text, object_pairs_hook=sorted_pairs) == data
    assert not re.search(r"\s", re.sub(r'"(?:\\.|[^"\\])*"', '""', text))  # no white space outside strings
    first = path.read_bytes()
    dump_json(data, path)
    assert path.read_bytes() == first


def test_keys_sorted_and_a_flop_count_past_64_bits_kept(tmp_path):
    path = tmp_path / "d.json"
    dump_json({"b": 2 ** 64, "a": {"z": 1, "y": [0.5, None]}}, path)
    assert path.read_text(encoding="utf-8") == '{"a":{"y":[0.5,null],"z":1},"b":18446744073709551616}'
