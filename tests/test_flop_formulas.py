"""FLOP formulas checked against analytic counts: grouped and transposed convolution (forward and both gradients),
`_grouped_mm` from its offsets, embedding bags forward and backward, and which ops `unsupported_ops` lists."""

from __future__ import annotations

from math import prod

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from cbsite.collector.counting import count, count_on_shapes, not_counted_reason


def forward_and_backward(module: nn.Module, x: torch.Tensor, input_grad: bool = True) -> tuple[int, int, list[str]]:
    """FLOPs of one forward and of its backward (gradients of the input, where it needs one, and of the parameters),
    and the unsupported ops of both."""
    x = x.clone().requires_grad_(input_grad)
    _, fwd = count(lambda: module(x))
    y = module(x)
    wrt = ([x] if input_grad else []) + [p for p in module.parameters()]
    _, bwd = count(lambda: torch.autograd.grad(y, wrt, torch.ones_like(y)))
    return fwd.flops, bwd.flops, fwd.unsupported_ops + bwd.unsupported_ops


def conv_macs(conv: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """Multiply-accumulates of a direct convolution, from the layer's own attributes: each output point (each input
    point when transposed) of each sample meets kernel x C_in/groups weights per output channel."""
    kernel = prod(conv.kernel_size)
    if getattr(conv, "transposed", False):
        return x.shape[0] * prod(x.shape[2:]) * conv.in_channels * (conv.out_channels // conv.groups) * kernel
    return y.shape[0] * prod(y.shape[2:]) * conv.out_channels * (conv.in_channels // conv.groups) * kernel


CONVS = [
    ("conv1d groups 2", lambda: nn.Conv1d(4, 8, 3, groups=2), (2, 4, 17)),
    ("conv2d depthwise stride 2 pad 1", lambda: nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8), (2, 8, 9, 9)),
    ("conv2d dilation 2 groups 4", lambda: nn.Conv2d(8, 16, 3, dilation=2, padding=2, groups=4), (1, 8, 10, 12)),
    ("conv3d dense", lambda: nn.Conv3d(3, 4, 2, stride=(1, 2, 1)), (1, 3, 5, 6, 4)),
    ("conv_transpose2d groups 2 stride 2", lambda: nn.ConvTranspose2d(8, 4, 3, stride=2, groups=2), (2, 8, 5, 5)),
    ("conv_transpose1d depthwise", lambda: nn.ConvTranspose1d(6, 6, 4, stride=3, padding=1, groups=6), (2, 6, 7)),
    ("conv_transpose3d dilation", lambda: nn.ConvTranspose3d(2, 4, 2, dilation=2, output_padding=1, stride=2),
     (1, 2, 3, 3, 3)),
]


@pytest.mark.parametrize("name,make,shape", CONVS, ids=[c[0] for c in CONVS])
def test_convolution_forward_and_both_gradients_match_the_analytic_count(name, make, shape):
    torch.manual_seed(0)
    conv, x = make(), torch.randn(shape)
    macs = conv_macs(conv, x, conv(x))
    fwd, bwd, unsupported = forward_and_backward(conv, x)
    assert fwd == 2 * macs
    assert bwd == 2 * (2 * macs)  # input gradient + weight gradient, each the forward's work; bias gradient a reduction
    _, bwd_weights_only, _ = forward_and_backward(conv, x, input_grad=False)
    assert bwd_weights_only == 2 * macs  # a first layer computes no input gradient
    assert unsupported == []


def test_a_depthwise_convolution_backward_is_twice_its_forward_where_flop_counter_mode_says_65x():
    torch.manual_seed(0)
    conv, x = nn.Conv2d(64, 64, 3, padding=1, groups=64), torch.randn(8, 64, 32, 32)
    fwd, bwd, _ = forward_and_backward(conv, x)
    assert fwd == 2 * 8 * 32 * 32 * 64 * 9 == 9_437_184
    assert bwd / fwd == 2
    # FlopCounterMode's weight-gradient term convolves every input channel with every output channel (docs/flops.md).
    xg = x.clone().requires_grad_()
    y = conv(xg)
    with FlopCounterMode(display=False) as theirs:
        torch.autograd.grad(y, [xg, conv.weight, conv.bias], torch.ones_like(y))
    assert theirs.get_total_flops() == fwd + 64 * fwd


def test_convolution_counts_are_the_same_on_shapes():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(4, 8, 3, groups=4), nn.ReLU(), nn.ConvTranspose2d(8, 4, 2, stride=2, groups=2))
    x = torch.randn(2, 4, 8, 8)
    real = count(lambda: model(x))[1]
    fake = count_on_shapes(lambda: None, lambda _: model(x), model.modules())
    assert fake is not None and fake.on_shapes
    assert (fake.flops, fake.bytes_moved) == (real.flops, real.bytes_moved)


# ----- _grouped_mm ---------------------------------------------------------------------------------------------------


def grouped_counts(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None) -> tuple[int, int]:
    """FLOPs of `_grouped_mm(a, b, offs)` and of the gradients of both operands."""
    a, b = a.clone().requires_grad_(), b.clone().requires_grad_()
    _, fwd = count(lambda: torch._grouped_mm(a, b, offs=offs))
    out = torch._grouped_mm(a, b, offs=offs)
    _, bwd = count(lambda: torch.autograd.grad(out, [a, b], torch.randn_like(out)))
    assert fwd.unsupported_ops == bwd.unsupported_ops == []
    return fwd.flops, bwd.flops


def test_grouped_mm_counts_each_group_from_its_offsets_forward_and_backward():
    torch.manual_seed(0)
    # (M, K) x (G, K, N), rows split by offsets; rows past the last offset are skipped by the kernel.
    offs = torch.tensor([3, 3, 10], dtype=torch.int32)  # groups of 3, 0 and 7 rows; 2 rows unused
    fwd, bwd = grouped_counts(torch.randn(12, 8), torch.randn(3, 8, 4), offs)
    assert fwd == 2 * (3 + 0 + 7) * 8 * 4
    assert bwd == 2 * fwd  # the input gradient (grad x W^T per group) and the weight gradient (x^T grad per group)
    # (M, K) x (K, N) -> (G, M, N), the shared K split (as in a weight gradient).
    fwd, _ = grouped_counts(torch.randn(4, 12), torch.randn(12, 8), torch.tensor([4, 8, 12], dtype=torch.int32))
    assert fwd == 2 * 4 * 12 * 8
    # (G, M, K) x (K, N), the columns split.
    fwd, _ = grouped_counts(torch.randn(3, 4, 8), torch.randn(8, 12), torch.tensor([4, 8, 12], dtype=torch.int32))
    assert fwd == 2 * 4 * 8 * 12
    # (G, M, K) x (G, K, N): batched, no offsets.
    fwd, bwd = grouped_counts(torch.randn(3, 4, 8), torch.randn(3, 8, 4), None)
    assert fwd == 2 * 3 * 4 * 8 * 4 and bwd == 2 * fwd


def test_grouped_mm_is_counted_on_a_real_run_not_on_shapes():
    """Its work depends on the offsets' values, which fake tensors do not carry. In bfloat16 its meta kernel runs (in
    float32 it refuses), and the pass on shapes, which could only count every row, is not taken."""
    a, b = torch.randn(12, 8, dtype=torch.bfloat16), torch.randn(3, 8, 8, dtype=torch.bfloat16)
    offs = torch.tensor([3, 7, 10], dtype=torch.int32)
    real = count(lambda: torch._grouped_mm(a, b, offs=offs))[1]
    assert real.value_dependent and real.flops == 2 * 10 * 8 * 8
    assert count_on_shapes(lambda: None, lambda _: torch._grouped_mm(a, b, offs=offs), []) is None


# ----- embedding bags ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode,weighted", [("sum", False), ("mean", False), ("sum", True), ("max", False)])
def test_embedding_bag_backward_follows_the_forward_definition(mode, weighted):
    """Forward: one add per gathered element (scale and add with per-sample weights; max compares). Backward: the
    table gradient scatter-adds one row per index (under max, only each bag's maximum), and the per-sample weights'
    gradient is a dot product of the bag's gradient with each gathered row."""
    torch.manual_seed(0)
    n, dim, bags = 20, 6, 3
    bag = nn.EmbeddingBag(50, dim, mode=mode)
    indices, offsets = torch.randint(0, 50, (n,)), torch.tensor([0, 5, 12])
    psw = torch.rand(n, requires_grad=True) if weighted else None
    _, fwd = count(lambda: bag(indices, offsets, per_sample_weights=psw))
    out = bag(indices, offsets, per_sample_weights=psw)
    wrt = [bag.weight] + ([psw] if weighted else [])
    _, bwd = count(lambda: torch.autograd.grad(out, wrt, torch.randn_like(out)))
    assert fwd.flops == n * dim * (2 if weighted else 1)
    if mode == "max":
        assert bwd.flops == bags * dim
    elif weighted:
        assert bwd.flops == 2 * n * dim + 2 * n * dim  # table gradient (scale, add) + per-sample weights' dot products
    else:
        assert bwd.flops == n * dim
    assert fwd.unsupported_ops == bwd.unsupported_ops == []


def test_torchrec_embedding_bag_collection_counts_its_pooling_forward_and_backward():
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    torch.manual_seed(0)
    dims = (8, 4)
    ebc = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=d, num_embeddings=50, feature_names=[f"f{i}"])
        for i, d in enumerate(dims)])
    lengths = torch.tensor([1, 2, 3, 1, 0, 2])  # f0: 1+2+3 ids, f1: 1+0+2
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["f0", "f1"], values=torch.randint(0, 50, (9,)), lengths=lengths)
    expected = 6 * dims[0] + 3 * dims[1]
    _, fwd = count(lambda: ebc(kjt).values())
    out = ebc(kjt).values()
    _, bwd = count(lambda: torch.autograd.grad(out, list(ebc.parameters()), torch.randn_like(out)))
    assert fwd.flops == expected and bwd.flops == expected
    assert fwd.unsupported_ops == bwd.unsupported_ops == []


