"""Inputs replayed as they were when the module was called: state objects the model goes on changing (transformers'
DynamicCache and EncoderDecoderCache, the default with use_cache=True; a plain Python object) are snapshotted at the
call, and every replay runs on a copy of its own. A cache replayed by reference grew one sequence per replay."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from cbsite import archive  # noqa: E402  (after the importorskip above)
from cbsite.collector import CollectConfig, profile  # noqa: E402
from cbsite.collector.capture import capture, tensors_in  # noqa: E402

PROVIDER = textwrap.dedent("""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, T5Config, T5ForConditionalGeneration

    def gpt2(use_cache: bool = True):
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, use_cache=use_cache))
        return model, (torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1)),)

    def t5(use_cache: bool = True):
        torch.manual_seed(0)
        model = T5ForConditionalGeneration(T5Config(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                                    num_heads=4, use_cache=use_cache))
        g = torch.Generator().manual_seed(1)
        return model, (), {"input_ids": torch.randint(0, 128, (2, 12), generator=g),
                           "decoder_input_ids": torch.randint(0, 128, (2, 10), generator=g)}
""")

# Per-block and attention rows: what a cache replayed by reference got wrong.
KEY_ROWS = {
    "gpt2": ("transformer.h.0", "transformer.h.1", "transformer.h.0.attn", "transformer.h.1.attn"),
    "t5": ("decoder.block.0", "decoder.block.1", "decoder.block.0.layer.0.SelfAttention",
           "decoder.block.1.layer.0.SelfAttention", "decoder.block.0.layer.1.EncDecAttention",
           "decoder.block.1.layer.1.EncDecAttention"),
}


@pytest.fixture(scope="module")
def provider_module(tmp_path_factory):
    folder = tmp_path_factory.mktemp("provider")
    (folder / "tiny_cached_lms.py").write_text(PROVIDER)
    sys.path.insert(0, str(folder))
    sys.modules.pop("tiny_cached_lms", None)
    import tiny_cached_lms

    yield tiny_cached_lms
    sys.path.remove(str(folder))
    sys.modules.pop("tiny_cached_lms", None)


def _config() -> CollectConfig:
    return CollectConfig(min_run_time=0.005, warmup=1, calibrate=False, peak_flops=1e11, peak_bandwidth=1e10,
                         progress=False, step=False)


def _rows(run: archive.Run) -> dict[tuple[str, str], dict]:
    return {(r["path"], r["phase"]): r for r in run.table().to_dicts()}


def _api(provider_module, name: str, use_cache: bool) -> dict[tuple[str, str], dict]:
    built = getattr(provider_module, name)(use_cache=use_cache)
    model, args, kwargs = (*built, {})[:3]
    return _rows(profile(model, *args, config=_config(), model_name=name, **kwargs))


@pytest.fixture(scope="module")
def api_runs(provider_module):
    return {(name, cache): _api(provider_module, name, cache) for name in KEY_ROWS for cache in (True, False)}


def _assert_same_counts(cached: dict, plain: dict, name: str) -> None:
    assert not [k for k, r in cached.items() if r["status"] == "failed"], "no row fails with the cache on"
    for path in KEY_ROWS[name]:
        for phase in ("forward", "backward"):
            row, ref = cached[(path, phase)], plain[(path, phase)]
            assert row["status"] == ref["status"] == "measured", (path, phase, row["error"])
            assert row["flops"] == ref["flops"] > 0, (path, phase)
    # Every row measured both ways counts the same work: no replay ran on a cache grown by an earlier replay.
    both = [k for k in cached if k in plain and cached[k]["status"] == plain[k]["status"] == "measured"]
    assert len(both) > 20
    assert {k: cached[k]["flops"] for k in both} == {k: plain[k]["flops"] for k in both}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(KEY_ROWS))
def test_cache_on_counts_as_cache_off_through_the_api(api_runs, name):
    cached, plain = api_runs[(name, True)], api_runs[(name, False)]
    _assert_same_counts(cached, plain, name)
    attention = KEY_ROWS[name][-1]
    assert any("stateful inputs" in n and "Cache" in n for n in cached[(attention, "forward")]["notes"])
    assert not any("stateful" in n for n in plain[(attention, "forward")]["notes"])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(KEY_ROWS))
def test_cache_on_counts_as_cache_off_through_the_cli(api_runs, provider_module, tmp_path, monkeypatch, name):
    from cbsite.cli import main

    runs = tmp_path / "runs"
    assert main(["collect", f"tiny_cached_lms:{name}", "--runs", str(runs), "--budget", "0.005", "--no-step",
                 "--no-progress", "--peak-flops", "1e11", "--peak-bandwidth", "1e10", "--no-calibrate"]) == 0
    (ref,) = archive.list_runs(runs)
    _assert_same_counts(_rows(archive.read_run(ref.path)), api_runs[(name, False)], name)


def test_a_capture_snapshots_the_cache_as_of_the_call(provider_module):
    model, (ids,) = provider_module.gpt2(use_cache=True)
    cap = capture(model, (ids,), {}, grad=True, census=False, paths=["transformer.h.1", "transformer.h.1.attn"])
    (call,) = cap.calls["transformer.h.1"]
    assert call.stateful and call.state_error is None
    cache = next(x for x in call.args if isinstance(x, transformers.DynamicCache))
    # As block 1 found it: layer 0's keys and values (16 positions), nothing of layer 1 yet.
    assert cache.layers[0].keys.shape[-2] == 16
    assert len(cache.layers) < 2 or cache.layers[1].keys is None or cache.layers[1].keys.numel() == 0
    assert cache.layers[0].keys.grad_fn is None  # a detached copy, no graph of the capture forward
    assert cap.kept_bytes() >= sum(t.numel() * t.element_size() for t in (cache.layers[0].keys, cache.layers[0].values))
    before = [t.clone() for t in tensors_in(call.args)]
    for _ in range(3):  # each replay on a copy of its own: the snapshot never grows
        args, kwargs = call.replay_inputs(with_grad=True)
        replayed = next(x for x in args if isinstance(x, transformers.DynamicCache))
        assert replayed is not cache
        out = model.transformer.h[1](*args, **kwargs)
        assert replayed.layers[1].keys.shape[-2] == 16
    assert cache.layers[0].keys.shape[-2] == 16
    assert all(torch.equal(a, b) for a, b in zip(before, tensors_in(call.args)))
    del out


class KVStore:
    """A plain Python key/value cache, as a hand-written decoder keeps one: not a pytree, changed by every call."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []


