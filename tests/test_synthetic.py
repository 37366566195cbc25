"""dlrm-synthetic's study knobs: shared tables, the interaction type, the lookup cap, the unique-id footprint."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from cbsite.collector.providers import provide
from cbsite.errors import CbsiteError

TINY = {"size": "tiny"}


def forward(provided, batch=0):
    inputs = provided.inputs[batch]
    return provided.model(*inputs.args, **inputs.kwargs)


def test_defaults_keep_one_table_per_feature_and_the_dot_interaction():
    provided = provide("dlrm-synthetic", TINY, batches=2)
    configs = provided.model.sparse_arch.embedding_bag_collection.embedding_bag_configs()
    assert [c.feature_names for c in configs] == [["cat_0"], ["cat_1"], ["cat_2"], ["cat_3"]]
    assert type(provided.model.inter_arch).__name__ == "InteractionArch"
    assert provided.options["interaction"] == "dot" and provided.options["num_tables"] is None
    assert forward(provided).shape == (8, 1)


def test_shared_tables_serve_several_features_round_robin():
    provided = provide("dlrm-synthetic", {**TINY, "sparse_features": 6, "num_tables": 2, "num_embeddings": [50, 7]})
    configs = provided.model.sparse_arch.embedding_bag_collection.embedding_bag_configs()
    assert [(c.name, c.num_embeddings, c.feature_names) for c in configs] == [
        ("t_0", 50, ["cat_0", "cat_2", "cat_4"]), ("t_1", 7, ["cat_1", "cat_3", "cat_5"])]
    sparse = provided.inputs[0].args[1].to_dict()
    assert all(int(sparse[f"cat_{j}"].values().max()) < (50 if j % 2 == 0 else 7) for j in range(6))
    assert forward(provided).shape == (8, 1)
    tables = provided.details["tables"]
    assert [t["features"] for t in tables] == [["cat_0", "cat_2", "cat_4"], ["cat_1", "cat_3", "cat_5"]]
    # One table's parameters for three features: fewer parameters than six tables of the same size.
    alone = provide("dlrm-synthetic", {**TINY, "sparse_features": 6, "num_embeddings": 50})
    params = lambda m: sum(p.numel() for p in m.sparse_arch.parameters())  # noqa: E731
    assert params(provided.model) == (50 + 7) * 8 < params(alone.model)


@pytest.mark.parametrize(
    ("interaction", "module", "over_in"),
    [("dot", "InteractionArch", 8 + 6 + 4), ("cat", "InteractionConcatArch", 5 * 8), ("dcn", "InteractionDCNArch", 5 * 8)],
)
def test_interaction_type_sets_the_arch_and_the_over_arch_input(interaction, module, over_in):
    provided = provide("dlrm-synthetic", {**TINY, "interaction": interaction, "dcn_layers": 3})
    model = provided.model
    assert type(model.inter_arch).__name__ == module
    first = next(m for m in model.over_arch.modules() if isinstance(m, nn.Linear))
    assert first.in_features == over_in  # dot: D + F(F-1)/2 + F; cat and dcn: (F + 1) x D
    out = forward(provided)
    assert out.shape == (8, 1) and torch.isfinite(out).all()
    if interaction == "dcn":
        assert len(model.inter_arch.crossnet.W_kernels) == 3 and model.inter_arch.crossnet.W_kernels[0].shape == (40, 4)
    if interaction == "cat":  # no crossing: the concatenation itself
        dense = model.dense_arch(provided.inputs[0].args[0])
        sparse = model.sparse_arch(provided.inputs[0].args[1])
        assert torch.equal(model.inter_arch(dense, sparse), torch.cat([dense, sparse.flatten(1)], dim=1))


def test_lookup_cap_cuts_every_bag():
    options = {**TINY, "pooling_factors": 20, "alpha": 0.5}
    free = provide("dlrm-synthetic", options).inputs[0].args[1]
    capped = provide("dlrm-synthetic", {**options, "max_lookups": 3}).inputs[0].args[1]
    assert int(free.lengths().max()) > 3
    assert int(capped.lengths().max()) == 3 and int(capped.lengths().min()) >= 1
    assert capped.stride() == free.stride() == 8


def test_footprint_counts_the_distinct_ids_per_table():
    provided = provide("dlrm-synthetic", {**TINY, "sparse_features": 4, "num_tables": 2}, batches=3)
    names = {t["table"]: t for t in provided.details["tables"]}
    for t, features in (("t_0", ["cat_0", "cat_2"]), ("t_1", ["cat_1", "cat_3"])):
        ids = torch.cat([b.args[1].to_dict()[f].values() for b in provided.inputs for f in features])
        assert names[t]["unique_ids"] == int(torch.unique(ids).numel())
        assert names[t]["lookups"] == int(ids.numel())
        assert names[t]["footprint_bytes"] == names[t]["unique_ids"] * 8 * 4
        assert 0 < names[t]["unique_share"] <= 1
    assert provided.details["unique_ids"] == sum(t["unique_ids"] for t in names.values())
    json.dumps(provided.details)


def test_footprint_is_recorded_in_the_run(fast_config):
    from dataclasses import replace

    from cbsite.collector.collect import collect
    from cbsite.collector.request import CollectRequest

    config = replace(fast_config, max_depth=1, step=False)
    run = collect(CollectRequest("dlrm-synthetic", {**TINY, "num_tables": 2, "interaction": "cat"}, batches=1, config=config))
    details = run.meta["provider"]["details"]
    assert [t["table"] for t in details["tables"]] == ["t_0", "t_1"] and details["footprint_bytes"] > 0
    assert "InteractionConcatArch" in set(run.table("forward")["module_type"].to_list()).__str__()


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"interaction": "attention"}, "interaction='attention'"),
        ({"num_tables": 5}, "num_tables=5"),  # more tables than the 4 features
        ({"max_lookups": 0}, "max_lookups=0"),
        ({"num_tables": 2, "num_embeddings": [10, 10, 10]}, "num_embeddings"),
        ({"dcn_layers": 0}, "dcn_layers=0"),
    ],
)
def test_bad_knobs_are_refused(options, problem):
    with pytest.raises(CbsiteError, match="bad options") as err:
        provide("dlrm-synthetic", {**TINY, **options})
    assert problem in str(err.value)


# --- table placement (fbgemm's table-batched embeddings; CUDA only) -------------------------------------


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"placement": "host"}, "placement='host' (use one of 'device', 'uvm', 'uvm_caching')"),
        ({"placement": "uvm", "cache_ratio": 0.5}, "for placement=uvm_caching only"),
        ({"cache_ratio": 0.5}, "for placement=uvm_caching only"),
        ({"placement": "uvm_caching", "cache_ratio": 0}, "cache_ratio=0 (the share"),
        ({"placement": "uvm_caching", "cache_ratio": 1.5}, "cache_ratio=1.5 (the share"),
        ({"placement": "device", "embedding_dim": 6}, "need a multiple of 4"),
    ],
)
def test_bad_placement_options_are_refused_before_anything_is_built(options, problem):
    with pytest.raises(CbsiteError, match="bad options") as err:
        provide("dlrm-synthetic", {**TINY, **options})
    assert problem in str(err.value)


@pytest.mark.parametrize("placement", ["device", "uvm", "uvm_caching"])
def test_placement_without_cuda_is_a_clear_error(placement, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(CbsiteError, match=f"placement='{placement}' puts the tables in CUDA memory.*needs CUDA"):
        provide("dlrm-synthetic", {**TINY, "placement": placement})


def test_default_has_no_placement():
    provided = provide("dlrm-synthetic", TINY)
    assert provided.details["placement"] is None and provided.options["placement"] is None
    assert type(provided.model.sparse_arch.embedding_bag_collection).__name__ == "EmbeddingBagCollection"


def _same_tables(tbe_collection, ebc):
    """Copy the table-batched weights into a torchrec EmbeddingBagCollection of the same tables."""
    with torch.no_grad():
        for config, weight in zip(tbe_collection.embedding_bag_configs(), tbe_collection.tbe.split_embedding_weights()):
            ebc.embedding_bags[config.name].weight.copy_(weight.detach().cpu())


def test_table_batched_collection_pools_as_torchrec_does_on_cpu():
    """The wrapper's own arithmetic (ids per feature, shared tables, pooled slices), on fbgemm's CPU kernels (HOST)."""
    from cbsite.collector.providers.synthetic import TableBatchedEmbeddingBagCollection, shared_collection

    provided = provide("dlrm-synthetic", {**TINY, "sparse_features": 5, "num_tables": 2, "num_embeddings": [40, 9]})
    ebc = shared_collection(5, 2, [40, 9], 8)
    tbe = TableBatchedEmbeddingBagCollection(ebc.embedding_bag_configs(), "HOST", "cpu")
    _same_tables(tbe, ebc)
    kjt = provided.inputs[0].args[1]
    got, want = tbe(kjt), ebc(kjt)
    assert got.keys() == want.keys() == ["cat_0", "cat_2", "cat_4", "cat_1", "cat_3"]  # table by table, as torchrec
    torch.testing.assert_close(got.values(), want.values())
    # Features in another order are looked up by name.
    reordered = kjt.permute([4, 3, 2, 1, 0])
    torch.testing.assert_close(tbe(reordered).to_dict()["cat_3"], want.to_dict()["cat_3"])
    # Backward runs through the fused SGD at learning rate 0: no row moves.
    before = [w.clone() for w in tbe.tbe.split_embedding_weights()]
    tbe(kjt).values().sum().backward()
    assert all(torch.equal(a, b) for a, b in zip(before, tbe.tbe.split_embedding_weights()))


def test_collector_measures_a_dlrm_on_table_batched_embeddings_on_cpu(fast_config):
    """The placement path's model, with fbgemm's CPU kernels: the `tbe` child is a component, fwd and bwd, and the step runs."""
    from dataclasses import replace

    from cbsite.collector import profile
    from cbsite.collector.providers.synthetic import TableBatchedEmbeddingBagCollection, build

    provided = provide("dlrm-synthetic", {**TINY, "num_tables": 2})
    configs = provided.model.sparse_arch.embedding_bag_collection.embedding_bag_configs()
    model = build("dot", TableBatchedEmbeddingBagCollection(configs, "HOST", "cpu"), 64, [32], [16, 1], 8, 4, 2, 4)
    run = profile(model, *provided.inputs[0].args, config=replace(fast_config, max_depth=3))
    rows = {(r["path"], r["phase"]): r for r in run.table().to_dicts()}
    for phase in ("forward", "backward"):
        assert rows[("sparse_arch.embedding_bag_collection.tbe", phase)]["status"] == "measured"
        assert rows[("", phase)]["status"] == "measured"
    assert rows[("sparse_arch.embedding_bag_collection.tbe", "forward")]["param_bytes"] >= (100 + 100) * 8 * 4
    assert run.meta["step"]["train"]["examples_per_s"] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("placement", ["device", "uvm", "uvm_caching"])
def test_placement_puts_the_tables_where_asked_on_cuda(placement, fast_config):
    """On CUDA: the tables in device memory, UVM or UVM with a cache; pooled as torchrec's; a run collects."""
    from dataclasses import replace

    from cbsite.collector.collect import collect
    from cbsite.collector.providers.synthetic import shared_collection
    from cbsite.collector.request import CollectRequest

    options = {**TINY, "num_tables": 2, "num_embeddings": [1000, 200], "placement": placement}
    if placement == "uvm_caching":
        options["cache_ratio"] = 0.25
    provided = provide("dlrm-synthetic", options)
    collection = provided.model.sparse_arch.embedding_bag_collection
    tbe = collection.tbe
    assert type(collection).__name__ == "TableBatchedEmbeddingBagCollection"
    rows = (1000 + 200) * 8
    if placement == "device":
        assert tbe.weights_dev.numel() == rows and tbe.weights_uvm.numel() == 0
    else:
        assert tbe.weights_uvm.numel() == rows and tbe.weights_dev.numel() == 0
    if placement == "uvm_caching":
        assert 0 < tbe.lxu_cache_weights.shape[0] < 1200
        assert provided.details["placement"] == {"placement": "uvm_caching", "fbgemm_location": "MANAGED_CACHING",
                                                 "cache_ratio": 0.25}
    ebc = shared_collection(4, 2, [1000, 200], 8)
    _same_tables(collection, ebc)
    kjt = provided.inputs[0].args[1]
    torch.testing.assert_close(collection(kjt.to("cuda")).values().cpu(), ebc(kjt).values())
    config = replace(fast_config, device="cuda", max_depth=3, peak_flops=None, peak_bandwidth=None)
    run = collect(CollectRequest("dlrm-synthetic", options, batches=2, config=config))
    rows = {(r["path"], r["phase"]): r for r in run.table().to_dicts()}
    assert rows[("sparse_arch.embedding_bag_collection.tbe", "forward")]["status"] == "measured"
    assert rows[("", "backward")]["status"] == "measured"
    assert run.meta["provider"]["details"]["placement"]["placement"] == placement
    assert run.meta["step"]["train"]["examples_per_s"] > 0
