"""Mixture-of-experts models from transformers (experts run with `_grouped_mm`): their FLOPs equal an eager-experts
count, and a collection completes quietly, the interleaved re-measurement included."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from cbsite.collector import hierarchy
from cbsite.collector.counting import count

transformers = pytest.importorskip("transformers")

BATCH, SEQ, HEADS, HIDDEN, LAYERS = 2, 16, 4, 32, 2


def tiny(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    common = dict(vocab_size=128, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                  num_key_value_heads=2, num_experts_per_tok=2, max_position_embeddings=64)
    if kind == "mixtral":
        config = transformers.MixtralConfig(intermediate_size=64, num_local_experts=4, **common)
        return transformers.MixtralForCausalLM(config).eval()
    config = transformers.Qwen2MoeConfig(intermediate_size=64, moe_intermediate_size=16, shared_expert_intermediate_size=32,
                                         num_experts=4, **common)
    return transformers.Qwen2MoeForCausalLM(config).eval()


def ids() -> torch.Tensor:
    return torch.randint(0, 128, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))


def eager_reference(model: torch.nn.Module, input_ids: torch.Tensor) -> int:
    """FlopCounterMode on the same model with its experts run one by one (transformers' eager implementation: Linear
    layers on each expert's tokens), plus the attention cores it counts as 0 on CPU (2 matmuls of 2 x b*h*s*s*d)."""
    model.config._experts_implementation = "eager"
    try:
        with FlopCounterMode(display=False) as counter:
            model(input_ids, use_cache=False)
    finally:
        model.config._experts_implementation = "grouped_mm"
    head_dim = HIDDEN // HEADS
    attention = LAYERS * 2 * (2 * BATCH * HEADS * SEQ * SEQ * head_dim)
    return counter.get_total_flops() + attention


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_moe_forward_and_backward_flops_equal_an_eager_experts_count(kind):
    model, input_ids = tiny(kind), ids()
    assert model.config._experts_implementation == "grouped_mm"
    _, grouped = count(lambda: model(input_ids, use_cache=False))
    assert grouped.unsupported_ops == []
    assert "aten::_grouped_mm" in grouped.op_calls
    reference = eager_reference(model, input_ids)
    assert abs(grouped.flops - reference) <= 0.01 * reference

    def backward(implementation: str) -> int:
        model.config._experts_implementation = implementation
        logits = model(input_ids, use_cache=False).logits
        grads = torch.randn_like(logits)
        return count(lambda: torch.autograd.grad(logits, list(model.parameters()), grads, allow_unused=True))[1].flops

    try:
        assert backward("grouped_mm") == backward("eager")
    finally:
        model.config._experts_implementation = "grouped_mm"


@pytest.mark.slow
def test_profiling_a_tiny_mixtral_completes_quietly_with_its_flops(fast_config, monkeypatch, capfd):
    """Every parent/child pair re-measured (the stage that aborted on fake inputs through `_grouped_mm`'s meta kernel),
    no torch fake-tensor log on the terminal, and the root's forward FLOPs those of the eager count."""
    import cbsite

    monkeypatch.setattr(hierarchy, "inverted", lambda parent, child: True)
    model, input_ids = tiny("mixtral"), ids()
    reference = eager_reference(model, input_ids)
    run = cbsite.profile(model, input_ids, config=fast_config)
    err = capfd.readouterr().err
    assert "ERROR" not in err and "Traceback" not in err and "E1" not in err
    rows = {(r["path"], r["phase"]): r for r in run.table().to_dicts()}
    root = rows[("", "forward")]
    assert root["status"] == "measured" and root["flops"] == reference
    for layer in range(LAYERS):
        experts = rows[(f"model.layers.{layer}.mlp.experts", "forward")]
        assert experts["status"] == "measured" and experts["flops"] > 0 and experts["unsupported_ops"] == []
    assert run.meta["hierarchy"]["remeasured_pairs"] > 0


def test_a_pair_whose_re_measurement_fails_leaves_the_others_and_says_why():
    def row(path: str, parent: str | None, ms: float) -> dict[str, Any]:
        return {"path": path, "parent": parent, "phase": "forward", "status": "measured", "latency_ms": ms,
                "latency_p25_ms": ms, "latency_p75_ms": ms, "call_count": 1, "notes": []}

    rows = [row("", None, 0.01), row("a", "", 0.05), row("b", "", 0.05)]

    def statement(path: str, phase: str):
        if path == "a":
            raise RuntimeError("failed while attempting to run meta for aten._grouped_mm.default\nmore")
        return (lambda: None), 1

    samples, done = hierarchy.remeasure(rows, statement, 0.001, 1, "s", lambda path, phase: 0)
    assert done == 1 and {s["path"] for s in samples} == {"", "b"}
    failed = next(r for r in rows if r["path"] == "a")
    assert failed["status"] == "measured"
    assert failed["notes"] == [hierarchy.NOT_REMEASURED_NOTE
                               + "RuntimeError failed while attempting to run meta for aten._grouped_mm.default"]


def test_grad_outputs_drawn_for_a_graph_of_fake_tensors_never_reach_a_real_graph():
    """Counting backward on shapes draws grad_outputs for fake roots; a real graph of the same shapes and seed must get
    real ones (fake ones would run its backward through meta kernels, `_grouped_mm`'s among them)."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from cbsite.collector.timing.graphs import GradOutputs

    kept = GradOutputs(limit_bytes=1 << 20)
    with FakeTensorMode(allow_non_fake_inputs=True):
        fake_root = torch.randn(2, 3, requires_grad=True) * 2
        assert isinstance(kept.of([fake_root], 0)[0], FakeTensor)
    real = kept.of([torch.randn(2, 3, requires_grad=True) * 2], 0)
    assert not isinstance(real[0], FakeTensor)
    assert kept.of([torch.randn(2, 3)], 0) is real  # real ones are still kept