class CachedAttention(nn.Module):
    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.k = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, store: KVStore) -> torch.Tensor:
        store.keys.append(self.k(x))
        keys = torch.cat(store.keys, dim=1)
        return torch.softmax(x @ keys.transpose(1, 2), dim=-1) @ keys


class Decoder(nn.Module):
    def __init__(self, store_type: type = KVStore) -> None:
        super().__init__()
        self.layers = nn.ModuleList([CachedAttention(), CachedAttention()])
        self.store_type = store_type

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        store = self.store_type()  # shared by the layers, changed by each
        for layer in self.layers:
            x = layer(x, store)
        return x


class Uncopyable(KVStore):
    def __deepcopy__(self, memo):
        raise TypeError("holds a handle that cannot be copied")


def test_plain_python_state_is_replayed_as_at_the_call():
    x = torch.randn(2, 8, 32)
    rows = _rows(profile(Decoder(), x, config=_config()))
    # Layer 1 found layer 0's keys in the store (8 positions) and added its own: 16 keys, every replay.
    batch, length, keys, dim = 2, 8, 16, 32
    attention = 2 * 2 * batch * length * keys * dim  # scores and weighted sum: two matmuls, 2 FLOPs per MAC
    projection = 2 * batch * length * dim * dim
    row = rows[("layers.1", "forward")]
    assert row["status"] == "measured"
    assert row["flops"] == projection + attention
    assert any("stateful inputs (KVStore)" in n for n in row["notes"])
    assert rows[("layers.0", "forward")]["flops"] == projection + attention // 2  # 8 keys: its own only
    assert rows[("layers.1", "backward")]["status"] == "measured"


