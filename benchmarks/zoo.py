"""The zoo: models from libraries cbsite did not write, collected with cbsite and checked against counts and timers
that share nothing with it.

    .venv/bin/python -m benchmarks.zoo                    # every model, a Markdown table on stdout
    .venv/bin/python -m benchmarks.zoo gpt2 convnext      # some of them
    .venv/bin/python -m benchmarks.zoo --json zoo.json    # also every row's figures

Each model is built from a tiny config with random weights (transformers CNNs, decoders, an encoder-decoder, MoEs, a
state-space model at its defaults, cache on; torchrec DLRM variants and an EmbeddingBagCollection two-tower), collected
with `cbsite.profile`, and then, on the same module objects and the inputs each module got in one forward:

- **analytic FLOPs**: per op, from first principles (`Analytic`): 2*M*N*K for matmuls, convolution forward and each
  gradient term from the weight's size (any `groups`), attention's two products (and four in backward), `_grouped_mm`
  from its operands, one add per gathered embedding-bag element; ops outside that list count 0, as cbsite's
  definition has it;
- **FlopCounterMode** on the same module and inputs, forward and backward (`autograd.grad` on the module's outputs
  for its inputs that required grad in the model and its parameters, as cbsite's backward is defined);
- **leaf latency** by `torch.utils.benchmark.Timer` on the same inputs, thread count and grad mode.

The table has one row per model: root FLOPs by each count, how many rows agree, the latency ratio, and what became of
the peak (run peak over the calibrated matmul peak, the highest MFU, rows marked FLOPs suspect). docs/zoo.md explains
every difference.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.benchmark import Timer
from torch.utils.flop_counter import FlopCounterMode

# The zoo finds the tensors inside inputs (a cache's too) with the collector's own walker; it counts and times them
# independently.
from cbsite.collector.capture import tensors_in as tensors

Built = tuple[nn.Module, tuple[Any, ...], dict[str, Any]]
TIMER_REPEATS = 3

# ----- the models ----------------------------------------------------------------------------------------------


def _ids(batch: int, seq: int, vocab: int = 1000) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))


def _pixels(batch: int, size: int) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(0))


def convnext() -> Built:
    from transformers import ConvNextConfig, ConvNextModel

    config = ConvNextConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1], image_size=64)
    return ConvNextModel(config), (_pixels(2, 64),), {}


def mobilenet_v2() -> Built:
    from transformers import MobileNetV2Config, MobileNetV2Model

    return MobileNetV2Model(MobileNetV2Config(image_size=64, depth_multiplier=0.35)), (_pixels(2, 64),), {}


def efficientnet() -> Built:
    from transformers import EfficientNetConfig, EfficientNetModel

    config = EfficientNetConfig(image_size=64, width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320)
    return EfficientNetModel(config), (_pixels(2, 64),), {}


def efficientnet_wide() -> Built:
    """EfficientNet at full width (depthwise convolutions up to 1152 channels): large enough that a group-blind
    convolution backward count beats the matmul peak on a CPU (`--group-blind-conv-backward`)."""
    from transformers import EfficientNetConfig, EfficientNetModel

    config = EfficientNetConfig(image_size=64, width_coefficient=1.0, depth_coefficient=0.5, hidden_dim=1280)
    return EfficientNetModel(config), (_pixels(2, 64),), {}


def gpt2(use_cache: bool = True) -> Built:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=1000, n_positions=128, use_cache=use_cache,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config), (_ids(2, 32),), {}


def t5(use_cache: bool = True) -> Built:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(d_model=64, d_ff=128, d_kv=16, num_layers=2, num_decoder_layers=2, num_heads=4, vocab_size=1000,
                      decoder_start_token_id=0, pad_token_id=0, use_cache=use_cache)
    return T5ForConditionalGeneration(config), (_ids(2, 32),), {"decoder_input_ids": _ids(2, 16)}


def bert() -> Built:
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=1000)
    return BertModel(config), (_ids(2, 32),), {}


def mixtral() -> Built:
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, vocab_size=1000,
                           max_position_embeddings=128)
    return MixtralForCausalLM(config), (_ids(2, 32),), {}


def qwen2_moe() -> Built:
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    config = Qwen2MoeConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                            shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                            max_position_embeddings=128)
    return Qwen2MoeForCausalLM(config), (_ids(2, 32),), {}


def mamba() -> Built:
    from transformers import MambaConfig, MambaForCausalLM

    config = MambaConfig(hidden_size=64, state_size=8, num_hidden_layers=2, vocab_size=1000, intermediate_size=128)
    return MambaForCausalLM(config), (_ids(2, 32),), {}


def _tables(n: int, dim: int, rows: int = 1000) -> list[Any]:
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    return [EmbeddingBagConfig(name=f"t{i}", embedding_dim=dim, num_embeddings=rows, feature_names=[f"f{i}"])
            for i in range(n)]


def _kjt(features: list[str], batch: int, per_bag: int = 3, rows: int = 1000) -> Any:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, per_bag + 1, (len(features) * batch,), generator=g)
    values = torch.randint(0, rows, (int(lengths.sum()),), generator=g)
    return KeyedJaggedTensor.from_lengths_sync(keys=features, values=values, lengths=lengths)


def _dlrm(kind: str) -> Built:
    from torchrec.models.dlrm import DLRM_DCN, DLRM_Projection
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=_tables(4, 16), device=torch.device("cpu"))
    common = {"embedding_bag_collection": ebc, "dense_in_features": 8, "dense_arch_layer_sizes": [32, 16],
              "over_arch_layer_sizes": [32, 1]}
    if kind == "dcn":
        model = DLRM_DCN(**common, dcn_num_layers=2, dcn_low_rank_dim=8)
    else:
        model = DLRM_Projection(**common, interaction_branch1_layer_sizes=[32, 16 * 4],
                                interaction_branch2_layer_sizes=[32, 16 * 4])
    features = [f"f{i}" for i in range(4)]
    return model, (torch.randn(32, 8, generator=torch.Generator().manual_seed(0)), _kjt(features, 32)), {}


def dlrm_dcn() -> Built:
    return _dlrm("dcn")


def dlrm_projection() -> Built:
    return _dlrm("projection")


class TwoTower(nn.Module):
    """A retrieval two-tower from torchrec's modules: an EmbeddingBagCollection and an MLP per tower, scored by a dot
    product (torchrec's example, without its training loop)."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        from torchrec.modules.embedding_modules import EmbeddingBagCollection
        from torchrec.modules.mlp import MLP

        self.query_ebc = EmbeddingBagCollection(tables=_tables(2, dim), device=torch.device("cpu"))
        self.candidate_ebc = EmbeddingBagCollection(
            tables=[dataclasses.replace(t, name=f"c{i}", feature_names=[f"c{i}"]) for i, t in enumerate(_tables(2, dim))],
            device=torch.device("cpu"))
        self.query_tower = MLP(2 * dim, [32, 16], device=torch.device("cpu"))
        self.candidate_tower = MLP(2 * dim, [32, 16], device=torch.device("cpu"))

    def forward(self, query: Any, candidate: Any) -> torch.Tensor:
        q = self.query_tower(self.query_ebc(query).values())
        c = self.candidate_tower(self.candidate_ebc(candidate).values())
        return (q * c).sum(dim=1)


def two_tower() -> Built:
    torch.manual_seed(0)
    return TwoTower(), (_kjt(["f0", "f1"], 32), _kjt(["c0", "c1"], 32)), {}


ZOO: dict[str, Callable[[], Built]] = {
    "convnext": convnext, "mobilenet_v2": mobilenet_v2, "efficientnet": efficientnet,
    # The decoders at their defaults (cache on), and without the cache: their rows must be the same.
    "gpt2": gpt2, "gpt2_nocache": lambda: gpt2(use_cache=False), "t5": t5, "t5_nocache": lambda: t5(use_cache=False),
    "bert": bert, "mixtral": mixtral, "qwen2_moe": qwen2_moe, "mamba": mamba, "dlrm_dcn": dlrm_dcn,
    "dlrm_projection": dlrm_projection, "two_tower": two_tower,
}
# Run only when named (minutes on two cores).
EXTRA: dict[str, Callable[[], Built]] = {"efficientnet_wide": efficientnet_wide}


def group_blind_conv_backward() -> None:
    """Count convolution backward with FlopCounterMode's own formula, whose weight-gradient term ignores `groups` (a
    depthwise backward counted up to 1000x too high): the miscount the peak check must not take for a faster device."""
    from torch.utils.flop_counter import flop_registry

    from cbsite.collector import counting

    counting.EXTRA_FLOP_FORMULAS[torch.ops.aten.convolution_backward] = (
        flop_registry[torch.ops.aten.convolution_backward].__wrapped__)  # on shapes, as a custom formula is called

# ----- analytic FLOPs, per op, from first principles --------------------------------------------------------------


def _numel(shape: Any) -> int:
    return math.prod(int(s) for s in shape)


def _mm(a: torch.Tensor, b: torch.Tensor) -> int:
    batch = _numel(a.shape[:-2])
    return 2 * batch * a.shape[-2] * a.shape[-1] * b.shape[-1]


def _conv_side(inp: torch.Tensor, weight: torch.Tensor, out_spatial: Any, transposed: bool) -> int:
    # Each output position (input position, transposed) multiplies the whole kernel of one group: weight.numel() MACs
    # per batch item and position, whatever `groups` is (the weight holds in/groups channels).
    spatial = inp.shape[2:] if transposed else out_spatial
    return 2 * inp.shape[0] * _numel(spatial) * weight.numel()


def _conv(args: tuple, kwargs: dict, out: Any) -> int:
    inp, weight, transposed = args[0], args[1], bool(args[6])
    return _conv_side(inp, weight, out.shape[2:], transposed)


def _conv_backward(args: tuple, kwargs: dict, out: Any) -> int:
    grad, inp, weight, transposed, mask = args[0], args[1], args[2], bool(args[7]), args[10]
    # grad input and grad weight each cost one forward; the bias gradient is a reduction (not counted).
    return _conv_side(inp, weight, grad.shape[2:], transposed) * (int(mask[0]) + int(mask[1]))


def _attention(args: tuple, kwargs: dict, out: Any) -> int:
    q, k, v = args[0], args[1], args[2]
    b, h, sq, d = q.shape
    sk, dv = k.shape[-2], v.shape[-1]
    return 2 * b * h * sq * sk * (d + dv)  # Q K^T and P V


def _attention_backward(args: tuple, kwargs: dict, out: Any) -> int:
    _, q, k, v = args[0], args[1], args[2], args[3]
    b, h, sq, d = q.shape
    sk, dv = k.shape[-2], v.shape[-1]
    return 2 * b * h * sq * sk * (2 * d + 2 * dv)  # dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q


def _grouped_mm(args: tuple, kwargs: dict, out: Any) -> int:
    # The groups partition one dimension of the operands, so their products add up to one product of the full sizes.
    a, b = args[0], args[1]
    if a.dim() == 2 and b.dim() == 3:  # tokens x K against an expert's K x N each: T K N
        return 2 * a.shape[0] * a.shape[1] * b.shape[2]
    if a.dim() == 2 and b.dim() == 2:  # M x T against T x N, T split by group (a weight gradient): M T N
        return 2 * a.shape[0] * a.shape[1] * b.shape[1]
    if a.dim() == 3 and b.dim() == 2:  # each group's M x K against its own columns of K x N: M K N
        return 2 * a.shape[1] * a.shape[2] * b.shape[1]
    return 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]  # batched


