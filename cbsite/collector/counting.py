"""Count what a component does, outside any timed region: FLOPs, bytes moved, and the ops we have no
FLOP formula for.

Definitions (experts check these):
- FLOPs are `torch.utils.flop_counter.FlopCounterMode` counts (matmul, conv, attention: 2 per
  multiply-accumulate) plus formulas added here for ops it counts as 0 on CPU: CPU flash attention
  and embedding-bag pooling (one add per gathered element, two with per-sample weights).
- Element-wise, normalisation, reduction and data-movement ops are *not* FLOP-counted by definition
  (they are bandwidth-bound; see bytes moved). Any other op without a formula is listed in
  `unsupported_ops`, never silently counted as zero.
- Bytes moved is a roofline estimate: for every aten op, the bytes of its distinct input tensors plus
  its output tensors (numel x itemsize). View ops move nothing.
- Work set by shapes alone is counted on shapes (`count_on_shapes`): the same pass on fake tensors, which carry
  shapes, strides and dtypes but do no arithmetic (GPT-2 small at 8 x 512: 49 s of real counting, 1.3 s now). Where
  that pass cannot stand for a real one (an op without a shape rule, a value-dependent output or control flow, or
  any op whose work may depend on values: twins.value_dependent) the component is counted for real. A test
  checks both ways give the same counts.
- Peak memory is not counted here: a dispatch mode changes autograd's in-place choices, so it is
  measured from the allocator instead (cpu_memory.py, measure.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from cbsite.collector.twins import value_dependent

aten = torch.ops.aten


def _embedding_bag_flop(weight, indices, offsets, *args, per_sample_weights=None, out_shape=None, **kwargs) -> int:
    # Positional per_sample_weights is the 7th argument of aten._embedding_bag.
    weighted = per_sample_weights is not None or (len(args) >= 4 and args[3] is not None)
    return indices[0] * weight[1] * (2 if weighted else 1)


def _embedding_bag_backward_flop(grad, indices, *args, out_shape=None, **kwargs) -> int:
    # Scatter-add of one gathered row per index into the gradient table.
    return indices[0] * grad[1]


def _sdpa_cpu_flop(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _sdpa_cpu_backward_flop(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


EXTRA_FLOP_FORMULAS: dict[Any, Callable[..., int]] = {
    aten._embedding_bag: _embedding_bag_flop,
    aten._embedding_bag_forward_only: _embedding_bag_flop,
    aten._embedding_bag_dense_backward: _embedding_bag_backward_flop,
    aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu_flop,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_cpu_backward_flop,
}

# Ops that do no multiply-accumulate work by definition (see module docstring). Pointwise ops are
# recognised by their aten tag, views by their schema; this list covers the rest we have met.
NON_FLOP_OPS = {
    # reductions and normalisations
    "sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "prod", "var", "std", "var_mean",
    "norm", "linalg_vector_norm", "cumsum", "_softmax", "_log_softmax", "_softmax_backward_data",
    "_log_softmax_backward_data", "native_layer_norm", "native_layer_norm_backward", "native_batch_norm",
    "native_batch_norm_backward", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
    "native_group_norm", "native_group_norm_backward", "_fused_rms_norm", "_fused_rms_norm_backward",
    "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward", "topk", "sort",
    # data movement, creation, indexing
    "clone", "copy_", "_to_copy", "contiguous", "cat", "stack", "split_with_sizes", "index_select",
    "gather", "scatter", "scatter_add", "scatter_add_", "index", "index_put", "index_put_",
    "_index_put_impl_", "index_add", "index_add_", "embedding", "embedding_dense_backward",
    "masked_fill", "masked_fill_", "where", "empty", "empty_like", "empty_strided", "zeros", "zeros_like",
    "ones", "ones_like", "full", "full_like", "fill_", "zero_", "new_empty", "new_empty_strided",
    "new_zeros", "new_ones", "new_full", "arange", "repeat", "repeat_interleave", "tril", "triu",
    "constant_pad_nd", "flip", "roll", "bernoulli_", "native_dropout", "native_dropout_backward",
    "lift_fresh", "detach", "set_", "resize_", "_local_scalar_dense", "item", "nonzero", "bincount",
    "searchsorted", "_unique2", "unique_dim", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
    "one_hot", "unbind", "split", "chunk", "tensor_split", "narrow", "slice_scatter", "select_scatter",
    "index_fill", "index_fill_", "masked_select", "masked_scatter", "_embedding_bag_backward",
    "_pin_memory", "is_pinned", "as_strided_scatter", "_unsafe_view", "slice_backward", "select_backward",
    "index_select_backward", "unfold_backward", "expand_backward", "diagonal_backward",
    # fbgemm / torchrec jagged-data plumbing
    "permute_2D_sparse_data", "permute_1D_sparse_data", "asynchronous_complete_cumsum",
    "asynchronous_exclusive_cumsum", "asynchronous_inclusive_cumsum", "offsets_range",
    "segment_sum_csr", "jagged_to_padded_dense", "dense_to_jagged", "expand_into_jagged_permute",
    "bounds_check_indices", "block_bucketize_sparse_features", "permute_pooled_embs_auto_grad",
    "permute_pooled_embs", "permute_multi_embedding", "regroup_keyed_tensor", "split_embedding_codegen_lookup_sgd_function",
}


def _is_view(func: Any) -> bool:
    return bool(getattr(func, "is_view", False)) or any(
        r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns
    )


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

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
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
        if not self.census.value_dependent and value_dependent(func):
            self.census.value_dependent = True
        if not (
            packet in self.formulas
            or torch.Tag.pointwise in func.tags
            or _is_view(func)
            or packet.__name__.rstrip("_") in NON_FLOP_OPS
            or packet.__name__ in NON_FLOP_OPS
        ):
            self.census.unsupported.add(name)
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


def count(fn: Callable[[], Any]) -> tuple[Any, Counts]:
    """Run `fn` once under FLOP counting and the census; return its result and the counts."""
    census = Census()
    formulas = set(flop_registry) | set(EXTRA_FLOP_FORMULAS)
    counter = FlopCounterMode(display=False, custom_mapping=dict(EXTRA_FLOP_FORMULAS))
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
        with FakeTensorMode(allow_non_fake_inputs=True):
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