# ----- unsupported_ops ------------------------------------------------------------------------------------------------


class NotCounted(nn.Module):
    """Softmax, pooling, hardswish, softplus, histc, floor division, a scalar tensor: all outside the FLOP definition,
    beside a Linear that is counted."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.linear = nn.Linear(4 * 3 * 3, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.max_pool2d(nn.functional.hardswish(self.conv(x)), 2, return_indices=False)
        h = nn.functional.avg_pool2d(nn.functional.softplus(h), 1)
        y = torch.softmax(self.linear(h.flatten(1)), dim=-1)
        bins = torch.histc(y.detach(), bins=4)
        return y * torch.floor_divide(bins.sum(), 2) + torch.scalar_tensor(1.0)


def test_ops_outside_the_flop_definition_are_not_unsupported():
    torch.manual_seed(0)
    model, x = NotCounted(), torch.randn(2, 3, 8, 8)
    fwd, bwd, unsupported = forward_and_backward(model, x)
    assert unsupported == []
    _, counts = count(lambda: model(x))
    assert {"aten::_softmax", "aten::max_pool2d_with_indices", "aten::hardswish", "aten::histc",
            "aten::floor_divide", "aten::scalar_tensor"} <= set(counts.not_counted_ops)
    assert fwd == 2 * (2 * 6 * 6 * 4 * 3 * 9) + 2 * (2 * 36 * 5)


def test_an_op_with_multiply_accumulates_and_no_formula_stays_unsupported():
    a, v = torch.randn(4, 4), torch.randn(4)
    _, counts = count(lambda: (torch.mv(a, v), torch.dot(v, v), torch.cdist(a, a)))
    assert {"aten::mv", "aten::dot", "aten::_cdist_forward"} <= set(counts.unsupported_ops)


def test_the_definition_is_a_rule_not_a_list():
    """Tags, families and decompositions decide, so ops no one listed are classified too."""
    aten = torch.ops.aten
    x = torch.randn(3, 4)
    assert not_counted_reason(aten._safe_softmax.default) == "softmax"
    assert not_counted_reason(aten.max_pool3d_with_indices.default) == "pooling"
    assert not_counted_reason(aten.softplus_backward.default) is not None  # the backward of an element-wise op
    assert not_counted_reason(aten.as_strided_.default) == "view"
    assert not_counted_reason(aten.scalar_tensor.default) == "creation"
    assert not_counted_reason(aten.hardsigmoid_backward.default, (x, x)) is not None  # its decomposition is element-wise
    assert not_counted_reason(aten.mv.default, (x, torch.randn(4))) is None  # a multiply and a sum: a dot product


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, reduced: int) -> None:
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(channels, reduced, 1), nn.Conv2d(reduced, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = nn.functional.adaptive_avg_pool2d(x, 1)
        return x * torch.sigmoid(self.expand(nn.functional.silu(self.reduce(pooled))))


def inverted_residual(cin: int, cout: int, expand: int, stride: int) -> nn.Module:
    """A MobileNet/EfficientNet block: expand 1x1, depthwise 3x3, squeeze-excite, project 1x1."""
    mid = cin * expand
    return nn.Sequential(
        nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.Hardswish(),
        nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False), nn.BatchNorm2d(mid), nn.SiLU(),
        SqueezeExcite(mid, max(1, cin // 4)), nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))


def test_a_depthwise_cnn_backward_is_about_twice_its_forward():
    """Every layer's backward is its forward for the weight gradient plus its forward for the input gradient, except the
    first, whose input needs none: exactly 2 x forward less the stem's forward (FlopCounterMode: about 12x)."""
    torch.manual_seed(0)
    stem = nn.Conv2d(3, 16, 3, 2, 1)
    model = nn.Sequential(stem, nn.BatchNorm2d(16), nn.ReLU6(), inverted_residual(16, 24, 4, 2),
                          inverted_residual(24, 40, 6, 2), inverted_residual(40, 80, 6, 1), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Dropout(0.2), nn.Linear(80, 10)).eval()
    x = torch.randn(4, 3, 64, 64)
    fwd, bwd, unsupported = forward_and_backward(model, x, input_grad=False)
    stem_fwd = 2 * 4 * 32 * 32 * 16 * 3 * 9
    assert bwd == 2 * fwd - stem_fwd
    assert 1.5 <= bwd / fwd <= 2.5
    assert unsupported == []
