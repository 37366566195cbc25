"""Model providers: every built-in builds a real model that runs on its inputs; options are validated."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from cbsite.collector.providers import PROVIDERS, Inputs, Provided, batch_seed, provide
from cbsite.collector.providers.dlrm import power_law_ids, power_law_lengths
from cbsite.errors import CbsiteError

BUILTINS = ["dlrm", "deepfm", "dlrm-synthetic", "nanogpt"]


def run(provided: Provided, batch: int = 0) -> torch.Tensor:
    inputs = provided.inputs[batch]
    return provided.model(*inputs.args, **inputs.kwargs)


def batch_of(inputs: Inputs) -> int:
    return inputs.args[0].shape[0]


# --- functions used as `module:function` providers -------------------------------------------------


def make_linear(in_features: int = 4, out_features: int = 3, batch: int = 5):
    """Returns (model, x): a bare tensor is the single positional argument."""
    return nn.Linear(in_features, out_features), torch.randn(batch, in_features)


class KwargsOnly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 2)

    def forward(self, *, x: torch.Tensor, scale: float) -> dict[str, torch.Tensor]:
        return {"y": self.proj(x) * scale}


def make_kwargs_model(batch: int = 2, scale: float = 2.0):
    """Returns (model, args, kwargs) for a forward that takes keyword arguments only."""
    return KwargsOnly(), (), {"x": torch.randn(batch, 4), "scale": scale}


def make_not_a_module():
    return "model", ()


# --- built-ins ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_builds_and_runs_forward_on_every_batch(name: str) -> None:
    provided = provide(name, {"size": "tiny"}, batches=2)
    assert provided.name == name and provided.description
    assert isinstance(provided.model, nn.Module)
    assert len(provided.inputs) == 2
    for i in range(2):
        out = run(provided, i)
        assert torch.isfinite(out).all()
        assert out.shape[0] == provided.options["batch_size"] == batch_of(provided.inputs[i])
    # Effective options carry the defaults of the chosen size and go into run.json as they are.
    assert provided.options["size"] == "tiny" and provided.options["seed"] == 0
    assert json.loads(json.dumps(provided.options)) == provided.options


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_batches_differ_and_seeds_reproduce(name: str) -> None:
    a = provide(name, {"size": "tiny"}, batches=2, seed=3)
    b = provide(name, {"size": "tiny"}, batches=1, seed=3)
    c = provide(name, {"size": "tiny", "seed": 4}, batches=1, seed=3)  # the option wins
    assert c.options["seed"] == 4

    def ids(p: Provided, i: int) -> torch.Tensor:
        last = p.inputs[i].args[-1]
        return last if isinstance(last, torch.Tensor) else last.values()

    first, second = ids(a, 0), ids(a, 1)
    assert first.shape != second.shape or not torch.equal(first, second)
    assert not torch.equal(a.inputs[0].args[0], a.inputs[1].args[0])
    assert torch.equal(ids(a, 0), ids(b, 0))
    torch.testing.assert_close(run(a), run(b))  # same seed: same weights, same batch
    weights_a = dict(a.model.named_parameters())
    assert any(not torch.equal(p, weights_a[n]) for n, p in c.model.named_parameters())


def test_builtins_leave_the_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    provide("dlrm", {"size": "tiny"})
    provide("nanogpt", {"size": "tiny"})
    torch.testing.assert_close(torch.rand(3), expected)


def test_batch_seeds_do_not_collide_across_seeds() -> None:
    seeds = {batch_seed(s, i) for s in range(20) for i in range(20)}
    assert len(seeds) == 400


def test_dlrm_ids_follow_a_power_law_and_stay_in_range() -> None:
    provided = provide("dlrm", {"size": "tiny", "batch_size": 256, "num_embeddings": [1000, 50, 7]})
    kjt = provided.inputs[0].args[1]
    for key, values, size in zip(kjt.keys(), kjt.values().split(kjt.length_per_key()), [1000, 50, 7]):
        assert values.min() >= 0 and values.max() < size, key
    # On many draws the head of the distribution dwarfs a uniform one, and the tail is long.
    g = torch.Generator().manual_seed(0)
    n = 1000
    ids = power_law_ids(50_000, n, 1.05, g)
    counts = torch.bincount(ids, minlength=n).sort(descending=True).values.double() / len(ids)
    assert ids.min() >= 0 and ids.max() < n
    assert counts[0] > 50 / n  # top id: > 50x its uniform share (about 0.12 for alpha 1.05)
    assert counts[:10].sum() > 0.3  # top 1% of ids take a third of the lookups
    assert (counts > 0).sum() > 500  # yet most ids are drawn at least once: a long tail
    # Ranks are scattered over the table as hashing does, not packed in its first rows.
    hot = torch.bincount(ids, minlength=n).topk(5).indices
    assert hot.max() > 10


def test_uniform_alpha_zero_is_flat() -> None:
    ids = power_law_ids(50_000, 100, 0.0, torch.Generator().manual_seed(0))
    counts = torch.bincount(ids, minlength=100).double() / len(ids)
    assert counts.max() < 2 / 100


def test_pooling_factors_are_heavy_tailed_around_the_mean() -> None:
    g = torch.Generator().manual_seed(0)
    lengths = power_law_lengths(20_000, 8, 1.05, g).double()
    assert lengths.min() >= 1
    assert 6 < lengths.mean() < 10
    assert lengths.max() > 3 * lengths.mean()  # a few long bags, as real traffic has
    assert (lengths == 1).double().mean() > 0.15  # and many short ones
    assert torch.equal(power_law_lengths(100, 1, 1.05, g), torch.ones(100, dtype=torch.int64))


def test_unreachable_mean_pooling_is_a_user_error() -> None:
    with pytest.raises(CbsiteError, match="lower alpha"):
        provide("dlrm", {"size": "tiny", "mean_pooling": 50, "alpha": 3.0})


def test_dlrm_demo_versions_change_embedding_dim_and_over_arch() -> None:
    base = provide("dlrm", {"size": "tiny"})
    wide = provide("dlrm", {"size": "tiny", "embedding_dim": 16, "over_arch_layer_sizes": [64, 32, 1]})
    table = "sparse_arch.embedding_bag_collection.embedding_bags.t_cat_0"
    assert base.model.get_submodule(table).embedding_dim == 8
    assert wide.model.get_submodule(table).embedding_dim == 16
    # The dense arch's last layer followed the embedding dim, as DLRM requires.
    assert wide.options["dense_arch_layer_sizes"][-1] == 16
    over = [m.out_features for m in wide.model.over_arch.modules() if isinstance(m, nn.Linear)]
    assert over == [64, 32, 1]
    assert run(wide).shape == (8, 1)


def test_deepfm_interaction_holds_deep_fm_and_fm() -> None:
    provided = provide("deepfm", {"size": "tiny", "num_tables": 4})
    children = dict(provided.model.inter_arch.named_children())
    assert {"deep_fm", "fm"} <= set(children)
    assert len(provided.inputs[0].args[1].keys()) == 4


def test_synthetic_shapes_follow_the_knobs() -> None:
    provided = provide(
        "dlrm-synthetic",
        {"size": "tiny", "dense_features": 100, "sparse_features": 6, "pooling_factors": [1, 1, 2, 2, 4, 4],
         "bottom_mlp": [24, 12], "top_mlp": [10, 1], "batch_size": 16},
    )
    dense, sparse = provided.inputs[0].args
    assert dense.shape == (16, 100)
    assert len(sparse.keys()) == 6 and sparse.stride() == 16
    assert sparse.length_per_key()[0] == 16  # pooling factor 1: one id per bag
    dense_layers = [m.out_features for m in provided.model.dense_arch.modules() if isinstance(m, nn.Linear)]
    assert dense_layers == [24, 12, 8]  # embedding_dim appended
    assert run(provided).shape == (16, 1)


def test_synthetic_refuses_points_outside_the_design_space() -> None:
    with pytest.raises(CbsiteError) as err:
        provide("dlrm-synthetic", {"size": "tiny", "dense_features": 32, "sparse_features": 200})
    assert "dense_features=32" in str(err.value) and "sparse_features=200" in str(err.value)
    assert "64 to 4096" in str(err.value) and "4 to 128" in str(err.value)


def test_nanogpt_shapes_and_tied_head() -> None:
    provided = provide("nanogpt", {"size": "tiny", "batch_size": 3, "seq_len": 10, "vocab_size": 50})
    model = provided.model
    (idx,) = provided.inputs[0].args
    assert idx.shape == (3, 10) and idx.dtype == torch.int64 and idx.max() < 50
    assert run(provided).shape == (3, 10, 50)
    assert model.lm_head.weight is model.wte.weight
    names = {n for n, _ in model.named_parameters()}
    assert "wte.weight" in names and "lm_head.weight" not in names  # a shared parameter counts once
    for path in ["wpe", "blocks.1.ln_1", "blocks.1.attn.c_attn", "blocks.1.attn.c_proj", "blocks.1.ln_2",
                 "blocks.1.mlp.c_fc", "blocks.1.mlp.gelu", "blocks.1.mlp.c_proj", "ln_f"]:
        model.get_submodule(path)
    assert isinstance(model.blocks, nn.ModuleList)


def test_nanogpt_attention_is_causal() -> None:
    provided = provide("nanogpt", {"size": "tiny"})
    (idx,) = provided.inputs[0].args
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % provided.options["vocab_size"]
    a, b = provided.model(idx), provided.model(changed)
    torch.testing.assert_close(a[:, :-1], b[:, :-1])  # the future does not leak into the past
    assert not torch.allclose(a[:, -1], b[:, -1])


# --- option errors --------------------------------------------------------------------------------


def test_bad_option_names_are_all_reported_at_once() -> None:
    with pytest.raises(CbsiteError) as err:
        provide("dlrm", {"size": "tiny", "bogus": 1, "hash_size": 2})
    message = str(err.value)
    assert "'bogus'" in message and "'hash_size'" in message
    assert "num_embeddings" in message and "over_arch_layer_sizes" in message  # the valid ones


def test_bad_option_values_are_all_reported_at_once() -> None:
    with pytest.raises(CbsiteError) as err:
        provide("dlrm", {"size": "tiny", "batch_size": 0, "alpha": -1, "dense_arch_layer_sizes": [4, 5]})
    message = str(err.value)
    assert "batch_size=0" in message and "alpha=-1" in message and "embedding_dim" in message
    with pytest.raises(CbsiteError, match="size='huge'"):
        provide("nanogpt", {"size": "huge"})
    with pytest.raises(CbsiteError, match="multiple of n_head"):
        provide("nanogpt", {"size": "tiny", "n_embd": 30, "n_head": 4})


def test_unknown_provider_lists_builtins_and_the_function_form() -> None:
    with pytest.raises(CbsiteError) as err:
        provide("dlrm2")
    for name in PROVIDERS:
        assert name in str(err.value)
    assert "module:function" in str(err.value)


# --- module:function ------------------------------------------------------------------------------


def test_function_provider_with_positional_input() -> None:
    provided = provide(f"{__name__}:make_linear", {"out_features": 7}, batches=3)
    assert provided.name == f"{__name__}:make_linear"
    assert provided.options == {"in_features": 4, "out_features": 7, "batch": 5}
    assert len(provided.inputs) == 3 and "repeated 3 times" in provided.description
    assert run(provided).shape == (5, 7)


def test_function_provider_with_kwargs_only_forward() -> None:
    provided = provide(f"{__name__}:make_kwargs_model", {"batch": 3})
    inputs = provided.inputs[0]
    assert inputs.args == () and set(inputs.kwargs) == {"x", "scale"}
    assert run(provided)["y"].shape == (3, 2)


def test_function_provider_errors_say_what_to_do() -> None:
    with pytest.raises(CbsiteError) as err:
        provide(f"{__name__}:make_linear", {"nope": 1, "nada": 2})
    assert "'nope'" in str(err.value) and "'nada'" in str(err.value) and "in_features" in str(err.value)
    with pytest.raises(CbsiteError, match="no function"):
        provide(f"{__name__}:missing")
    with pytest.raises(CbsiteError, match="PYTHONPATH"):
        provide("no_such_package_here.models:build")
    with pytest.raises(CbsiteError, match="nn.Module"):
        provide(f"{__name__}:make_not_a_module")
    with pytest.raises(CbsiteError, match="batches"):
        provide("nanogpt", {"size": "tiny"}, batches=0)