def _bag(args: tuple, kwargs: dict, out: Any) -> int:
    weight, indices = args[0], args[1]
    weights = kwargs.get("per_sample_weights", args[6] if len(args) > 6 else None)
    return indices.numel() * weight.shape[1] * (2 if weights is not None else 1)


def _bag_backward(args: tuple, kwargs: dict, out: Any) -> int:
    grad, indices = args[0], args[1]
    return indices.numel() * grad.shape[1]  # one add per gathered element, as forward


ANALYTIC: dict[str, Callable[[tuple, dict, Any], int]] = {
    "mm": lambda a, k, o: _mm(a[0], a[1]),
    "bmm": lambda a, k, o: _mm(a[0], a[1]),
    "addmm": lambda a, k, o: _mm(a[1], a[2]),
    "baddbmm": lambda a, k, o: _mm(a[1], a[2]),
    "convolution": _conv,
    "_convolution": _conv,
    "convolution_backward": _conv_backward,
    "_scaled_dot_product_flash_attention_for_cpu": _attention,
    "_scaled_dot_product_efficient_attention": _attention,
    "_scaled_dot_product_flash_attention": _attention,
    "_scaled_dot_product_flash_attention_for_cpu_backward": _attention_backward,
    "_scaled_dot_product_efficient_attention_backward": _attention_backward,
    "_scaled_dot_product_flash_attention_backward": _attention_backward,
    "_grouped_mm": _grouped_mm,
    "_embedding_bag": _bag,
    "_embedding_bag_forward_only": _bag,
    "_embedding_bag_backward": _bag_backward,
    "_embedding_bag_dense_backward": _bag_backward,
    "_embedding_bag_sparse_backward": _bag_backward,
}


