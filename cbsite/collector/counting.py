"""Count what a component does, outside any timed region: FLOPs, bytes moved, and the ops we have no
FLOP formula for.

Definitions (experts check these; docs/flops.md gives every formula and why it differs from FlopCounterMode's):
- FLOPs are multiply-accumulate work, 2 per multiply-accumulate: `torch.utils.flop_counter.FlopCounterMode`'s
  formulas (matmul, GPU attention) with cbsite's over and beside them (EXTRA_FLOP_FORMULAS): convolution forward and
  backward for any `groups` (FlopCounterMode's weight-gradient term ignores groups), `_grouped_mm` from its offsets
  (MoE experts), CPU flash attention, and embedding-bag pooling forward and backward (one FLOP per gathered element,
  two with per-sample weights).
- Element-wise, reduction, normalisation, data-movement and creation ops are *not* FLOP-counted by definition (they
  are bandwidth-bound; see bytes moved), decided by rule (not_counted_reason: aten tags, op families, backward of a
  left-out op, an element-wise decomposition). Any other op without a formula is listed in `unsupported_ops`, never
  silently counted as zero.
- Bytes moved is a roofline estimate: for every aten op, the bytes of its distinct input tensors plus
  its output tensors (numel x itemsize). View ops move nothing.
- Work set by shapes alone is counted on shapes (`count_on_shapes`): the same pass on fake tensors, which carry
  shapes, strides and dtypes but do no arithmetic (benchmarks/count_on_shapes.py compares the two). Where
  that pass cannot stand for a real one (an op without a shape rule, a value-dependent output or control flow, an op
  whose work may depend on values: twins.value_dependent, or whose formula reads values: VALUE_FORMULAS) the
  component is counted for real; torch's fake-tensor failure logs stay off the terminal meanwhile. A test checks
  both ways give the same counts.
- Peak memory is not counted here: a dispatch mode changes autograd's in-place choices, so it is
  measured from the allocator instead (cpu_memory.py, measure.py).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from math import prod
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch import nn
from torch._decomp import decomposition_table
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils.flop_counter import FlopCounterMode, flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from cbsite.collector.twins import value_dependent

aten = torch.ops.aten


def _conv_macs(x_shape: Sequence[int], w_shape: Sequence[int], out_shape: Sequence[int], transposed: bool) -> int:
    """Multiply-accumulates of a direct convolution, any `groups`, stride, padding or dilation. The weight's shape
    already holds the group split (C_out x C_in/groups x kernel; C_in x C_out/groups x kernel transposed), so each
    output point (each input point when transposed) of each sample meets every weight once: prod(w_shape)."""
    spatial = (x_shape if transposed else out_shape)[2:]
    return x_shape[0] * prod(spatial) * prod(w_shape)


def _conv_flop(x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed, *args, out_shape=None, **kwargs) -> int:
    return 2 * _conv_macs(x_shape, w_shape, out_shape, transposed)


def _direct_conv_flop(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    """The backend kernels of a (non-transposed) convolution, reached only when called directly."""
    return 2 * _conv_macs(x_shape, w_shape, out_shape, False)


def _direct_conv_transpose_flop(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * _conv_macs(x_shape, w_shape, out_shape, True)


def _conv_backward_flop(grad_out_shape, x_shape, w_shape, _bias_sizes, _stride, _padding, _dilation, transposed,
                        _output_padding, _groups, output_mask, out_shape=None, **kwargs) -> int:
    """The input gradient is a (transposed) convolution of the output gradient with the same weights, the weight
    gradient a convolution of the input with the output gradient, restricted to each group: both are the forward's
    multiply-accumulates. (FlopCounterMode's weight term convolves every input channel with every output channel,
    `groups` times too many: 64x for a depthwise Conv2d(64, 64, 3, groups=64).) The bias gradient is a reduction."""
    forward = 2 * _conv_macs(x_shape, w_shape, grad_out_shape, transposed)
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def _known_value(t: torch.Tensor) -> int | None:
    """A one-element tensor's value, or None where only its shape exists (a fake or meta tensor)."""
    if isinstance(t, FakeTensor) or t.device.type == "meta":
        return None
    try:
        return int(t.item())
    except Exception:  # noqa: BLE001 - another tensor subclass without values: count the full extent
        return None


