"""The zoo on tiny configs: models cbsite did not write, checked against first-principles FLOP counts, and the run's
peak against its own calibration (benchmarks/zoo.py is the full version; docs/zoo.md its table).

What these hold: a depthwise CNN's backward is about twice its forward (grouped convolution counted right, both
gradient terms), its run keeps the calibrated peak (a miscount never raises it) with no MFU above 1; every row of it
equals the analytic count; an MoE's forward counts its experts (`_grouped_mm`).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from benchmarks import zoo

pytest.importorskip("transformers")  # the dev extra's: the models come from a library cbsite did not write


def tiny_convnext() -> zoo.Built:
    from transformers import ConvNextConfig, ConvNextModel

    torch.manual_seed(0)
    config = ConvNextConfig(hidden_sizes=[8, 16, 32, 32], depths=[1, 1, 1, 1], image_size=32)
    return ConvNextModel(config), (zoo._pixels(1, 32),), {}


def tiny_mixtral() -> zoo.Built:
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    config = MixtralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2, vocab_size=100,
                           max_position_embeddings=64)
    return MixtralForCausalLM(config), (zoo._ids(1, 16, vocab=100),), {}


FAST = {"min_run_time": 0.005, "warmup": 1}


@pytest.fixture(scope="module")
def depthwise_cnn() -> dict:
    """A tiny ConvNeXt (7x7 depthwise convolutions) collected with a real calibration, and checked by the zoo."""
    return zoo.study("convnext", leaves=0, config_overrides=FAST, built=tiny_convnext())


def root(result: dict, phase: str) -> dict:
    return next(r for r in result["rows"] if r["path"] == "" and r["phase"] == phase)


def test_a_depthwise_cnn_backward_is_about_twice_its_forward(depthwise_cnn):
    forward, backward = root(depthwise_cnn, "forward"), root(depthwise_cnn, "backward")
    assert forward["status"] == backward["status"] == "measured"
    assert 1.5 <= backward["cbsite"] / forward["cbsite"] <= 2.5, (forward["cbsite"], backward["cbsite"])
    # The analytic count (each gradient term one forward, whatever `groups`) is what cbsite reports at the root.
    assert backward["cbsite"] == pytest.approx(backward["analytic"], rel=0.01)
    assert forward["cbsite"] == pytest.approx(forward["analytic"], rel=0.01)


def test_a_depthwise_cnn_keeps_its_calibrated_peak_and_no_mfu_above_one(depthwise_cnn):
    peak, calibrated = depthwise_cnn["peak"], depthwise_cnn["calibrated_peak"]
    assert calibrated and abs(peak / calibrated - 1) <= 0.10, (peak, calibrated, depthwise_cnn["peak_source"])
    assert depthwise_cnn["max_mfu"] is not None and depthwise_cnn["max_mfu"] <= 1, depthwise_cnn["warnings"]
    assert depthwise_cnn["suspect"] == []


def test_every_row_of_a_depthwise_cnn_equals_the_analytic_count(depthwise_cnn):
    measured = [r for r in depthwise_cnn["rows"] if r["status"] == "measured" and r["analytic"] is not None]
    assert len(measured) > 20
    off = [(r["path"], r["phase"], r["cbsite"], r["analytic"]) for r in measured
           if r["cbsite"] != pytest.approx(r["analytic"], rel=0.01)]
    assert off == []


def test_a_peer_counter_agrees_on_a_depthwise_cnn_forward(depthwise_cnn):
    """ptflops (aten backend, multiply-accumulates x 2) counts the same convolutions and linears as cbsite's forward,
    plus one multiply-accumulate per output element of a layer with a bias (cbsite, like FlopCounterMode, counts the
    products only): the peer equals cbsite's root forward plus twice those bias outputs, exactly."""
    pytest.importorskip("ptflops")
    model, args, kwargs = tiny_convnext()
    biased: list[int] = []
    hooks = [m.register_forward_hook(lambda _m, _a, out: biased.append(out.numel()))
             for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)) and m.bias is not None]
    with torch.no_grad():
        model.eval()(*args, **kwargs)
    for hook in hooks:
        hook.remove()
    cbsite_forward = root(depthwise_cnn, "forward")["cbsite"]
    assert depthwise_cnn["ptflops_forward"] == cbsite_forward + 2 * sum(biased)