class Analytic(TorchDispatchMode):
    """FLOPs of the ops in ANALYTIC, by their shapes; every other op counts 0 (cbsite's definition)."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0
        self.by_op: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        formula = ANALYTIC.get(name)
        if formula is not None:
            n = int(formula(args, kwargs, out[0] if isinstance(out, (tuple, list)) else out))
            self.total += n
            self.by_op[name] = self.by_op.get(name, 0) + n
        return out


# ----- every module's inputs, as they were when it was called -------------------------------------------------------




@dataclasses.dataclass
class Call:
    inputs: Any  # (args, kwargs), tensors detached copies
    wants_grad: dict[int, bool]  # id of a snapshot tensor -> whether the model's tensor required grad
    grad_enabled: bool

    def fresh(self, with_grad: bool) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """A copy of the snapshot of its own (tensors and the objects holding them), leaves requiring grad as they did."""
        memo: dict[int, Any] = {}
        for t in tensors(self.inputs):
            y = t.clone()
            if with_grad and self.wants_grad.get(id(t)) and (y.is_floating_point() or y.is_complex()):
                y.requires_grad_(True)
            memo[id(t)] = y
        return copy.deepcopy(self.inputs, memo)


def capture(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, list[Call]]:
    """Each module's calls in one forward of the model, their inputs snapshot at the pre-hook."""
    calls: dict[str, list[Call]] = {}
    handles = []
    for path, module in model.named_modules():
        def pre(mod: nn.Module, a: tuple, k: dict, path: str = path) -> None:
            originals = tensors((a, k))
            memo = {id(t): t.detach().clone() for t in originals}
            snapshot = copy.deepcopy((a, k), memo)
            wants = {id(memo[id(t)]): t.requires_grad for t in originals}
            calls.setdefault(path, []).append(Call(snapshot, wants, torch.is_grad_enabled()))

        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
    try:
        model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return calls


