"""A provider for noise benchmarks: the demo DLRM with real extra work planted in one named Linear.

`cbsite compare benchmarks.planted:dlrm benchmarks.planted:dlrm -H extra=0.15` compares the demo DLRM
with a copy whose Linear at `component` also multiplies its input by an extra weight of
`extra` x its output features, in forward and (through autograd) backward, so that component, and
every module above it, does more real work; nothing is slept or spun. `extra=0` is an identical copy
(an A/A arm). The paths, the module tree and the inputs are the demo DLRM's.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

DEFAULT_COMPONENT = "over_arch.model.0._mlp.0._linear"


class PlantedLinear(nn.Linear):
    """A Linear that also computes `x @ extra_weight.T` and adds 0 x its sum: extra work, same output."""

    extra_weight: nn.Parameter

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D401
        out = F.linear(x, self.weight, self.bias)
        if self.extra_weight.numel():
            out = out + 0.0 * F.linear(x, self.extra_weight).sum()
        return out


def plant(model: nn.Module, component: str, extra: float) -> nn.Module:
    """Turn the Linear at `component` into a PlantedLinear doing `extra` x its matmul work more."""
    linear = model.get_submodule(component)
    if not isinstance(linear, nn.Linear):
        raise ValueError(f"{component} is a {type(linear).__name__}, not a Linear")
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
