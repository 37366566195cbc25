"""Rows -> component tree, the aggregation rules for containers, and the tree's invariants.

Runs store flat rows (one per component and phase); the tree is derived on demand, as pyinstrument
does. `self_check()` states what every tree must satisfy and is called by the tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from cbsite import schema


@dataclass
class Node:
    row: dict[str, Any]
    children: list["Node"] = field(default_factory=list)
    parent: "Node | None" = None

    @property
    def path(self) -> str:
        return self.row["path"]

    def __getitem__(self, key: str) -> Any:
        return self.row[key]

    def walk(self) -> Iterator["Node"]:
        """Pre-order traversal of this subtree."""
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))


@dataclass
class Tree:
    root: Node
    by_path: dict[str, Node]

    def __iter__(self) -> Iterator[Node]:
        return self.root.walk()

    def __len__(self) -> int:
        return len(self.by_path)

    def __getitem__(self, path: str) -> Node:
        return self.by_path[path]


def parent_path(path: str) -> str | None:
    """FQN of the parent: None for the root, "" for a top-level child."""
    if path == "":
        return None
    return path.rsplit(".", 1)[0] if "." in path else ""


def build_tree(rows: Iterable[dict[str, Any]]) -> Tree:
    """Build the tree of one phase's rows (children in `order`)."""
    ordered = sorted(rows, key=lambda r: r["order"])
    by_path: dict[str, Node] = {}
    for row in ordered:
        if row["path"] in by_path:
            raise ValueError(f"component {row['path']!r} appears twice in one phase")
        by_path[row["path"]] = Node(row=row)
    if "" not in by_path:
        raise ValueError("rows have no root component (path '')")
    for node in by_path.values():
        ppath = node.row["parent"]
        if ppath is None:
            continue
        if ppath not in by_path:
            raise ValueError(f"component {node.path!r} names parent {ppath!r}, which has no row")
        node.parent = by_path[ppath]
        node.parent.children.append(node)
    return Tree(root=by_path[""], by_path=by_path)


def self_check(tree: Tree) -> Tree:
    """Assert the structural invariants of a component tree; return it for chaining."""
    root = tree.root
    assert root.path == "" and root["parent"] is None and root["depth"] == 0, "bad root row"
    seen_orders: list[int] = []
    for node in tree:
        row = node.row
        assert row["status"] in schema.STATUSES, f"{node.path!r}: bad status {row['status']!r}"
        assert row["phase"] in schema.PHASES, f"{node.path!r}: bad phase {row['phase']!r}"
        assert row["phase"] == root["phase"], f"{node.path!r}: phase differs from the root's"
        seen_orders.append(row["order"])
        # A leaf module has no children; a non-leaf may show none when depth filters cut them.
        assert not (row["is_leaf"] and node.children), f"{node.path!r}: a leaf with children"
        if node is root:
            continue
        parent = node.parent
        assert parent is not None, f"{node.path!r} has no parent"
        assert row["parent"] == parent.path == parent_path(node.path), f"{node.path!r}: parent mismatch"
        assert row["depth"] == parent["depth"] + 1, f"{node.path!r}: depth is not parent depth + 1"
        assert row["name"] == node.path.rsplit(".", 1)[-1], f"{node.path!r}: name is not the last segment"
        assert row["order"] > parent["order"], f"{node.path!r}: ordered before its parent"
        assert row["call_count"] >= 0, f"{node.path!r}: negative call count"
    assert seen_orders == sorted(seen_orders), "pre-order traversal does not follow `order`"
    return tree


def derive_ratios(row: dict[str, Any], peak_flops: float | None, peak_bandwidth: float | None) -> None:
    """Fill the ratio metrics of a row from its additive ones and the device peaks (in place).

    tflops_per_s = flops / latency; mfu = achieved / peak FLOP/s; bandwidth_gbps = bytes / latency;
    bandwidth_util = achieved / peak bytes/s; arithmetic_intensity = flops / bytes; compile_speedup = latency /
    compiled latency where the compile plugin timed one.
    A ratio is null (n/a), never 0, where its numerator is zero or unknown: a FLOP-free module
    (ReLU, LayerNorm) has no MFU, a module that moves no bytes has no bandwidth utilisation.
    """
    latency_s = row["latency_ms"] / 1e3 if row.get("latency_ms") else None
    flops, nbytes = row.get("flops"), row.get("bytes_moved")
    row["tflops_per_s"] = flops / latency_s / 1e12 if latency_s and flops else None
    row["mfu"] = (
        row["tflops_per_s"] * 1e12 / peak_flops if row["tflops_per_s"] is not None and peak_flops else None
    )
    row["bandwidth_gbps"] = nbytes / latency_s / 1e9 if latency_s and nbytes else None
    row["bandwidth_util"] = (
        row["bandwidth_gbps"] * 1e9 / peak_bandwidth
        if row["bandwidth_gbps"] is not None and peak_bandwidth
        else None
    )
    row["arithmetic_intensity"] = flops / nbytes if flops and nbytes else None
    # The compile plugin's speedup is eager latency / compiled latency: it follows the latency wherever that is
    # pooled again (rounds, the hierarchy re-measurement), as the rates above do.
    if row.get("compiled_latency_ms"):
        row["compile_speedup"] = row["latency_ms"] / row["compiled_latency_ms"] if row.get("latency_ms") else None


def estimate_containers(tree: Tree, peak_flops: float | None, peak_bandwidth: float | None) -> Tree:
    """Give every `estimated` node the sums of its children (in place, bottom-up).

    A child's contribution is its per-call value x its calls per forward; dividing by the parent's
    calls per forward (1 for a container that is never called) gives the parent's per-call value.
    Ratios are recomputed from the sums, which equals the latency-weighted mean over the leaves.
    Peak memory of an estimate is the largest child's: a lower bound, and labelled so.
    """
    for node in reversed(list(tree)):
        row = node.row
        if row["status"] != "estimated":
            continue
        calls = max(row["call_count"], 1)
        missing = [c.path or "<root>" for c in node.children if c["status"] in ("failed", "skipped")]
        for metric in schema.ADDITIVE_METRICS:
            values = [(c[metric], c["call_count"]) for c in node.children if c[metric] is not None]
            # A never-called child (a ModuleList inside a container) counts once, like its parent.
            total = sum(v * max(n, 1) for v, n in values) / calls if values else None
            row[metric] = int(round(total)) if total is not None and metric in ("flops", "bytes_moved") else total
        row["latency_p25_ms"] = row["latency_p75_ms"] = row["samples"] = None
        peaks = [c["peak_memory_bytes"] for c in node.children if c["peak_memory_bytes"] is not None]
        row["peak_memory_bytes"] = max(peaks) if peaks else None
        row["unsupported_ops"] = sorted({op for c in node.children for op in (c["unsupported_ops"] or [])})
        notes = list(row.get("notes") or [])
        notes.append("estimated: sum of children (per call x calls); peak memory is the largest child's")
        if missing:
            notes.append("estimate excludes children without numbers: " + ", ".join(missing))
        row["notes"] = notes
        derive_ratios(row, peak_flops, peak_bandwidth)
    return tree