def test_state_that_cannot_be_copied_is_never_measured_changed():
    x = torch.randn(2, 8, 32)
    rows = _rows(profile(Decoder(Uncopyable), x, config=_config()))
    for path in ("layers.0", "layers.1"):
        row = rows[(path, "forward")]
        # Each call appends to the store: a replay by reference would run on keys the model never had there. The
        # measurement fails with the reason, and the row is estimated from its children (design: Containers).
        assert row["status"] == "estimated" and row["error"]
        assert "cannot be copied" in row["error"] and "Uncopyable" in row["error"] and "changes it" in row["error"]
    assert rows[("layers.0.k", "forward")]["status"] == "measured"  # its children still are


class Reader(nn.Module):
    def forward(self, x: torch.Tensor, table: Uncopyable) -> torch.Tensor:
        return x @ table.keys[0]


class ReadsOnly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.reader = Reader()
        self.table = Uncopyable()
        self.table.keys.append(torch.randn(32, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reader(x, self.table)


def test_uncopyable_state_nothing_changes_is_replayed_by_reference_and_noted():
    rows = _rows(profile(ReadsOnly(), torch.randn(4, 32), config=_config()))
    row = rows[("reader", "forward")]
    assert row["status"] == "measured" and row["flops"] == 2 * 4 * 32 * 32
    assert any("replayed on the live object" in n and "cannot be copied" in n for n in row["notes"])


class Holder:
    """State that refers to a module of the model (a hook registry, a cache that knows its layer)."""

    def __init__(self, layer: nn.Module) -> None:
        self.layer = layer
        self.seen: list[torch.Tensor] = []


class UsesHolder(nn.Module):
    def forward(self, x: torch.Tensor, holder: Holder) -> torch.Tensor:
        holder.seen.append(x)
        return holder.layer(x)


class WithHolder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.user = UsesHolder()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.user(x, Holder(self.linear))


def test_a_state_copy_keeps_modules_and_parameters_by_reference():
    model = WithHolder()
    cap = capture(model, (torch.randn(2, 8),), {}, grad=True, census=False, paths=["user"])
    (call,) = cap.calls["user"]
    holder = call.args[1]
    assert holder.layer is model.linear and holder.seen == []
    params = {id(p) for p in model.parameters()}
    assert not any(id(t) in params for t in tensors_in((call.args, call.kwargs)))  # no weight is snapshotted
    args, _ = call.replay_inputs(with_grad=True)
    assert args[1] is not holder and args[1].layer is model.linear


class Settings:
    """An object a module only reads (a config): copied at the call, shared by the runs, since nothing changes it."""

    def __init__(self) -> None:
        self.weight = torch.randn(16, 16)


class ReadsSettings(nn.Module):
    def forward(self, x: torch.Tensor, settings: Settings) -> torch.Tensor:
        return x @ settings.weight


class WithSettings(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = ReadsSettings()
        self.settings = Settings()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x, self.settings)


def test_state_the_call_does_not_change_is_copied_once_and_said_so():
    model = WithSettings()
    cap = capture(model, (torch.randn(4, 16),), {}, grad=True, census=False, paths=["inner"])
    (call,) = cap.calls["inner"]
    assert call.stateful and call.state_changed is False and call.args[1] is not model.settings
    rows = _rows(profile(model, torch.randn(4, 16), config=_config()))
    row = rows[("inner", "forward")]
    assert row["status"] == "measured" and row["flops"] == 2 * 4 * 16 * 16
    assert any("inputs hold objects (Settings)" in n and "does not change" in n for n in row["notes"])
