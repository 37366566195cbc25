"""Discovery: the sharded pieces of a DMP model as components, and which components communicate.

torchrec's sharded collections (`ShardedEmbeddingBagCollection`, `ShardedEmbeddingCollection`) keep
their per-sharding-type modules in plain lists (`_input_dists`, `_lookups`, `_output_dists`), so
`named_modules()` does not list them, and the input dists exist only after a first forward. Each
becomes a component at a stable path under its owner: `<owner>.input_dist.<sharding type>`,
`<owner>.lookup.<sharding type>`, `<owner>.output_dist.<sharding type>`, under three stage containers
(`<owner>.input_dist`, ...), which are estimated from their pieces.

A piece returns torchrec awaitables; `Resolved` waits for them, so one call of a component does all
of its work (the input dist's second all-to-all is issued in its awaitable's `wait()`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.utils import _pytree as pytree

from cbsite.collector.capture import Call, capture, clone_detached
from cbsite.collector.distributed.collectives import CollectiveMode

STAGES = (("_input_dists", "input_dist"), ("_lookups", "lookup"), ("_output_dists", "output_dist"))
STAGE_TYPE = "cbsite.distributed.Stage"  # module_type of the stage containers (not torch modules)


@dataclass
class Piece:
    path: str  # <owner>.<stage>.<sharding type>
    owner: str
    stage: str  # input_dist | lookup | output_dist
    sharding_type: str
    module: nn.Module  # the piece itself (a data-parallel lookup's DDP wrapper removed)
    module_type: str


def _unwrapped(module: nn.Module) -> nn.Module:
    """A DDP-wrapped piece (data-parallel lookups) without its wrapper: its gradient all-reduce belongs
    to the training step, and DDP refuses forwards whose backward never ran."""
    from torch.nn.parallel import DistributedDataParallel

    return module.module if isinstance(module, DistributedDataParallel) else module


def _sharding_types(owner: nn.Module) -> list[str]:
    types = getattr(owner, "_sharding_types", None)
    if types is None:
        types = list(getattr(owner, "_sharding_type_to_sharding", {}).keys())
    return [str(getattr(t, "value", t)) for t in types]


def pieces(model: nn.Module) -> list[Piece]:
    """Every sharded piece of `model`, owners in pre-order, stages in order, sharding types in torchrec's order."""
    found = []
    for owner_path, owner in model.named_modules():
        if not all(isinstance(getattr(owner, attr, None), list) for attr, _ in STAGES):
            continue
        types = _sharding_types(owner)
        for attr, stage in STAGES:
            for i, module in enumerate(getattr(owner, attr)):
                kind = types[i] if i < len(types) else f"shard{i}"
                inner = _unwrapped(module)
                cls = type(inner)
                found.append(Piece(f"{owner_path}.{stage}.{kind}" if owner_path else f"{stage}.{kind}", owner_path, stage,
                                   kind, inner, f"{cls.__module__}.{cls.__qualname__}"))
    return found


def promote_grad_buffers(found: list[Piece]) -> list[str]:
    """Buffers that require grad (a lookup with no table on this rank returns its `_dummy_embs_tensor`) become
    parameters, so they are among the tensors a backward replay differentiates for.

    Why: a replay's `autograd.grad(outputs, inputs + parameters)` runs only the nodes that lead to those
    tensors. Training's `backward()` runs them all, so on a rank without a table-wise table the output dist's
    backward all-to-all still runs; pruned, that rank would skip it while the others wait for it. Returns
    the promoted buffers' names.
    """
    promoted = []
    for p in found:
        for name, module in p.module.named_modules():
            for key, buf in list(module._buffers.items()):
                if buf is not None and buf.requires_grad and buf.is_leaf:
                    del module._buffers[key]
                    module.register_parameter(key, nn.Parameter(buf.detach(), requires_grad=True))
                    promoted.append(f"{p.path}:{name + '.' if name else ''}{key}")
    return promoted


