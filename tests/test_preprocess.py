"""Preprocessing: hash shrinking, batch replication and input descriptions on real torchrec models."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from cbsite.collector.preprocess import describe_inputs, replicate_batch, shrink_hash_sizes
from cbsite.collector.providers import Inputs, Provided, provide
from cbsite.errors import CbsiteError

TABLES = "sparse_arch.embedding_bag_collection.embedding_bags"


def tiny_dlrm(**options) -> Provided:
    return provide("dlrm", {"size": "tiny", **options}, batches=2)


def per_key(kjt: KeyedJaggedTensor) -> dict[str, torch.Tensor]:
    return dict(zip(kjt.keys(), kjt.values().split(kjt.length_per_key())))


def kjt_of(inputs: Inputs) -> KeyedJaggedTensor:
    return inputs.args[1]


class SequenceModel(nn.Module):
    """An EmbeddingCollection model whose KJT arrives nested in a kwargs dict."""

    def __init__(self) -> None:
        super().__init__()
        self.tables = EmbeddingCollection(
            tables=[
                EmbeddingConfig(
                    name="item_table", embedding_dim=4, num_embeddings=1000, feature_names=["item", "clicked"]
                ),
                EmbeddingConfig(name="user_table", embedding_dim=4, num_embeddings=60, feature_names=["user"]),
            ]
        )
        self.head = nn.Linear(4, 1)

    def forward(self, *, batch: dict) -> torch.Tensor:
        embedded = self.tables(batch["features"][0])
        return self.head(torch.cat([jt.values() for jt in embedded.values()]))


def sequence_inputs() -> Inputs:
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["item", "clicked", "user"],
        values=torch.tensor([999, 500, 3, 998, 42, 7, 59, 30]),
        lengths=torch.tensor([2, 1, 2, 0, 1, 2], dtype=torch.int32),
    )
    return Inputs(kwargs={"batch": {"features": [kjt], "note": "kept"}})


# --- shrink_hash_sizes ----------------------------------------------------------------------------


def test_shrink_by_cap_keeps_structure_output_shape_and_ids_in_range() -> None:
    provided = tiny_dlrm(num_embeddings=[100, 40, 7])
    paths_before = [n for n, _ in provided.model.named_modules()]
    out_before = provided.model(*provided.inputs[0].args)
    model, inputs, record = shrink_hash_sizes(provided.model, provided.inputs, cap=20)

    assert [n for n, _ in model.named_modules()] == paths_before  # FQNs unchanged
    expected = {"t_cat_0": (100, 20), "t_cat_1": (40, 20), "t_cat_2": (7, 7)}
    for table, (before, after) in expected.items():
        bag = model.get_submodule(f"{TABLES}.{table}")
        assert bag.num_embeddings == after and bag.embedding_dim == 8
        assert record["changed"]["tables"][f"{TABLES}.{table}"] == {"before": before, "after": after}
    configs = model.sparse_arch.embedding_bag_collection.embedding_bag_configs()
    assert [c.feature_names for c in configs] == [["cat_0"], ["cat_1"], ["cat_2"]]
    assert record["name"] == "shrink_hash_sizes" and record["parameters"] == {"factor": None, "cap": 20}
    assert record["changed"]["remapped_inputs"] == ["args[1]"]
    for batch in inputs:
        for key, ids in per_key(kjt_of(batch)).items():
            assert ids.min() >= 0 and ids.max() < model.get_submodule(f"{TABLES}.t_{key}").num_embeddings
        out = model(*batch.args)
        assert out.shape == out_before.shape and torch.isfinite(out).all()
    json.dumps(record)


def test_shrink_keeps_lengths_dense_inputs_and_the_kept_rows() -> None:
    provided = tiny_dlrm(num_embeddings=100)
    old_weight = provided.model.get_submodule(f"{TABLES}.t_cat_0").weight.detach().clone()
    old_kjt = kjt_of(provided.inputs[0])
    model, inputs, _ = shrink_hash_sizes(provided.model, provided.inputs, cap=30)
    new_kjt = kjt_of(inputs[0])
    assert torch.equal(new_kjt.lengths(), old_kjt.lengths())
    assert torch.equal(inputs[0].args[0], provided.inputs[0].args[0])
    assert torch.equal(new_kjt.values(), old_kjt.values() % 30)
    torch.testing.assert_close(model.get_submodule(f"{TABLES}.t_cat_0").weight.detach(), old_weight[:30])
    assert model.get_submodule(f"{TABLES}.t_cat_0").weight.requires_grad


def test_shrink_by_factor_rounds_up() -> None:
    provided = tiny_dlrm(num_embeddings=[100, 37, 3])
    model, _, record = shrink_hash_sizes(provided.model, provided.inputs, factor=4)
    sizes = [model.get_submodule(f"{TABLES}.t_cat_{i}").num_embeddings for i in range(3)]
    assert sizes == [25, 10, 1]
    assert record["parameters"] == {"factor": 4, "cap": None}


def test_shrink_embedding_collection_with_nested_kwargs() -> None:
    model, batch = SequenceModel(), sequence_inputs()
    out_before = model(**batch.kwargs)
    model, (shrunk,), record = shrink_hash_sizes(model, [batch], cap=50)
    assert model.get_submodule("tables.embeddings.item_table").num_embeddings == 50
    assert model.get_submodule("tables.embeddings.user_table").num_embeddings == 50
    assert record["changed"]["tables"]["tables.embeddings.user_table"] == {"before": 60, "after": 50}
    assert record["changed"]["remapped_features"] == ["clicked", "item", "user"]
    assert record["changed"]["remapped_inputs"] == ["kwargs['batch']['features'][0]"]
    assert shrunk.kwargs["batch"]["note"] == "kept"
    ids = per_key(shrunk.kwargs["batch"]["features"][0])
    assert ids["item"].tolist() == [999 % 50, 500 % 50, 3]
    assert ids["user"].tolist() == [7, 59 % 50, 30] and ids["clicked"].tolist() == [998 % 50, 42]
    assert model(**shrunk.kwargs).shape == out_before.shape


def test_shrink_reaches_a_table_shared_by_two_parents() -> None:
    provided = tiny_dlrm()
    shared = provided.model.sparse_arch.embedding_bag_collection
    provided.model.alias = shared  # a second FQN for the same module object
    model, _, _ = shrink_hash_sizes(provided.model, provided.inputs, cap=10)
    assert model.alias is model.sparse_arch.embedding_bag_collection
    assert model.alias.embedding_bags["t_cat_0"].num_embeddings == 10


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "exactly one"),
        ({"factor": 2, "cap": 10}, "exactly one"),
        ({"factor": 0.5}, ">= 1"),
        ({"factor": float("nan")}, ">= 1"),
        ({"cap": 0}, "positive integer"),
        ({"cap": 2.5}, "positive integer"),
    ],
)
def test_shrink_refuses_bad_parameters(kwargs: dict, message: str) -> None:
    provided = tiny_dlrm()
    with pytest.raises(CbsiteError, match=message):
        shrink_hash_sizes(provided.model, provided.inputs, **kwargs)


def test_shrink_refuses_a_model_without_tables() -> None:
    provided = provide("nanogpt", {"size": "tiny"})
    with pytest.raises(CbsiteError, match="has none"):
        shrink_hash_sizes(provided.model, provided.inputs, cap=10)


# --- replicate_batch ------------------------------------------------------------------------------


def test_replication_to_a_multiple_keeps_the_exact_distribution() -> None:
    provided = tiny_dlrm(batch_size=8)
    inputs, record = replicate_batch(provided.inputs, 32)
    for before, after in zip(provided.inputs, inputs):
        dense, kjt = after.args
        assert dense.shape == (32, 13) and kjt.stride() == 32
        old = kjt_of(before)
        for key in old.keys():
            # Same pooling factors (mean per key) and the same normalised id histogram.
            assert kjt[key].lengths().double().mean() == old[key].lengths().double().mean()
            hist_old = torch.bincount(old[key].values(), minlength=100).double()
            hist_new = torch.bincount(kjt[key].values(), minlength=100).double()
            torch.testing.assert_close(hist_new / hist_new.sum(), hist_old / hist_old.sum())
        assert provided.model(*after.args).shape == (32, 1)
    assert record["changed"]["batch_size"] == {"before": 8, "after": 32}
    assert record["changed"]["replicated_inputs"] == ["args[0]", "args[1]"]
    assert record["changed"]["untouched_inputs"] == []
    json.dumps(record)


def test_replication_to_any_size_tiles_then_cuts() -> None:
    provided = tiny_dlrm(batch_size=8)
    (after,), _ = replicate_batch(provided.inputs[:1], 21)
    dense, kjt = after.args
    old_dense, old = provided.inputs[0].args
    assert dense.shape == (21, 13) and kjt.stride() == 21
    assert torch.equal(dense[16:], old_dense[:5])
    for key in old.keys():
        new_jt, old_jt = kjt[key], old[key]
        assert torch.equal(new_jt.lengths(), torch.cat([old_jt.lengths()] * 3)[:21])
        # Sample i of the copy has exactly the ids of sample i % 8 of the original.
        for i in (0, 7, 8, 20):
            assert new_jt.to_dense()[i].tolist() == old_jt.to_dense()[i % 8].tolist()
    assert provided.model(*after.args).shape == (21, 1)


def test_replication_keeps_weights_aligned_with_ids() -> None:
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "b"],
        values=torch.tensor([1, 2, 3, 4, 5]),
        weights=torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5]),
        lengths=torch.tensor([2, 1, 0, 2]),
    )
    (after,), _ = replicate_batch([Inputs(args=(kjt,))], 3)
    new = after.args[0]
    assert new["a"].lengths().tolist() == [2, 1, 2] and new["a"].values().tolist() == [1, 2, 3, 1, 2]
    assert new["a"].weights().tolist() == pytest.approx([0.1, 0.2, 0.3, 0.1, 0.2])
    assert new["b"].lengths().tolist() == [0, 2, 0] and new["b"].weights().tolist() == pytest.approx([0.4, 0.5])


def test_replication_leaves_non_batch_inputs_alone() -> None:
    x = torch.randn(4, 3, requires_grad=True)
    table = torch.randn(7, 2)
    scalar = torch.tensor(2.0)
    batch = Inputs(args=(x, table), kwargs={"extra": {"mask": torch.ones(4, 5), "scale": scalar, "n": 3}})
    (after,), record = replicate_batch([batch], 10)
    assert after.args[0].shape == (10, 3) and after.args[0].requires_grad and after.args[0].is_leaf
    assert after.args[1] is table and after.kwargs["extra"]["scale"] is scalar
    assert after.kwargs["extra"]["mask"].shape == (10, 5) and after.kwargs["extra"]["n"] == 3
    assert record["changed"]["replicated_inputs"] == ["args[0]", "kwargs['extra']['mask']"]
    assert record["changed"]["untouched_inputs"] == ["args[1]", "kwargs['extra']['scale']", "kwargs['extra']['n']"]


def test_replication_detects_the_most_common_batch_size_or_takes_it() -> None:
    a, b, lookup = torch.randn(3, 2), torch.randn(3, 5), torch.randn(6, 2)
    (after,), record = replicate_batch([Inputs(args=(lookup, a, b))], 9)
    assert record["changed"]["batch_size"]["before"] == 3
    assert after.args[0] is lookup and after.args[1].shape == (9, 2)
    (after,), _ = replicate_batch([Inputs(args=(lookup, a, b))], 12, batch_size=6)
    assert after.args[0].shape == (12, 2) and after.args[1] is a


def test_replication_of_nanogpt_tokens() -> None:
    provided = provide("nanogpt", {"size": "tiny"})
    (after,), _ = replicate_batch(provided.inputs, 5)
    assert provided.model(*after.args).shape == (5, 16, provided.options["vocab_size"])


def test_replication_refuses_a_smaller_target_or_no_batch() -> None:
    provided = tiny_dlrm(batch_size=8)
    with pytest.raises(CbsiteError, match="smaller than the captured batch"):
        replicate_batch(provided.inputs, 4)
    with pytest.raises(CbsiteError, match="positive integer"):
        replicate_batch(provided.inputs, 0)
    with pytest.raises(CbsiteError, match="no tensor"):
        replicate_batch([Inputs(args=(3, "x"))], 4)


def test_replication_to_the_same_size_changes_nothing() -> None:
    provided = tiny_dlrm(batch_size=8)
    inputs, record = replicate_batch(provided.inputs, 8)
    assert inputs[0] is provided.inputs[0]
    assert record["changed"]["batch_size"] == {"before": 8, "after": 8}


# --- describe_inputs ------------------------------------------------------------------------------


def test_describe_a_recsys_batch() -> None:
    provided = tiny_dlrm(batch_size=8)
    desc = describe_inputs(provided.inputs[0])
    assert json.loads(json.dumps(desc)) == desc
    dense, kjt = desc["args"]
    assert dense == {"type": "tensor", "shape": [8, 13], "dtype": "float32"}
    source = kjt_of(provided.inputs[0])
    assert kjt["type"] == "KeyedJaggedTensor" and kjt["keys"] == ["cat_0", "cat_1", "cat_2"]
    assert kjt["stride"] == 8 and kjt["values"] == source.values().numel() and not kjt["weighted"]
    assert kjt["mean_pooling"]["cat_0"] == pytest.approx(source.length_per_key()[0] / 8, abs=1e-4)
    assert desc["kwargs"] == {}


def test_describe_nested_inputs() -> None:
    desc = describe_inputs(sequence_inputs())
    assert json.loads(json.dumps(desc)) == desc
    batch = desc["kwargs"]["batch"]
    assert batch["type"] == "dict"
    (kjt,) = batch["items"]["features"]["items"]
    assert kjt["keys"] == ["item", "clicked", "user"] and kjt["mean_pooling"]["user"] == 1.5
    assert batch["items"]["note"] == {"type": "str", "value": "kept"}
    assert describe_inputs(Inputs(args=(object(),)))["args"][0] == {"type": "builtins.object"}
