"""Capture: one forward of the whole model with a pre-hook on every submodule.

Each call of each module is recorded as a `Call` (args and kwargs cloned at hook time, because later
in-place ops change them), keyed by (path, call index), together with the grad mode and which input
tensors required grad, so a replay can reproduce exactly what the full model did.
"""

from __future__ import annotations

import collections.abc
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch.utils import _pytree as pytree

from cbsite.errors import CbsiteError


@dataclass
class Call:
    """One captured call of one module: what it received, and under which autograd conditions."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    grad_enabled: bool
    # Per tensor leaf of (args, kwargs) in pytree order: did it require grad in the full model?
    requires_grad: list[bool]

    def replay_inputs(self, *, with_grad: bool) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Fresh clones of the inputs; floating leaves that required grad require it again."""
        flags = iter(self.requires_grad)

        def fresh(x: Any) -> Any:
            if not isinstance(x, torch.Tensor):
                return x
            wanted = next(flags)
            y = x.detach().clone()
            if with_grad and wanted and (y.is_floating_point() or y.is_complex()):
                y.requires_grad_(True)
            return y

        args, kwargs = pytree.tree_map(fresh, (self.args, self.kwargs))
        return args, kwargs


def refuse_iterators(batches: Sequence[tuple[tuple[Any, ...], dict[str, Any]]]) -> None:
    """Refuse generator and iterator inputs up front: the first call uses them up, so every replay (and the
    FLOP count) would see an empty input and report nothing."""
    for i, (args, kwargs) in enumerate(batches):
        named = [(f"positional argument {k}", a) for k, a in enumerate(args)] + [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
        for where, value in named:
            bad = [x for x in pytree.tree_leaves(value) if isinstance(x, collections.abc.Iterator)]
            if bad:
                raise CbsiteError(
                    f"{where} of example batch {i} is (or holds) a {type(bad[0]).__name__}, an iterator: the first call would use "
                    "it up and every replay would see nothing; pass a list or tuple instead (e.g. list(...))"
                )


def moved(obj: Any, device: torch.device, dtype: torch.dtype) -> Any:
    """Every tensor of a pytree on `device`; floating ones in `dtype` (ids and lengths keep theirs)."""
    def move(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        x = x.to(device)
        return x.to(dtype) if x.is_floating_point() else x

    return pytree.tree_map(move, obj)


def clone_detached(obj: Any) -> Any:
    """Deep-copy every tensor in a pytree (KeyedJaggedTensor is registered with pytree by torchrec)."""
    return pytree.tree_map(lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x, obj)


@dataclass
class Capture:
    """Everything one forward pass revealed: calls per module path, in call order."""

    calls: dict[str, list[Call]] = field(default_factory=dict)
    output: Any = None

    def call_count(self, path: str) -> int:
        return len(self.calls.get(path, ()))


def module_paths(model: nn.Module) -> dict[int, str]:
    """id(module) -> FQN; a module shared by several parents keeps its first FQN."""
    return {id(m): name for name, m in model.named_modules()}


def capture(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *, grad: bool) -> Capture:
    """Run one forward with pre-hooks (with kwargs) on every module; hooks are always removed."""
    result = Capture()
    paths = module_paths(model)
    handles = []

    def make_hook(path: str) -> Callable[..., None]:
        def hook(module: nn.Module, hook_args: tuple[Any, ...], hook_kwargs: dict[str, Any]) -> None:
            leaves = [x for x in pytree.tree_leaves((hook_args, hook_kwargs)) if isinstance(x, torch.Tensor)]
            result.calls.setdefault(path, []).append(
                Call(
                    args=clone_detached(hook_args),
                    kwargs=clone_detached(hook_kwargs),
                    grad_enabled=torch.is_grad_enabled(),
                    requires_grad=[t.requires_grad for t in leaves],
                )
            )

        return hook

    try:
        # Per-module hooks: torchrec calls EmbeddingBags with keyword arguments only, and the global
        # pre-hook API cannot see kwargs.
        for module in model.modules():
            path = paths[id(module)]
            handles.append(module.register_forward_pre_hook(make_hook(path), with_kwargs=True))
        with torch.set_grad_enabled(grad):
            result.output = model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return result


def tensors_in(obj: Any) -> list[torch.Tensor]:
    """Every tensor inside an output: pytree containers, dataclasses and plain objects' fields."""
    found: list[torch.Tensor] = []
    seen: set[int] = set()

    def visit(x: Any) -> None:
        if id(x) in seen:
            return
        seen.add(id(x))
        if isinstance(x, torch.Tensor):
            found.append(x)
            return
        leaves, spec = pytree.tree_flatten(x)
        if not spec.is_leaf():
            for leaf in leaves:
                visit(leaf)
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            for f in dataclasses.fields(x):
                visit(getattr(x, f.name))
        elif hasattr(x, "__dict__") and not isinstance(x, (nn.Module, type)):
            for value in vars(x).values():
                visit(value)

    visit(obj)
    return found


def describe(obj: Any) -> str:
    """A compact text of the inputs' structure, e.g. `f32[512,13], KJT(26 keys, B=512, 6412 ids)`."""
    def one(x: Any) -> str:
        if isinstance(x, torch.Tensor):
            dtype = str(x.dtype).replace("torch.", "")
            short = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "int64": "i64", "int32": "i32", "bool": "b"}
            return f"{short.get(dtype, dtype)}[{','.join(str(s) for s in x.shape)}]"
        kind = type(x).__name__
        if kind == "KeyedJaggedTensor":
            return f"KJT({len(x.keys())} keys, B={x.stride()}, {x.values().numel()} ids)"
        if kind == "KeyedTensor":
            return f"KeyedTensor({len(x.keys())} keys, {one(x.values())})"
        if isinstance(x, (list, tuple)):
            inner = ", ".join(one(v) for v in x[:8]) + (", …" if len(x) > 8 else "")
            return f"[{inner}]" if isinstance(x, list) else f"({inner})"
        if isinstance(x, dict):
            return "{" + ", ".join(f"{k}: {one(v)}" for k, v in list(x.items())[:8]) + "}"
        return kind if x is not None else "None"

    args, kwargs = obj
    parts = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()]
    return ", ".join(parts)