class Resolved(nn.Module):
    """A sharded piece (or a module holding some) whose awaitables are waited for: one call is all its work.

    `holds` are the sharded pieces inside a module: torchrec keeps them in plain lists, so their tables are
    not the module's parameters; registered here, a backward replay differentiates for them as training
    does (through the output dist's collectives) instead of stopping at the dense parameters.
    """

    def __init__(self, piece: nn.Module, holds: list[nn.Module] | None = None, kjt_stride: int | None = None) -> None:
        super().__init__()
        self.piece = piece
        self.holds = nn.ModuleList(holds or [])
        self.kjt_stride = kjt_stride

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        from torchrec.distributed.types import Awaitable

        if self.kjt_stride is not None:
            args = tuple(_with_stride(a, self.kjt_stride) for a in args)
        out = self.piece(*args, **kwargs)
        while isinstance(out, Awaitable):
            out = out.wait()
        return out


def _is_kjt(value: Any) -> bool:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    return isinstance(value, KeyedJaggedTensor)


def _with_stride(value: Any, stride: int) -> Any:
    """A replayed KeyedJaggedTensor with no keys gets back its batch size.

    Why: a captured call's inputs are rebuilt through pytree, which infers a KJT's batch size from its
    lengths; with no keys (what a rank without a table-wise table hands that lookup) that is 0, and the
    lookup would return [0, 0] where the model's forward got [B, 0].
    """
    if _is_kjt(value) and not value.keys() and not value.variable_stride_per_key() and value.stride() != stride:
        value._stride = stride
    return value


@dataclass
class Captured:
    """What the capture forwards showed: the pieces' calls per batch, and the modules that communicated."""

    calls: dict[str, list[list[Call]]]  # piece path -> per batch -> calls
    module_calls: dict[str, list[list[Call]]]  # module path -> per batch -> calls (capture.capture's)
    communicating: set[str]  # module paths with a collective while they were on the call stack
    strides: dict[str, int | None] = field(default_factory=dict)  # piece path -> batch size of its KJT input

    def resolved(self, piece: "Piece") -> "Resolved":
        """The piece, ready to replay its captured calls."""
        return Resolved(piece.module, kjt_stride=self.strides.get(piece.path))


def capture_pieces(model: nn.Module, found: list[Piece], batches: list[tuple[tuple, dict]], grad: bool) -> Captured:
    """One forward per batch (`capture.capture`, which records every module's calls) with pre-hooks on the
    pieces (their inputs, cloned) and a call stack of every module, so each collective is attributed to
    the modules it ran under. Hooks are always removed."""
    calls: dict[str, list[list[Call]]] = {p.path: [[] for _ in batches] for p in found}
    strides: dict[str, int | None] = {}
    stack: list[str] = []
    communicating: set[str] = set()
    state = {"batch": 0}

    class Attributing(CollectiveMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            if func._schema.name.startswith("c10d::"):
                communicating.update(stack)
            return super().__torch_dispatch__(func, types, args, kwargs)

    def piece_hook(path: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            leaves = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
            calls[path][state["batch"]].append(Call(clone_detached(args), clone_detached(kwargs), torch.is_grad_enabled(),
                                                    [t.requires_grad for t in leaves]))
            strides.setdefault(path, next((a.stride() for a in args if _is_kjt(a)), None))
        return hook

    def push(path: str) -> Callable[..., None]:
        return lambda module, args: stack.append(path)

    def pop(module: nn.Module, args: Any, output: Any) -> None:
        stack.pop()

    handles = [p.module.register_forward_pre_hook(piece_hook(p.path), with_kwargs=True) for p in found]
    for path, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(push(path)))
        handles.append(module.register_forward_hook(pop))
    module_calls: dict[str, list[list[Call]]] = {}
    try:
        with Attributing():
            for i, (args, kwargs) in enumerate(batches):
                state["batch"] = i
                stack.clear()
                cap = capture(model, args, kwargs, grad=grad)
                for path, per in cap.calls.items():
                    module_calls.setdefault(path, [[] for _ in batches])[i] = per
    finally:
        for h in handles:
            h.remove()
    return Captured(calls, module_calls, communicating, strides)
