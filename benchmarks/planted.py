"""A provider for noise benchmarks: the demo DLRM with real extra work planted in one named Linear.

`cbsite compare benchmarks.planted:dlrm benchmarks.planted:dlrm -H extra=0.5` compares the demo DLRM with
a copy whose Linear at `component` computes `extra` x its output rows more in one matmul (and drops
them), forward and (through autograd) backward, so that component, and every module above it, does
more real work; nothing is slept or spun. `extra=0` is an identical copy (an A/A arm). The paths, the
module tree and the inputs are the demo DLRM's.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

DEFAULT_COMPONENT = "over_arch.model.0._mlp.0._linear"


class PlantedLinear(nn.Linear):
    """A Linear whose matmul also produces `extra_weight`'s rows, which are then dropped.

    Every arm runs the same operators (cat, matmul, slice, bias add), with zero extra rows in the A and
    A' arms, so the planted arm differs only in how much real matmul work it does, forward and backward.
    """

    extra_weight: nn.Parameter

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = torch.cat([self.weight, self.extra_weight])
        return F.linear(x, weight)[..., : self.out_features] + self.bias


def plant(model: nn.Module, component: str, extra: float) -> nn.Module:
    """Make the Linear at `component` a PlantedLinear with `extra` x its output rows of extra work."""
    linear = model.get_submodule(component)
    if not isinstance(linear, nn.Linear) or linear.bias is None:
        raise ValueError(f"{component} is a {type(linear).__name__}, not a Linear with a bias")
    rows = int(math.ceil(extra * linear.out_features)) if extra > 0 else 0
    generator = torch.Generator().manual_seed(1234)
    weight = torch.randn(rows, linear.in_features, generator=generator, dtype=linear.weight.dtype) * 0.01
    linear.__class__ = PlantedLinear
    linear.register_parameter("extra_weight", nn.Parameter(weight, requires_grad=True))
    return model


def dlrm(component: str = DEFAULT_COMPONENT, extra: float = 0.0, seed: int = 0):
    """The demo DLRM (cbsite's `dlrm` provider, default size) with `extra` planted at `component`."""
    from cbsite.collector.providers import provide

    provided = provide("dlrm", {}, batches=1, seed=seed)
    batch = provided.inputs[0]
    return plant(provided.model, component, extra), batch.args, batch.kwargs
