"""Standard normal tensors of any size, cheap: backward's grad_outputs and the peak check's matmul operands.

No cbsite import here: calibration, peaks and the backward graphs all take their values from this one floor.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

NORMAL_TILE = 1 << 20  # normal values drawn per tensor by `normal_values`; a larger tensor repeats them


def normal_values(shape: Sequence[int], dtype: torch.dtype, device: Any = "cpu",
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """A contiguous tensor of standard normal values: up to NORMAL_TILE drawn from `generator`, repeated in order past
    that. Drawing is the slow part (a language model's logits are hundreds of millions of values per backward graph;
    benchmarks/collect_scale.py); copying a drawn tile is a memory copy. What they serve (backward's grad_outputs, a
    matmul's operands) does work that depends on shapes, dtypes and memory, not on the values, so a tensor of repeated
    values costs what fresh ones would."""
    numel = math.prod(shape)
    if numel <= NORMAL_TILE:
        return torch.randn(tuple(shape), dtype=dtype, device=device, generator=generator)
    tile = torch.randn(NORMAL_TILE, dtype=dtype, device=device, generator=generator)
    out = torch.empty(numel, dtype=dtype, device=device)
    whole = numel // NORMAL_TILE
    out[: whole * NORMAL_TILE].view(whole, NORMAL_TILE).copy_(tile.expand(whole, NORMAL_TILE))
    out[whole * NORMAL_TILE:].copy_(tile[: numel - whole * NORMAL_TILE])
    return out.view(tuple(shape))
