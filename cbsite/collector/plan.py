"""Plan: the component tree of a model, breadth-first by depth, with depth and glob filters.

Paths are torch FQNs from `named_modules()` (pre-order, a shared module under its first FQN), so
`model.get_submodule(path)` returns the component. Measurement goes breadth-first: the shallow, big
components first, so a run cut short still covers the whole model at coarse grain.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Callable, Sequence

from torch import nn

from cbsite.errors import CbsiteError


@dataclass(frozen=True)
class Component:
    path: str
    name: str
    parent: str | None
    depth: int
    order: int
    module_type: str
    is_leaf: bool


@dataclass(frozen=True)
class PlanConfig:
    max_depth: int | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_depth is not None and self.max_depth < 0:
            raise CbsiteError(f"--max-depth must be 0 or more, got {self.max_depth}")


def qualified_type(module: nn.Module) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


def component_tree(model: nn.Module) -> list[Component]:
    """Every module of `model` in pre-order, each under its first FQN."""
    out = []
    for order, (path, module) in enumerate(model.named_modules()):
        parent = None if path == "" else (path.rsplit(".", 1)[0] if "." in path else "")
        out.append(
            Component(
                path=path,
                name=path.rsplit(".", 1)[-1],
                parent=parent,
                depth=0 if path == "" else path.count(".") + 1,
                order=order,
                module_type=qualified_type(module),
                is_leaf=next(iter(module.children()), None) is None,
            )
        )
    return out


def _matches(component: Component, patterns: Sequence[str]) -> str | None:
    short_type = component.module_type.rsplit(".", 1)[-1]
    for pattern in patterns:
        if any(fnmatch.fnmatchcase(s, pattern) for s in (component.path, component.module_type, short_type)):
            return pattern
    return None


def selected(component: Component, cfg: PlanConfig) -> str | None:
    """None when the component is to be measured, else why it is not."""
    if cfg.include and _matches(component, cfg.include) is None:
        return f"not selected by --include {' '.join(cfg.include)}"
    hit = _matches(component, cfg.exclude)
    if hit is not None:
        return f"excluded by --exclude {hit}"
    return None


def breadth_first(components: list[Component], later: Callable[[Component], bool] = lambda c: False) -> list[Component]:
    """Measurement order: by depth, then by pre-order within a depth, where the components `later` picks come after
    the others of their depth. The collection picks those replayed on batch 0 only (memory.Plan.batches_for): a
    capture group needs a forward of batch 1 and 2 up to its last member that rotates through batches, and with them
    last in each depth the last groups have none (GPT-2 small at 8 x 512: its layer norms and attention projections,
    cheap components that rotate, no longer make the last group run forwards of the other batches)."""
    return sorted(components, key=lambda c: (c.depth, later(c), c.order))


def within_depth(components: list[Component], cfg: PlanConfig) -> list[Component]:
    if cfg.max_depth is None:
        return list(components)
    return [c for c in components if c.depth <= cfg.max_depth]