def test_the_analytic_count_of_grouped_convolution_and_linear():
    """The zoo's own reference, from first principles: each gradient term of a convolution costs one forward, with the
    kernel of one group per output position (weight.numel() multiply-accumulates per position)."""
    conv = nn.Conv2d(16, 16, 3, padding=1, groups=16)
    x = torch.randn(2, 16, 8, 8, requires_grad=True)
    forward = 2 * 2 * 8 * 8 * conv.weight.numel()  # 2 * N * H * W * (Cout * Cin/groups * kh * kw)
    with zoo.Analytic() as an:
        out = conv(x)
    assert an.total == forward
    with zoo.Analytic() as an:
        torch.autograd.grad(out, [x, conv.weight], torch.ones_like(out))
    assert an.total == 2 * forward  # grad input and grad weight
    lin = nn.Linear(8, 4)
    y = torch.randn(3, 8)  # no input gradient: the weight's alone
    out = lin(y)
    with zoo.Analytic() as an:
        torch.autograd.grad(out, [lin.weight], torch.ones_like(out))
    assert an.total == 2 * 3 * 8 * 4


def test_snapshots_give_each_replay_its_own_state():
    """The zoo replays a module on the inputs it had when called, tensors and the objects holding them."""

    class Box:
        def __init__(self, t: torch.Tensor) -> None:
            self.t = t

    class Appends(nn.Module):
        def forward(self, x: torch.Tensor, box: Box) -> torch.Tensor:
            box.t = torch.cat([box.t, x])
            return box.t.sum(0)

    model = Appends()
    box = Box(torch.zeros(1, 4))
    calls = zoo.capture(model, (torch.ones(2, 4), box), {})
    call = calls[""][0]
    assert box.t.shape == (3, 4)  # the model's object went on changing
    (x, state), _ = call.fresh(with_grad=False)
    assert state is not box and state.t.shape == (1, 4)
    model(x, state)
    assert call.fresh(with_grad=False)[0][1].t.shape == (1, 4)  # a replay never changes the snapshot


def test_an_moe_forward_counts_its_experts():
    """Mixtral runs its experts with `_grouped_mm`: cbsite's forward at the root is within 1 % of the analytic count
    (which has the grouped products), and the Python API completes."""
    result = zoo.study("mixtral", leaves=0, config_overrides={**FAST, "phases": ("forward",)}, built=tiny_mixtral())
    forward = root(result, "forward")
    assert forward["status"] == "measured"
    assert forward["cbsite"] == pytest.approx(forward["analytic"], rel=0.01), forward


def tiny_gpt2(use_cache: bool) -> zoo.Built:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=32, use_cache=use_cache,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config), (zoo._ids(1, 16, vocab=100),), {}


def test_a_decoder_with_its_cache_on_counts_what_it_does_without_it():
    """GPT-2 at its default (a DynamicCache every attention appends to): each row's FLOPs, forward and backward, equal
    those of the same model with `use_cache=False`; a replay on a cache grown by earlier replays would count more."""
    from cbsite.collector import CollectConfig, profile

    config = CollectConfig(**FAST, progress=False, step=False, calibrate=False, peak_flops=1e11, peak_bandwidth=1e10)
    flops = {}
    for use_cache in (True, False):
        model, args, kwargs = tiny_gpt2(use_cache)
        model.eval()
        run = profile(model, *args, config=config, **kwargs)
        flops[use_cache] = {(r["path"], r["phase"]): (r["status"], r["flops"]) for r in run.table().to_dicts()}
    assert flops[True].keys() == flops[False].keys()
    attention = [k for k in flops[True] if k[0].endswith(".attn")]
    assert len(attention) == 4 and all(flops[True][k][0] == "measured" for k in attention)
    assert {k: v for k, v in flops[True].items() if v != flops[False][k]} == {}