def _grouped_mm_flop(a, b, *args, offs=None, out_val=None, **kwargs) -> int:
    """`_grouped_mm(a, b, offs)`: 2 per multiply-accumulate of each group's matmul. `offs` holds each group's end along
    the split dimension (rows of a 2-D `a` against a 3-D `b`; the shared K of two 2-D operands, as in the weight
    gradient; columns of a 2-D `b` against a 3-D `a`), and the kernel skips what lies past the last offset: the work
    is the whole product with the split dimension cut at offs[-1]. That is a value: on fake or meta tensors it is
    unknown, the full extent is taken, and the counting pass that met it is not kept (VALUE_FORMULAS)."""
    if offs is None and len(args) >= 1:
        offs = args[0]
    used = None if offs is None or offs.numel() == 0 else _known_value(offs[-1])

    def cut(full: int) -> int:
        return full if used is None else min(full, used)

    if a.dim() == 3 and b.dim() == 3:  # batched: no offsets
        return 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]
    if a.dim() == 2 and b.dim() == 3:  # (M, K) x (G, K, N): rows split
        return 2 * cut(a.shape[0]) * a.shape[1] * b.shape[2]
    if a.dim() == 2 and b.dim() == 2:  # (M, K) x (K, N) -> (G, M, N): the shared K split
        return 2 * a.shape[0] * cut(a.shape[1]) * b.shape[1]
    return 2 * a.shape[1] * a.shape[2] * cut(b.shape[1])  # (G, M, K) x (K, N): columns split


_grouped_mm_flop._get_raw = True  # type: ignore[attr-defined]  # FlopCounterMode passes tensors, not shapes


def _scaled_grouped_mm_flop(a, b, scale_a=None, scale_b=None, offs=None, *args, out_val=None, **kwargs) -> int:
    return _grouped_mm_flop(a, b, offs=offs)


_scaled_grouped_mm_flop._get_raw = True  # type: ignore[attr-defined]

# Embedding bags. Definition: pooling adds each gathered row into its bag, one FLOP per gathered element (two with
# per-sample weights: scale, then add; max pooling compares instead of adding). Backward mirrors it: the gradient of
# each bag is scatter-added into one table row per index (one FLOP per element, two with per-sample weights; under max
# pooling only the maximum of each bag and dimension gets it: one per output element), and the per-sample weights'
# gradient is a dot product of the bag's gradient with each gathered row (2 per multiply-accumulate).
# Modes: 0 sum, 1 mean (its 1/bag size is element-wise, not counted), 2 max.
_MAX_MODE = 2


def _embedding_bag_flop(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                        per_sample_weights=None, *args, out_shape=None, **kwargs) -> int:
    return indices[0] * weight[1] * (2 if per_sample_weights is not None else 1)


def _bag_gradient_flop(grad, indices, mode, per_sample_weights) -> int:
    if mode == _MAX_MODE:
        return grad[0] * grad[1]
    return indices[0] * grad[1] * (2 if per_sample_weights is not None else 1)


def _embedding_bag_backward_flop(grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                                 scale_grad_by_freq, mode, sparse, per_sample_weights=None, *args, out_shape=None,
                                 **kwargs) -> int:
    return _bag_gradient_flop(grad, indices, mode, per_sample_weights)


def _embedding_bag_dense_backward_flop(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                       scale_grad_by_freq, mode, per_sample_weights=None, *args, out_shape=None,
                                       **kwargs) -> int:
    return _bag_gradient_flop(grad, indices, mode, per_sample_weights)


