"""Properties of the icicle layout, checked on the very JS file the site ships (cbsite/generator/templates/assets/icicle.js)
run by node on hypothesis-generated trees. One node process serves every example over stdin/stdout, so a
hundred trees cost well under a second."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ICICLE_JS = Path(__file__).parents[1] / "cbsite" / "generator" / "templates" / "assets" / "icicle.js"
NODE = shutil.which("node") or "/usr/bin/node"
TOL = 1e-9

pytestmark = pytest.mark.skipif(not Path(NODE).exists(), reason="node is not installed")

# Reads one JSON case per line: {parent, value, root}; answers one JSON layout per line.
DRIVER = r"""
const icicle = require(process.argv[1]);
const rl = require("readline").createInterface({ input: process.stdin });
rl.on("line", (line) => {
  const c = JSON.parse(line);
  let L;
  try { L = icicle.layout(c.parent, c.value, c.root); }
  catch (e) { process.stdout.write(JSON.stringify({ error: String(e.message) }) + "\n"); return; }
  const pick = (a) => L.nodes.map((i) => (Number.isFinite(a[i]) ? a[i] : null));
  process.stdout.write(JSON.stringify({ nodes: L.nodes, x0: pick(L.x0), x1: pick(L.x1), depth: L.nodes.map((i) => L.depth[i]),
    overflow: L.nodes.map((i) => (Number.isFinite(L.overflow[i]) ? L.overflow[i] : 1e308)), selfStart: pick(L.selfStart),
    ancestors: icicle.ancestors(c.parent, c.root) }) + "\n");
});
"""


@pytest.fixture(scope="module")
def node():
    proc = subprocess.Popen([NODE, "-e", DRIVER, str(ICICLE_JS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(parent: list[int], value: list[float | None], root: int) -> dict:
        proc.stdin.write(json.dumps({"parent": parent, "value": value, "root": root}) + "\n")
        proc.stdin.flush()
        out = json.loads(proc.stdout.readline())
        if "error" in out:
            raise ValueError(out["error"])
        n = out["nodes"]
        # Back to per-node dicts keyed by node index.
        return {"nodes": n, "ancestors": out["ancestors"],
                **{k: dict(zip(n, out[k])) for k in ("x0", "x1", "depth", "overflow", "selfStart")}}

    yield run
    proc.stdin.close()
    proc.wait(timeout=10)


@st.composite
def trees(draw, max_nodes: int = 40):
    """A pre-order parent array and per-node values: known (including 0), unknown (None), and parents
    smaller or larger than their children (self share, replay noise)."""
    n = draw(st.integers(1, max_nodes))
    parent = [-1]
    for i in range(1, n):
        parent.append(draw(st.integers(0, i - 1)))
    # Re-number into pre-order (the contract: parents before children, subtrees contiguous).
    kids: dict[int, list[int]] = {i: [] for i in range(n)}
    for i in range(1, n):
        kids[parent[i]].append(i)
    order, stack = [], [0]
    while stack:
        a = stack.pop()
        order.append(a)
        stack.extend(reversed(kids[a]))
    new = {old: k for k, old in enumerate(order)}
    parent = [-1 if parent[old] < 0 else new[parent[old]] for old in order]
    value = draw(st.lists(st.one_of(st.none(), st.just(0.0), st.floats(1e-6, 1e6)), min_size=n, max_size=n))
    root = draw(st.integers(0, n - 1))
    return parent, value, root


def _size(parent, value):
    """The reference model of a node's size: its value when known, else the sum of its children's."""
    n = len(parent)
    size, child_sum = [0.0] * n, [0.0] * n
    for i in range(n - 1, -1, -1):
        size[i] = value[i] if value[i] is not None and value[i] >= 0 else child_sum[i]
        if parent[i] >= 0:
            child_sum[parent[i]] += size[i]
    return size, child_sum


def _subtree(parent, root):
    inside = {root}
    for i in range(root + 1, len(parent)):
        if parent[i] in inside:
            inside.add(i)
    return inside


SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(trees())
def test_layout_properties(node, case):
    parent, value, root = case
    L = node(parent, value, root)
    size, child_sum = _size(parent, value)
    assert set(L["nodes"]) == _subtree(parent, root)  # the zoomed subtree, nothing else
    assert L["nodes"][0] == root and L["x0"][root] == 0 and L["x1"][root] == 1 and L["depth"][root] == 0
    assert L["ancestors"] == _chain(parent, root)
    for i in L["nodes"]:
        assert 0 <= L["x0"][i] <= L["x1"][i] <= 1 + TOL
        kids = [c for c in L["nodes"] if parent[c] == i]
        if not kids:
            continue
        x0, x1 = L["x0"][i], L["x1"][i]
        width = x1 - x0
        # Children inside their parent, one row down, left to right and disjoint.
        prev_end = x0
        for c in kids:
            assert L["depth"][c] == L["depth"][i] + 1
            assert L["x0"][c] >= prev_end - TOL and L["x1"][c] <= x1 + TOL
            prev_end = L["x1"][c]
        total = max(size[i], child_sum[i])
        if total > 0:
            for c in kids:  # widths proportional to the metric (scaled together when they overflow)
                assert math.isclose(L["x1"][c] - L["x0"][c], width * size[c] / total, rel_tol=1e-7, abs_tol=1e-12)
        # A parent larger than its children shows the rest as its self share; an overflowing one says by how much.
        if size[i] > child_sum[i] * (1 + 1e-9) and total > 0:
            assert math.isclose(x1 - L["selfStart"][i], width * (size[i] - child_sum[i]) / size[i], rel_tol=1e-6, abs_tol=1e-12)
        if child_sum[i] > size[i] * (1 + 1e-9):
            assert L["overflow"][i] > 1
            assert math.isclose(L["selfStart"][i], x1, rel_tol=1e-9, abs_tol=1e-9)  # children fill the parent
        else:
            assert L["overflow"][i] == 0


@SETTINGS
@given(trees(), st.data())
def test_zoom_keeps_relative_layout(node, case, data):
    """Zooming into a node lays out its subtree exactly as the full layout, stretched to full width."""
    parent, value, _ = case
    full = node(parent, value, 0)
    target = data.draw(st.sampled_from(full["nodes"]))
    zoom = node(parent, value, target)
    w = full["x1"][target] - full["x0"][target]
    for i in zoom["nodes"]:
        assert zoom["depth"][i] == full["depth"][i] - full["depth"][target]
        if w > 1e-6:
            assert math.isclose(zoom["x0"][i], (full["x0"][i] - full["x0"][target]) / w, abs_tol=1e-6)
            assert math.isclose(zoom["x1"][i], (full["x1"][i] - full["x0"][target]) / w, abs_tol=1e-6)


def _chain(parent, node):
    out = []
    p = parent[node]
    while p >= 0:
        out.insert(0, p)
        p = parent[p]
    return out


def test_layout_refuses_children_before_parents(node):
    with pytest.raises(ValueError, match="parents must precede children"):
        node([-1, 2, 0], [1, 1, 1], 0)


def test_replay_noise_example(node):
    """A measured parent of 10 whose children measured 8 and 4 (sum 12): scaled into the parent, 1.2x noted."""
    L = node([-1, 0, 0], [10.0, 8.0, 4.0], 0)
    assert math.isclose(L["overflow"][0], 1.2)
    assert math.isclose(L["x1"][1], 8 / 12) and math.isclose(L["x1"][2], 1.0)
    L = node([-1, 0, 0], [10.0, 3.0, 2.0], 0)  # children 5 of 10: half of the parent is its self share
    assert L["overflow"][0] == 0 and math.isclose(L["selfStart"][0], 0.5)
