"""How the icicle cuts a label that does not fit, checked on the very JS file the site ships (icicle.js `shorten`)
run by node: every label keeps the start of its name ("embedding_bags…"), and siblings that share a start keep their
stem and the index that tells them apart ("t_c…_0", once "…_0", which lost the stem)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ICICLE_JS = Path(__file__).parents[1] / "cbsite" / "generator" / "templates" / "assets" / "icicle.js"
NODE = shutil.which("node") or "/usr/bin/node"
pytestmark = pytest.mark.skipif(not Path(NODE).exists(), reason="node is not installed")
ELLIPSIS = "\u2026"

# Reads one JSON case per line: [text, max, marker, suffix] or {"siblings": [...]}; answers one JSON value per line.
DRIVER = r"""
const icicle = require(process.argv[1]);
require("readline").createInterface({ input: process.stdin }).on("line", (line) => {
  const c = JSON.parse(line);
  const out = Array.isArray(c) ? icicle.shorten(c[0], c[1], c[2], c[3]) : icicle.siblingSuffixes(c.siblings);
  process.stdout.write(JSON.stringify(out) + "\n");
});
"""


@pytest.fixture(scope="module")
def js():
    proc = subprocess.Popen([NODE, "-e", DRIVER, str(ICICLE_JS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def call(case):
        proc.stdin.write(json.dumps(case) + "\n")
        proc.stdin.flush()
        return json.loads(proc.stdout.readline())

    yield call
    proc.stdin.close()
    proc.wait(timeout=10)


def test_siblings_keep_their_stem_and_index(js):
    tables = [f"t_cat_{i}" for i in range(8)]
    suffixes = js({"siblings": tables})
    assert suffixes["t_cat_0"] == "_0" and suffixes["t_cat_7"] == "_7"
    assert js(["t_cat_0", 7, "", "_0"]) == "t_cat_0"  # room for the whole name: the whole name
    assert js(["t_cat_0", 6, "", "_0"]) == "t_c\u2026_0"
    assert js(["t_cat_0", 4, "", "_0"]) == "t\u2026_0"  # the stem's first letter at least, never "\u2026_0"
    assert js(["t_cat_0", 3, "", "_0"]) == ""  # no room for a stem: no label (the tooltip names it)
    assert js(["t_cat_0", 6, "\u2248 ", "_0"]) == "\u2248 t\u2026_0"  # an estimated node's marker first
    # Without siblings sharing a start, a name is cut on the right, as before.
    assert js(["embedding_bags", 8, "", ""]) == "embeddi\u2026"
    assert js(["embedding_bags", 3, "", ""]) == ""


@settings(max_examples=200, deadline=None)
@given(stem=st.text("abcdefghij_", min_size=1, max_size=12), index=st.integers(0, 999), room=st.integers(0, 20))
def test_a_cut_label_keeps_the_start_and_the_index(js, stem, index, room):
    name, suffix = f"{stem}_{index}", f"_{index}"
    label = js([name, room, "", suffix])
    assert len(label) <= room
    if label in ("", name):
        return
    head, cut, tail = label.partition(ELLIPSIS)
    assert cut and head and name.startswith(head)  # the start of the name, never none of it
    assert tail in (suffix, "")  # the index whole, or a plain cut on the right (3+ characters of its start)
    assert tail or len(head) >= 3