def _embedding_bag_sparse_backward_flop(grad, indices, offsets, offset2bag, bag_size, num_weights,
                                        scale_grad_by_freq, mode, per_sample_weights=None, *args, out_shape=None,
                                        **kwargs) -> int:
    return _bag_gradient_flop(grad, indices, mode, per_sample_weights)


def _embedding_bag_per_sample_weights_backward_flop(grad, weight, indices, *args, out_shape=None, **kwargs) -> int:
    return 2 * indices[0] * grad[1]


def _sdpa_cpu_flop(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _sdpa_cpu_backward_flop(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


def _packets(*names: str) -> list[Any]:
    """The aten packets of these names that this build of torch has."""
    return [getattr(aten, n) for n in names if hasattr(aten, n)]


# cbsite's formulas, over FlopCounterMode's where both have one (docs/flops.md says where and why).
EXTRA_FLOP_FORMULAS: dict[Any, Callable[..., int]] = {
    **{p: _conv_flop for p in _packets("convolution", "_convolution", "convolution_overrideable")},
    aten.convolution_backward: _conv_backward_flop,
    **{p: _direct_conv_flop for p in _packets(
        "cudnn_convolution", "miopen_convolution", "mkldnn_convolution", "_slow_conv2d_forward", "slow_conv3d_forward",
        "slow_conv_dilated2d", "slow_conv_dilated3d", "_conv_depthwise2d", "_nnpack_spatial_convolution")},
    **{p: _direct_conv_transpose_flop for p in _packets(
        "cudnn_convolution_transpose", "miopen_convolution_transpose", "slow_conv_transpose2d",
        "slow_conv_transpose3d")},
    **{p: _grouped_mm_flop for p in _packets("_grouped_mm")},
    **{p: _scaled_grouped_mm_flop for p in _packets("_scaled_grouped_mm")},
    aten._embedding_bag: _embedding_bag_flop,
    aten._embedding_bag_forward_only: _embedding_bag_flop,
    aten._embedding_bag_backward: _embedding_bag_backward_flop,
    aten._embedding_bag_dense_backward: _embedding_bag_dense_backward_flop,
    aten._embedding_bag_sparse_backward: _embedding_bag_sparse_backward_flop,
    aten._embedding_bag_per_sample_weights_backward: _embedding_bag_per_sample_weights_backward_flop,
    aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu_flop,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_cpu_backward_flop,
}
# Formulas that read tensor values (`_grouped_mm`'s offsets): a pass on fake tensors cannot stand for a real one.
VALUE_FORMULAS = frozenset(_packets("_grouped_mm", "_scaled_grouped_mm"))


def flop_counter() -> FlopCounterMode:
    """FlopCounterMode with cbsite's formulas over its own."""
    return FlopCounterMode(display=False, custom_mapping=dict(EXTRA_FLOP_FORMULAS))


def _is_view(func: Any) -> bool:
    return bool(getattr(func, "is_view", False)) or any(
        r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns
    )


# ----- which ops the FLOP definition leaves out ---------------------------------------------------------------------
# FLOPs are multiply-accumulate work. Left out by definition, so never "unsupported": element-wise ops (aten's
# `pointwise` tag, or a decomposition made of element-wise ops only: hardswish, floor_divide), reductions (the
# `reduction` tag and the families below), views, creation (no tensor argument), data movement, and the backward of
# any of these. Any other op without a formula is listed in `unsupported_ops`: it may do multiply-accumulates that no
# formula counts (an unknown custom op, a linear-algebra routine).
NOT_COUNTED_FAMILIES: dict[str, tuple[str, ...]] = {
    # substrings of the op's name (distinctive words)
    "normalisation": ("norm",),
    "softmax": ("softmax",),
    "pooling": ("max_pool", "avg_pool", "adaptive_max", "adaptive_avg", "fractional_max", "max_unpool", "lp_pool"),
    "loss": ("loss", "cross_entropy", "kl_div"),
    "random": ("dropout", "bernoulli", "rand", "multinomial", "normal", "uniform", "exponential_", "geometric_"),
    "data movement": ("copy", "clone", "index", "gather", "scatter", "upsample", "_pad", "pad_", "fill", "masked",
                      "unfold", "im2col", "col2im", "shuffle", "grid_sampler", "strided"),
    "sorting, searching, counting": ("sort", "topk", "kthvalue", "median", "unique", "histc", "histogram",
                                     "bincount", "bucketize", "searchsorted", "nonzero", "cumsum", "cumprod",
                                     "cummax", "cummin", "logcumsumexp", "offsets_range"),
}
# whole names (after stripping leading and trailing underscores): too short to match as words
NOT_COUNTED_NAMES = frozenset({
    "sum", "nansum", "mean", "nanmean", "prod", "amax", "amin", "aminmax", "max", "min", "argmax", "argmin", "var",
    "std", "var_mean", "std_mean", "logsumexp", "any", "all", "count_nonzero", "mode",
    "cat", "stack", "split", "split_with_sizes", "chunk", "unbind", "tensor_split", "narrow", "repeat", "tile",
    "repeat_interleave", "flip", "roll", "where", "tril", "triu", "embedding", "embedding_dense_backward",
    "one_hot", "contiguous", "detach", "alias", "lift_fresh", "set", "resize", "to", "item", "local_scalar_dense",
    "pin_memory", "is_pinned", "unsafe_view", "constant_pad_nd", "empty", "zeros", "ones", "full", "arange",
    "linspace", "logspace", "eye", "new_empty", "new_zeros", "new_ones", "new_full", "new_empty_strided", "zero",
    "empty_like", "zeros_like", "ones_like", "full_like", "scalar_tensor", "sym_size", "sym_stride", "sym_numel",
    "sym_storage_offset", "linalg_check_errors",
    # fbgemm / torchrec jagged-data plumbing (named one by one: fbgemm also has jagged ops that multiply)
    "asynchronous_complete_cumsum", "asynchronous_exclusive_cumsum", "asynchronous_inclusive_cumsum",
    "segment_sum_csr", "dense_to_jagged", "jagged_to_padded_dense", "expand_into_jagged_permute",
    "bounds_check_indices", "permute_2D_sparse_data", "permute_1D_sparse_data", "block_bucketize_sparse_features",
    "permute_pooled_embs", "permute_pooled_embs_auto_grad", "permute_multi_embedding", "regroup_keyed_tensor",
})
_BACKWARD_SUFFIXES = ("_backward_data", "_double_backward", "_backward")


def _name_reason(name: str) -> str | None:
    bare = name.strip("_")
    if bare in NOT_COUNTED_NAMES:
        return "by name"
    for family, words in NOT_COUNTED_FAMILIES.items():
        if any(w in name for w in words):
            return family
    for suffix in _BACKWARD_SUFFIXES:  # the backward of an op outside the definition is outside it too
        if bare.endswith(suffix):
            forward = bare[: -len(suffix)]
            if _name_reason(forward) is not None or _tag_reason(getattr(aten, forward, None)) is not None:
                return "backward of a not-counted op"
    return None


def _tag_reason(func: Any) -> str | None:
    """From aten's tags and schema: element-wise, reduction, view, creation."""
    if func is None:
        return None
    if isinstance(func, torch._ops.OpOverloadPacket):
        overloads = func.overloads()
        if not overloads:
            return None
        func = getattr(func, overloads[0])
    tags = set(func.tags)
    # Tags are per overload and not always on all of them (aten.where.self is pointwise, where.ScalarSelf untagged).
    packet_tags = {t for name in func.overloadpacket.overloads() for t in getattr(func.overloadpacket, name).tags}
    if torch.Tag.pointwise in tags | packet_tags:
        return "element-wise"
    if torch.Tag.reduction in tags | packet_tags:
        return "reduction"
    if _is_view(func) or torch.Tag.inplace_view in tags or torch.Tag.view_copy in tags:
        return "view"
    if not any(isinstance(a.type, torch.TensorType) or "Tensor" in str(a.type) for a in func._schema.arguments):
        return "creation"
    return None


def _decomposes_element_wise(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Does torch's own decomposition of `func` consist of element-wise (and view, creation) ops only? Traced on
    meta tensors of the call's shapes, outside every mode. Reductions do not qualify: a dot product decomposes into a
    multiply and a sum (aten.mv)."""
    decomposition = decomposition_table.get(func)
    if decomposition is None:
        return False
    seen: list[Any] = []

    class _Record(TorchDispatchMode):
        def __torch_dispatch__(self, f, types, a=(), k=None):
            seen.append(f)
            return f(*a, **(k or {}))

    def meta(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
        return x

    try:
        with _disable_current_modes():
            margs, mkwargs = pytree.tree_map(meta, (args, kwargs))
            with _Record():
                decomposition(*margs, **mkwargs)
    except Exception:  # noqa: BLE001 - no meta run of the decomposition: we cannot tell
        return False
    return bool(seen) and all(_tag_reason(f) in ("element-wise", "view", "creation") for f in seen
                              if f not in METADATA_QUERIES)


_REASONS: dict[Any, str | None] = {}  # op overload -> why the definition leaves it out (None: it does not)


def not_counted_reason(func: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> str | None:
    """Why the FLOP definition leaves this op out (element-wise, reduction, view, creation, a family by name), or
    None where the op may do multiply-accumulate work: with no formula, it is an unsupported op. Decided once per op
    overload (what an op is does not depend on its shapes)."""
    if func in _REASONS:
        return _REASONS[func]
    reason = _tag_reason(func) or _name_reason(func.overloadpacket.__name__)
    if reason is None and _decomposes_element_wise(func, args, kwargs or {}):
        reason = "element-wise (by its decomposition)"
    _REASONS[func] = reason
    return reason


def op_name(func: Any) -> str:
    """`namespace::name` of an op overload, without the overload suffix."""
    packet = func.overloadpacket
    ns = packet.__module__.rsplit(".", 1)[-1] if hasattr(packet, "__module__") else "aten"
    ns = getattr(func, "namespace", ns)
    return f"{ns}::{packet.__name__}"


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _gathered_rows_bytes(table: torch.Tensor, index: torch.Tensor) -> int:
    """A lookup reads the rows it gathers, not the whole table."""
    row = table.numel() // max(table.shape[0], 1)
    return index.numel() * row * table.element_size()


# aten ops whose standalone speed is a component's FLOP/s ceiling (peaks.py). linear and matmul are composite
# (they reach the dispatcher as mm/addmm/bmm), listed for completeness.
RECORDED_OPS = frozenset(
    {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "convolution", "_convolution", "convolution_backward"}
)
# One recorded call: (op name, argument specs, keyword specs); enough to rebuild it in another process.
Signature = tuple[str, tuple[Any, ...], tuple[tuple[str, Any], ...]]


def spec(value: Any) -> Any:
    """A picklable description of one argument: tensors by layout, lists element-wise, the rest as is."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), tuple(value.stride()), str(value.dtype).replace("torch.", ""), str(value.device))
    if isinstance(value, (list, tuple)):
        return ("seq", type(value).__name__, tuple(spec(v) for v in value))
    if value is None or isinstance(value, (bool, int, float, str)):
        return ("value", value)
    if isinstance(value, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return ("value", value)
    raise TypeError(f"cannot describe an argument of type {type(value).__name__}")


# Ops whose first input is a table they only gather from: (op packet, position of the index tensor).
GATHER_OPS = {
    aten._embedding_bag: 1,
    aten._embedding_bag_forward_only: 1,
    aten.embedding: 1,
}


# Queries of a tensor's metadata that dispatch only for tensor subclasses (a fake tensor's `.device`): no work.
METADATA_QUERIES = frozenset({torch.ops.prim.device.default})


@dataclass
class Census:
    """What the counting pass saw."""

    bytes_moved: int = 0
    unsupported: set[str] = field(default_factory=set)
    not_counted: set[str] = field(default_factory=set)  # ops the FLOP definition leaves out (not_counted_reason)
    ops: dict[str, int] = field(default_factory=dict)  # op name -> calls
    value_dependent: bool = False  # an op whose work or output shape may depend on values (twins.py)
    matmul_calls: dict[Signature, int] = field(default_factory=dict)  # RECORDED_OPS calls -> how many
    undescribed: set[str] = field(default_factory=set)  # RECORDED_OPS calls whose arguments spec() cannot describe


class _CensusMode(TorchDispatchMode):
    """Counts bytes moved and ops without a FLOP formula, op by op."""

    def __init__(self, census: Census, formulas: set[Any]) -> None:
        super().__init__()
        self.census = census
        self.formulas = formulas

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in METADATA_QUERIES:  # a fake tensor's `.device` reaches the dispatcher; a real one's never does
            return func(*args, **kwargs)
        packet = func.overloadpacket
        if packet.__name__ in RECORDED_OPS:  # described before the call: an in-place op may change its inputs
            try:
                sig = (func.name(), tuple(spec(a) for a in args), tuple(sorted((k, spec(v)) for k, v in kwargs.items())))
                self.census.matmul_calls[sig] = self.census.matmul_calls.get(sig, 0) + 1
            except TypeError:
                self.census.undescribed.add(func.name())
        out = func(*args, **kwargs)
        name = op_name(func)
        self.census.ops[name] = self.census.ops.get(name, 0) + 1
        if not self.census.value_dependent and (value_dependent(func) or packet in VALUE_FORMULAS):
            self.census.value_dependent = True
        if packet not in self.formulas:
            if not_counted_reason(func, args, kwargs) is None:
                self.census.unsupported.add(name)
            else:
                self.census.not_counted.add(name)
        if _is_view(func):
            return out
        inputs = {id(t): t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        outputs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        if packet in GATHER_OPS and isinstance(args[0], torch.Tensor):
            table, index = args[0], args[GATHER_OPS[packet]]
            inputs.pop(id(table), None)
            self.census.bytes_moved += _gathered_rows_bytes(table, index)
        self.census.bytes_moved += sum(_tensor_bytes(t) for t in inputs.values())
        self.census.bytes_moved += sum(_tensor_bytes(t) for t in outputs)
        return out


@dataclass
class Counts:
    flops: int
    bytes_moved: int
    unsupported_ops: list[str]
    flops_by_op: dict[str, int]
    op_calls: dict[str, int]
    # Whether the pass met an op whose work may depend on tensor values: such counts are never reused
    # for an identical component (twins.py).
    value_dependent: bool = False
    # The matmul and convolution calls the pass made (all calls of the batch counted, not per call) and
    # those it could not describe: what peaks.check_peaks times standalone when a row beats the peak,
    # without replaying the component again.
    matmul_calls: dict[Signature, int] = field(default_factory=dict)
    undescribed_matmuls: list[str] = field(default_factory=list)
    on_shapes: bool = False  # counted on fake tensors (count_on_shapes), not on a real run
    not_counted_ops: list[str] = field(default_factory=list)  # ops outside the FLOP definition (not_counted_reason)


def count(fn: Callable[[], Any]) -> tuple[Any, Counts]:
    """Run `fn` once under FLOP counting and the census; return its result and the counts."""
    census = Census()
    formulas = set(flop_registry) | set(EXTRA_FLOP_FORMULAS)
    counter = flop_counter()
    with counter, _CensusMode(census, formulas):
        result = fn()
    by_op = {str(k): int(v) for k, v in counter.get_flop_counts().get("Global", {}).items()}
    return result, Counts(
        flops=int(counter.get_total_flops()),
        bytes_moved=census.bytes_moved,
        unsupported_ops=sorted(census.unsupported),
        flops_by_op=by_op,
        op_calls=dict(sorted(census.ops.items())),
        value_dependent=census.value_dependent,
        matmul_calls=census.matmul_calls,
        undescribed_matmuls=sorted(census.undescribed),
        not_counted_ops=sorted(census.not_counted),
    )


def _module_state(modules: Iterable[nn.Module]) -> list[tuple[nn.Module, dict[str, Any], dict[str, Any], dict[str, Any]]]:
    return [(m, dict(vars(m)), dict(m._parameters), dict(m._buffers)) for m in modules]


def _restore(state: list[tuple[nn.Module, dict[str, Any], dict[str, Any], dict[str, Any]]]) -> None:
    """Put back what a pass on fake tensors set on a module (a cached tensor, a lazily made parameter): no fake
    tensor may outlive the pass."""
    for module, attrs, params, buffers in state:
        for now, before in ((vars(module), attrs), (module._parameters, params), (module._buffers, buffers)):
            for key in [k for k in now if k not in before]:
                del now[key]
            for key, value in before.items():
                if now.get(key, _MISSING) is not value:
                    now[key] = value


_MISSING = object()
# Ops whose shape rule returns auxiliary outputs of other sizes than their CPU kernel does, so bytes moved on fake
# tensors would differ (found by tests/test_twins.py: `_embedding_bag`'s bag sizes, 1 KiB per call of 128 bags).
SHAPE_RULE_DIFFERS = frozenset(f"aten::{name}" for name in (
    "_embedding_bag", "_embedding_bag_forward_only", "_embedding_bag_backward", "_embedding_bag_dense_backward",
    "_embedding_bag_sparse_backward", "_embedding_bag_per_sample_weights_backward"))


# Where torch logs what fails on fake or meta tensors: an ERROR with a traceback per op (a MoE model's `_grouped_mm`
# meta kernel takes bfloat16 only), although the pass just falls back to a real run.
FAKE_TENSOR_LOGGERS = ("torch._subclasses.fake_tensor", "torch._subclasses.fake_impls", "torch._subclasses.meta_utils")


class _Drop(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False


@contextlib.contextmanager
def quiet_fake_tensors() -> Iterator[None]:
    """Keep torch's fake-tensor failure logs off the terminal during cbsite's own fake passes (each failure is handled:
    a real count follows), unless cbsite's logger is at DEBUG (verbose)."""
    if logging.getLogger("cbsite").isEnabledFor(logging.DEBUG):
        yield
        return
    drop = _Drop()
    loggers = [logging.getLogger(name) for name in FAKE_TENSOR_LOGGERS]
    for logger in loggers:
        logger.addFilter(drop)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(drop)


def warm_up() -> None:
    """Make the counting passes' one-time set-up now: the first FlopCounterMode and FakeTensorMode of a process import
    torch._dynamo, seconds of work that the first component's counting pass paid otherwise (the whole model's). A
    collection calls this while it waits for its start calibration, which runs in the clean worker."""
    layer = nn.Linear(2, 2)
    count_on_shapes(lambda: None, lambda _: layer(torch.ones(1, 2)), layer.modules())


def count_on_shapes(prepare: Callable[[], Any], run: Callable[[Any], Any], modules: Iterable[nn.Module]) -> Counts | None:
    """`count(lambda: run(prepare()))` with every tensor fake (`FakeTensorMode`): the ops, shapes and strides of a
    real run without its arithmetic; `prepare` (building a backward graph, say) is not counted. None where the
    pass cannot stand for a real one: it raised (an op with no shape rule, a value-dependent output or branch), or
    it met an op whose work may depend on values (then only a real run says what it did). `modules`: whose Python
    state is put back afterwards."""
    state = _module_state(modules)
    try:
        with quiet_fake_tensors(), FakeTensorMode(allow_non_fake_inputs=True):
            prepared = prepare()
            counts = count(lambda: run(prepared))[1]
    except Exception:  # noqa: BLE001 - any failure on fake tensors means: count for real
        return None
    finally:
        _restore(state)
    if counts.value_dependent or SHAPE_RULE_DIFFERS & set(counts.op_calls):
        return None
    counts.on_shapes = True
    return counts