def _backward_graph(module: nn.Module, call: Call, seed: int = 0) -> tuple[list, list, list] | None:
    a, k = call.fresh(with_grad=True)
    with torch.enable_grad():
        out = module(*a, **k)
    roots = [t for t in tensors(out) if t.requires_grad and t.grad_fn is not None]
    wrt = [t for t in tensors((a, k)) if t.requires_grad] + [p for p in module.parameters() if p.requires_grad]
    if not roots or not wrt:
        return None
    g = torch.Generator().manual_seed(seed)
    grads = [torch.randn(r.shape, generator=g, dtype=r.dtype) for r in roots]
    return roots, grads, wrt


def reference_counts(module: nn.Module, calls: list[Call]) -> dict[str, dict[str, float]]:
    """FlopCounterMode's and the analytic FLOPs of one module on its calls, per call, forward and backward."""
    out: dict[str, dict[str, float]] = {}
    fwd_f = fwd_a = 0
    for call in calls:
        a, k = call.fresh(with_grad=call.grad_enabled)
        with torch.set_grad_enabled(call.grad_enabled), FlopCounterMode(display=False) as fcm, Analytic() as an:
            module(*a, **k)
        fwd_f += fcm.get_total_flops()
        fwd_a += an.total
    out["forward"] = {"fcm": fwd_f / len(calls), "analytic": fwd_a / len(calls)}
    live = [c for c in calls if c.grad_enabled]
    if live:
        bwd_f = bwd_a = 0
        graphs = 0
        for call in live:
            graph = _backward_graph(module, call)
            if graph is None:
                continue
            graphs += 1
            roots, grads, wrt = graph
            with FlopCounterMode(display=False) as fcm, Analytic() as an:
                torch.autograd.grad(roots, wrt, grads, allow_unused=True)
            bwd_f += fcm.get_total_flops()
            bwd_a += an.total
        if graphs:
            out["backward"] = {"fcm": bwd_f / len(live), "analytic": bwd_a / len(live)}
    return out


