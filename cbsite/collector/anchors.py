"""Anchors: capture a group of inner modules by replaying the outer modules that contain them.

A capture group (memory.py) needs the inputs of its members for every batch it rotates through. Captured with
a forward of the whole model, each group costs one forward per batch up to its last member, and the groups of
the deep levels of a large model (GPT-2 small at 8 x 512: the attention and MLP layers of blocks 9-11) run
almost the whole model for a few modules' inputs: 10 forwards for 4 groups there, 78 s of a 663 s collection.

An **anchor** is an outermost module called below the root (GPT-2's blocks, DLRM's arches; `anchors_of`).
Its captured calls are kept past their own group, within the plan's allowance (`Anchors.fit`), and a later group
whose members all lie inside anchors is captured by replaying just those anchors' calls on their captured
inputs, in the order the model called them (capture.capture `through`): what the model computes for those
modules from the anchor's inputs, without the modules before the first anchor, after the last, or between.

Where that cannot stand for the whole forward, the group is captured with whole forwards as before, and the
anchors are let go for the rest of the collection (run.json `memory.capture_anchors.off` says why):

* a member did not make its calls within the anchors replayed (a module shared with another part of the model);
* on batch 0, a member's inputs differ in bytes from what the census saw in the whole forward (an ancestor's
  forward changed them, such as an autocast region or a dtype cast around the anchor's call);
* replaying an anchor raised.

What the replay does not reproduce is what the whole forward would not reproduce either: random draws (dropout)
differ between a group's forward and the census's as they do between two forwards.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from torch import nn

from cbsite.collector.capture import Call


def anchors_of(counts: Mapping[str, int]) -> dict[str, str]:
    """Per module called in the forward (census counts, paths as in `named_modules`), its anchor: the outermost
    module above it, below the root, that the forward calls. Modules with none (the anchors themselves, and
    modules called straight from the root) are not keys."""
    called = {path for path, n in counts.items() if n > 0 and path}
    anchored: dict[str, str] = {}
    for path in called:
        parts = path.split(".")
        for k in range(1, len(parts)):
            above = ".".join(parts[:k])
            if above in called:
                anchored[path] = above
                break
    return anchored


class Anchors:
    """The anchors' captured calls, kept past their group while they fit the plan's allowance."""

    def __init__(self, counts: Mapping[str, int], modules: Mapping[str, nn.Module], enabled: bool = True) -> None:
        self.of = anchors_of(counts) if enabled else {}
        self.order = {path: i for i, path in enumerate(counts)}  # the census's call order
        self.modules = modules
        self.kept: dict[str, list[list[Call]]] = {}  # per anchor, per batch, its calls
        self.off: str | None = (None if self.of else "no module is called inside another below the root" if enabled
                                else "every module is captured in one group (capture_all_at_once)")
        self.batches = 0  # batches of groups captured by replaying anchors
        self.calls = 0  # anchor calls replayed for them
        self.bytes = 0  # the inputs the anchors hold (planned: census bytes x batches)
        self.decided = False

    def fit(self, input_bytes: Mapping[str, int], batches_for: Any, allowance_bytes: int) -> bool:
        """Decide, once, whether the anchors' inputs are kept: their bytes (every batch each rotates through) within
        the allowance, which the groups after them then share (memory.Plan.group `held`)."""
        if self.off is None and not self.decided:
            self.decided = True
            self.bytes = sum(input_bytes.get(a, 0) * batches_for(a) for a in set(self.of.values()))
            if self.bytes > allowance_bytes:
                self.let_go(f"the anchors' inputs ({self.bytes / 2**20:,.0f} MiB) would pass the allowance "
                            f"({allowance_bytes / 2**20:,.0f} MiB)")
        return self.off is None

    def keep(self, held: Mapping[str, list[list[Call]]]) -> None:
        """Keep the anchors among a group's captured calls (the same lists: no copy while the group is held)."""
        if self.off is None:
            for anchor in set(self.of.values()) & set(held):
                self.kept[anchor] = held[anchor]

    def held_bytes(self) -> int:
        """What the kept anchors hold beside a group (the plan's figure)."""
        return self.bytes if self.off is None and self.kept else 0

    def through(self, members: Sequence[str], batch: int) -> list[tuple[nn.Module, Call]] | None:
        """The anchor calls to replay for `members`' inputs of `batch`, in the model's order, or None where a member
        has no anchor or its anchor's calls of that batch are not kept."""
        if self.off is not None:
            return None
        needed = set()
        for path in members:
            anchor = self.of.get(path)
            if anchor is None or len(self.kept.get(anchor, ())) <= batch:
                return None
            needed.add(anchor)
        return [(self.modules[a], call) for a in sorted(needed, key=self.order.__getitem__) for call in self.kept[a][batch]]

    def mismatch(self, members: Sequence[str], got: Mapping[str, int], census: Mapping[str, int]) -> str | None:
        """Why batch 0's replay does not stand for the whole forward (input bytes per member against the census's),
        or None."""
        for path in members:
            if got.get(path, 0) != census.get(path, 0):
                return (f"{path}'s inputs replayed from its anchor {self.of[path]} take {got.get(path, 0):,} bytes, "
                        f"the whole forward's {census.get(path, 0):,}: something around the anchor's call changes them")
        return None

    def drop(self) -> None:
        """The collection's last use of captured inputs is over (capture_plan.GroupedCaptures.drop)."""
        self.kept = {}

    def let_go(self, why: str) -> None:
        self.off = self.off or why
        self.kept = {}

    def record(self) -> dict[str, Any]:
        return {"anchors": len(set(self.of.values())), "bytes": self.bytes, "batches": self.batches,
                "anchor_calls": self.calls, "off": self.off}
