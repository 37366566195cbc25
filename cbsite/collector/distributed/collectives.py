"""Collectives seen from the dispatcher: which `c10d::` ops a piece of code issues, and their bytes.

Communication is recognised by what a component does, not by its name: every eager collective goes
through the dispatcher as a `c10d::` op (all_to_all_single is `c10d::alltoall_base_`, all_reduce is
`c10d::allreduce_`, ...), so a TorchDispatchMode sees it with its tensors. Bytes are counted from the
op's tensors: what the rank hands the collective is *sent*, what it gets back filled is *received*
(the rank's own share included, as the op's buffers hold it).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

# Ops whose first argument is the buffer that is received into (output first in their schemas).
_OUTPUT_FIRST = ("alltoall_base_", "alltoall_", "allgather_", "_allgather_base_", "allgather_into_tensor_coalesced_",
                 "reduce_scatter_", "_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_", "gather_", "recv_")
# In-place collectives: the same buffer is sent and received into.
_IN_PLACE = ("allreduce_", "allreduce_coalesced_", "broadcast_", "reduce_")


def _nbytes(obj: Any) -> int:
    return sum(t.numel() * t.element_size() for t in pytree.tree_leaves(obj) if isinstance(t, torch.Tensor))


@dataclass
class Traffic:
    """Collectives issued by one run of a piece of code: op -> calls, and bytes sent and received."""

    calls: Counter = field(default_factory=Counter)
    bytes_sent: int = 0
    bytes_received: int = 0

    @property
    def communicates(self) -> bool:
        return bool(self.calls)

    def ops(self) -> list[str]:
        """`op xN` per op, sorted: the row's `collectives` column."""
        return [f"{op} x{n}" for op, n in sorted(self.calls.items())]

    def scaled(self, divisor: int) -> "Traffic":
        """Per call of a component replayed `divisor` calls at a time (bytes; op counts stay per replay)."""
        if divisor <= 1:
            return self
        return Traffic(Counter(self.calls), self.bytes_sent // divisor, self.bytes_received // divisor)


class CollectiveMode(TorchDispatchMode):
    """Records every `c10d::` op dispatched while active (nests with counting modes)."""

    def __init__(self) -> None:
        super().__init__()
        self.traffic = Traffic()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = func._schema.name
        if name.startswith("c10d::"):
            op = name.split("::", 1)[1]
            self.traffic.calls[name] += 1
            first, rest = (args[0] if args else None), (args[1:], kwargs)
            if op in _OUTPUT_FIRST:
                self.traffic.bytes_received += _nbytes(first)
                self.traffic.bytes_sent += _nbytes(rest[0][:1]) if op != "recv_" else 0
            elif op in _IN_PLACE:
                self.traffic.bytes_sent += _nbytes(first)
                self.traffic.bytes_received += _nbytes(first)
            elif op == "send":
                self.traffic.bytes_sent += _nbytes(first)
            elif op not in ("barrier", "monitored_barrier_"):
                self.traffic.bytes_sent += _nbytes(first)
        return func(*args, **kwargs)