def timer_latency(module: nn.Module, calls: list[Call], phase: str, num_threads: int, min_run_time: float) -> float | None:
    """Seconds per call by `torch.utils.benchmark.Timer` on the module's captured inputs (forward in the model's grad
    mode; backward `autograd.grad` on a graph built once, retained)."""
    if phase == "forward":
        prepared = [(call.fresh(with_grad=call.grad_enabled), call.grad_enabled) for call in calls]

        def run() -> None:
            for (a, k), grad in prepared:
                with torch.set_grad_enabled(grad):
                    module(*a, **k)
        n = len(prepared)
    else:
        graphs = [g for g in (_backward_graph(module, c, i) for i, c in enumerate(calls) if c.grad_enabled) if g]
        if not graphs:
            return None

        def run() -> None:
            for roots, grads, wrt in graphs:
                torch.autograd.grad(roots, wrt, grads, retain_graph=True, allow_unused=True)
        n = len(graphs)
    timer = Timer("run()", globals={"run": run}, num_threads=num_threads)
    # Best of TIMER_REPEATS medians: a block that shared the CPU with another process is left out, as cbsite leaves
    # contended blocks out of its medians.
    return min(timer.blocked_autorange(min_run_time=min_run_time).median for _ in range(TIMER_REPEATS)) / n


# ----- one model -------------------------------------------------------------------------------------------------


class _WholeCall(nn.Module):
    """The model called on its own inputs, for a counter that builds the inputs itself (ptflops)."""

    def __init__(self, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.model, self.args, self.kwargs = model, args, kwargs

    def forward(self, _unused: Any = None) -> Any:
        return self.model(*self.args, **self.kwargs)


def peer_forward_flops(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> float | None:
    """The whole model's forward FLOPs by a peer tool, ptflops (its aten backend: mm, addmm, bmm, matmul and
    convolution, counted as multiply-accumulates; 2 FLOPs each). None where ptflops is not installed or fails."""
    try:
        from ptflops import get_model_complexity_info
    except ImportError:
        return None
    try:
        with torch.no_grad():
            macs, _ = get_model_complexity_info(
                _WholeCall(model, args, kwargs), (1,), input_constructor=lambda _: {"_unused": None},
                as_strings=False, print_per_layer_stat=False, backend="aten")
    except Exception:  # noqa: BLE001 - a peer that cannot run the model is a "-" in the table, not a failed zoo
        return None
    return None if macs is None else 2.0 * float(macs)


def _agree(a: float | None, b: float | None, tol: float = 0.01) -> bool:
    if a is None or b is None:
        return False
    return abs(a - b) <= tol * max(abs(a), abs(b), 1.0)


def study(name: str, min_run_time: float = 0.05, leaves: int = 12, timer_s: float = 0.05,
          config_overrides: dict[str, Any] | None = None, built: Built | None = None) -> dict[str, Any]:
    """Collect one zoo model with cbsite and check it: every row's FLOPs against the analytic count and FlopCounterMode,
    the slowest `leaves` leaves' latency against a Timer, and the run's peak against its calibration. `built`: a model
    and its inputs to use instead of ZOO[name]'s (a smaller config, in tests)."""
    from cbsite.collector import CollectConfig, profile

    torch.manual_seed(0)
    model, args, kwargs = built if built is not None else {**ZOO, **EXTRA}[name]()
    model.eval()  # dropout off: every count and timing sees the same work
    config = CollectConfig(**{"min_run_time": min_run_time, "progress": False, "step": False, **(config_overrides or {})})
    started = time.perf_counter()
    run = profile(model, *args, model_name=name, config=config, **kwargs)
    collect_s = time.perf_counter() - started
    rows = run.table().to_dicts()
    num_threads = int(run.meta["config"]["num_threads"])
    calls = capture(model, args, kwargs)
    modules = dict(model.named_modules())
    torch.set_num_threads(num_threads)

    compared: list[dict[str, Any]] = []
    refs: dict[str, dict[str, dict[str, float]]] = {}
    for row in rows:
        path, phase = row["path"], row["phase"]
        if path not in calls:
            continue
        if path not in refs:
            try:
                refs[path] = reference_counts(modules[path], calls[path])
            except Exception as exc:  # noqa: BLE001 - a module the zoo cannot replay alone is reported, not fatal
                refs[path] = {"error": {"message": f"{type(exc).__name__}: {exc}"[:200]}}  # type: ignore[dict-item]
        ref = refs[path].get(phase)
        compared.append({"path": path, "phase": phase, "status": row["status"], "cbsite": row["flops"],
                         "analytic": ref["analytic"] if ref else None, "fcm": ref["fcm"] if ref else None,
                         "latency_ms": row["latency_ms"], "is_leaf": row["is_leaf"], "notes": row["notes"]})

    # Leaf latency: the slowest measured leaves (by cbsite's forward), forward and backward, against a Timer.
    by_fwd = sorted((r for r in rows if r["is_leaf"] and r["phase"] == "forward" and r["status"] == "measured"
                     and r["path"] in calls), key=lambda r: -(r["latency_ms"] or 0))[:leaves]
    latency: list[dict[str, Any]] = []
    lat = {(r["path"], r["phase"]): r for r in rows}
    for row in by_fwd:
        for phase in ("forward", "backward"):
            mine = lat.get((row["path"], phase))
            if mine is None or mine["status"] != "measured" or not mine["latency_ms"]:
                continue
            try:
                seconds = timer_latency(modules[row["path"]], calls[row["path"]], phase, num_threads, timer_s)
            except Exception:  # noqa: BLE001
                seconds = None
            if seconds:
                latency.append({"path": row["path"], "phase": phase, "cbsite_ms": mine["latency_ms"],
                                "timer_ms": seconds * 1e3, "ratio": mine["latency_ms"] / (seconds * 1e3)})

    peer = peer_forward_flops(model, args, kwargs)
    dev = run.meta["device"]
    cal = dev.get("calibration") or {}
    calibrated = max((cal.get(w) or {}).get("flops") or 0 for w in ("start", "end")) or None
    peak = next(iter(dev.get("peak_flops", {}).values()), None)
    mfus = [r["mfu"] for r in rows if r["mfu"] is not None]
    return {
        "model": name, "collect_s": round(collect_s, 1), "num_threads": num_threads,
        "statuses": {s: sum(1 for r in rows if r["status"] == s) for s in ("measured", "estimated", "failed", "skipped")},
        "rows": compared, "latency": latency, "ptflops_forward": peer,
        "peak": peak, "calibrated_peak": calibrated, "peak_source": (dev.get("peak_source") or {}).get("flops"),
        "max_mfu": max(mfus) if mfus else None,
        "suspect": [f"{r['path'] or '<root>'} ({r['phase']})" for r in rows
                    if any(n.startswith("FLOPs suspect") for n in r["notes"] or [])],
        "warnings": run.meta.get("warnings", []),
    }


# ----- the table ---------------------------------------------------------------------------------------------------


def _g(flops: float | None) -> str:
    return "-" if flops is None else f"{flops / 1e6:.4g}"


def summarise(result: dict[str, Any]) -> dict[str, str]:
    """One table row: what a reader checks first."""
    rows = result["rows"]
    root = {r["phase"]: r for r in rows if r["path"] == ""}
    out = {"model": result["model"]}
    for phase, tag in (("forward", "fwd"), ("backward", "bwd")):
        r = root.get(phase)
        out[f"root {tag} MFLOP cbsite / analytic / FCM"] = (
            "-" if r is None else f"{_g(r['cbsite'])} / {_g(r['analytic'])} / {_g(r['fcm'])}")
    fwd = root.get("forward")
    out["root fwd MFLOP ptflops (ratio to cbsite)"] = (
        "-" if fwd is None or result.get("ptflops_forward") is None or not fwd["cbsite"] else
        f"{_g(result['ptflops_forward'])} ({result['ptflops_forward'] / fwd['cbsite']:.3f})")
    both = [r for r in rows if r["cbsite"] is not None and r["analytic"] is not None and r["status"] == "measured"]
    out["rows = analytic"] = f"{sum(_agree(r['cbsite'], r['analytic']) for r in both)}/{len(both)}"
    out["rows = FCM"] = f"{sum(_agree(r['cbsite'], r['fcm']) for r in both)}/{len(both)}"
    off = [r for r in both if not _agree(r["cbsite"], r["analytic"])]
    if off:
        worst = max(off, key=lambda r: abs(math.log((r["cbsite"] + 1) / (r["analytic"] + 1))))
        out["worst cbsite/analytic"] = (f"{(worst['cbsite'] + 1) / (worst['analytic'] + 1):.3g}x "
                                        f"{worst['path'] or '<root>'} ({worst['phase'][:3]})")
    else:
        out["worst cbsite/analytic"] = "-"
    ratios = [x["ratio"] for x in result["latency"]]
    out["leaf latency cbsite/Timer"] = (
        f"{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}] n={len(ratios)}" if ratios else "-")
    p, c = result["peak"], result["calibrated_peak"]
    out["peak / calibrated"] = f"{p / c:.2f}" if p and c else "-"
    out["max MFU"] = f"{result['max_mfu']:.2f}" if result["max_mfu"] is not None else "-"
    out["FLOPs suspect"] = str(len(result["suspect"]))
    s = result["statuses"]
    out["failed/estimated"] = f"{s['failed']}/{s['estimated']}"
    return out


def markdown(results: list[dict[str, Any]]) -> str:
    lines = [summarise(r) for r in results]
    if not lines:
        return ""
    keys = list(lines[0])
    text = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    text += ["| " + " | ".join(line.get(k, "-") for k in keys) + " |" for line in lines]
    return "\n".join(text)


def differences(result: dict[str, Any], limit: int = 12) -> list[str]:
    """Rows where cbsite and the analytic count differ, largest first (for the docs' explanations)."""
    off = [r for r in result["rows"] if r["cbsite"] is not None and r["analytic"] is not None
           and r["status"] == "measured" and not _agree(r["cbsite"], r["analytic"])]
    off.sort(key=lambda r: -abs(math.log((r["cbsite"] + 1) / (r["analytic"] + 1))))
    return [f"{result['model']}: {r['path'] or '<root>'} ({r['phase']}): cbsite {_g(r['cbsite'])}, analytic "
            f"{_g(r['analytic'])}, FCM {_g(r['fcm'])} MFLOP" for r in off[:limit]]


def cache_pairs(results: list[dict[str, Any]]) -> list[str]:
    """A decoder with its cache on against the same model without it (`<name>` and `<name>_nocache`): rows whose FLOPs
    are equal, and the latency ratio of the attention rows (cache on over off)."""
    by_name = {r["model"]: r for r in results}
    out = []
    for name, on in by_name.items():
        off = by_name.get(f"{name}_nocache")
        if off is None:
            continue
        theirs = {(r["path"], r["phase"]): r for r in off["rows"]}
        pairs = [(r, theirs[(r["path"], r["phase"])]) for r in on["rows"] if (r["path"], r["phase"]) in theirs
                 and r["cbsite"] is not None and theirs[(r["path"], r["phase"])]["cbsite"] is not None]
        same = sum(a["cbsite"] == b["cbsite"] for a, b in pairs)
        attn = [a["latency_ms"] / b["latency_ms"] for a, b in pairs
                if a["path"].rsplit(".", 1)[-1] in ATTENTION_NAMES and a["latency_ms"] and b["latency_ms"]]
        ratio = (f"; attention rows' latency cache on / off: median {statistics.median(attn):.2f} "
                 f"[{min(attn):.2f}-{max(attn):.2f}] n={len(attn)}" if attn else "")
        out.append(f"{name} cache on vs off: {same}/{len(pairs)} rows with equal FLOPs{ratio}")
    return out


ATTENTION_NAMES = {"attn", "self_attn", "SelfAttention", "EncDecAttention", "attention"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", help=f"some of: {', '.join(ZOO)} (default: all), or {', '.join(EXTRA)}")
    parser.add_argument("--min-run-time", type=float, default=0.05, help="cbsite's timing budget per component")
    parser.add_argument("--leaves", type=int, default=12, help="slowest leaves timed against a Timer, per model")
    parser.add_argument("--json", help="write every row's figures here")
    parser.add_argument("--group-blind-conv-backward", action="store_true",
                        help="count convolution backward as FlopCounterMode does (ignoring groups): checks that the "
                             "peak check marks the rows FLOPs suspect and keeps the calibrated peak")
    ns = parser.parse_args(argv)
    names = ns.models or list(ZOO)
    unknown = [n for n in names if n not in ZOO and n not in EXTRA]
    if unknown:
        parser.error(f"unknown model(s) {unknown}: choose from {list(ZOO) + list(EXTRA)}")
    if ns.group_blind_conv_backward:
        group_blind_conv_backward()
    print(f"# zoo on {os.cpu_count()} CPU(s), load {os.getloadavg()[0]:.2f}, torch {torch.__version__}", flush=True)
    results = []
    for name in names:
        t0 = time.perf_counter()
        try:
            results.append(study(name, ns.min_run_time, ns.leaves))
        except Exception as exc:  # noqa: BLE001 - one model's failure is reported, the others go on
            print(f"{name}: FAILED {type(exc).__name__}: {exc}"[:500], flush=True)
            continue
        print(f"{name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    print(f"# load after {os.getloadavg()[0]:.2f}\n")
    print(markdown(results))
    print()
    for line in cache_pairs(results):
        print("-", line)
    for r in results:
        for line in differences(r):
            print("-", line)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
