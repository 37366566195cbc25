"""`dlrm-synthetic`: a DLRM family on torchrec's DLRM, shaped by a few knobs for design-space sweeps.

Where `dlrm` mirrors one production-like configuration, this provider exposes the axes a sweep varies:
how many dense and sparse features, how big and wide the tables are, the MLP shapes, the pooling
factors and the batch size, and the efficiency questions' structural knobs:

* **shared tables** (`num_tables`): several features looked up in one table, assigned round-robin
  (feature i uses table i mod num_tables; default: one table per feature). `num_embeddings` is per
  table, `pooling_factors` per feature.
* **interaction** (`interaction`): `dot` (torchrec's `InteractionArch`: pairwise dot products, DLRM's
  own), `cat` (`InteractionConcatArch` below: the dense output and every pooled embedding concatenated)
  or `dcn` (torchrec's `DLRM_DCN`: `InteractionDCNArch` with a `LowRankCrossNet` of `dcn_layers`
  layers of rank `dcn_low_rank` over the concatenation). The over arch's input follows the choice.
* **a cap on lookups** (`max_lookups`): every bag (ids per sample and feature) is cut at this many, as
  pipelines truncate long histories; pooling factors are drawn first, then capped.

The unique-id footprint of each table (distinct ids the example batches touch, and their bytes) is
recorded in run.json's `provider.details.tables`, because it, more than the table size, decides how
much of a table a step really reads. Bounds keep every point of a sweep a plausible recommendation model.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torchrec.models.dlrm import DLRM, DLRM_DCN, OverArch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from cbsite.collector.providers import OptionCheck, Provided, resolve_options
from cbsite.collector.providers.dlrm import feature_names, one_or_list, recsys_batches, seeded_build, span

NAME = "dlrm-synthetic"

DENSE_RANGE = (64, 4096)
SPARSE_RANGE = (4, 128)
INTERACTIONS = ("dot", "cat", "dcn")

_COMMON = dict(num_tables=None, interaction="dot", dcn_layers=2, max_lookups=None)
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        batch_size=8, dense_features=64, sparse_features=4, num_embeddings=100, embedding_dim=8,
        bottom_mlp=[32], top_mlp=[16, 1], pooling_factors=2, alpha=1.05, dcn_low_rank=4, **_COMMON,
    ),
    "small": dict(
        batch_size=128, dense_features=256, sparse_features=16, num_embeddings=10_000, embedding_dim=32,
        bottom_mlp=[256, 128], top_mlp=[256, 64, 1], pooling_factors=8, alpha=1.05, dcn_low_rank=32, **_COMMON,
    ),
    "medium": dict(
        batch_size=1024, dense_features=1024, sparse_features=64, num_embeddings=50_000, embedding_dim=64,
        bottom_mlp=[1024, 512, 256], top_mlp=[1024, 512, 256, 1], pooling_factors=16, alpha=1.05, dcn_low_rank=64,
        **_COMMON,
    ),
}


class InteractionConcatArch(nn.Module):
    """The concatenation interaction: [dense output, every pooled embedding] side by side, no crossing.

    Same call signature as torchrec's interaction arches; output width (features + 1) x embedding_dim.
    """

    def __init__(self, num_sparse_features: int) -> None:
        super().__init__()
        self.num_sparse_features = num_sparse_features

    def forward(self, dense_features: torch.Tensor, sparse_features: torch.Tensor) -> torch.Tensor:
        """dense_features [B, D] and the sparse arch's pooled embeddings [B, F, D] -> [B, (F + 1) D]."""
        if self.num_sparse_features <= 0:
            return dense_features
        return torch.cat((dense_features, sparse_features.reshape(sparse_features.shape[0], -1)), dim=1)


def table_of(feature: int, num_tables: int) -> int:
    """The table feature `feature` looks up: round-robin over the tables."""
    return feature % num_tables


def shared_collection(num_features: int, num_tables: int, hash_sizes: list[int], embedding_dim: int) -> EmbeddingBagCollection:
    """`num_tables` tables, each serving the features assigned to it (`t_<i>` serves cat_j with j % num_tables == i)."""
    names = feature_names(num_features)
    tables = [
        EmbeddingBagConfig(name=f"t_{t}", embedding_dim=embedding_dim, num_embeddings=hash_sizes[t],
                           feature_names=[f for j, f in enumerate(names) if table_of(j, num_tables) == t])
        for t in range(num_tables)
    ]
    return EmbeddingBagCollection(tables=tables)


def build(interaction: str, collection: EmbeddingBagCollection, dense: int, bottom: list[int], top: list[int],
          embedding_dim: int, features: int, dcn_layers: int, dcn_low_rank: int) -> nn.Module:
    if interaction == "dcn":
        return DLRM_DCN(embedding_bag_collection=collection, dense_in_features=dense,
                        dense_arch_layer_sizes=[*bottom, embedding_dim], over_arch_layer_sizes=top,
                        dcn_num_layers=dcn_layers, dcn_low_rank_dim=dcn_low_rank)
    model = DLRM(embedding_bag_collection=collection, dense_in_features=dense,
                 dense_arch_layer_sizes=[*bottom, embedding_dim], over_arch_layer_sizes=top)
    if interaction == "cat":
        model.inter_arch = InteractionConcatArch(features)
        model.over_arch = OverArch(in_features=(features + 1) * embedding_dim, layer_sizes=top)
    return model


def footprint(inputs: list[Any], features: int, num_tables: int, hash_sizes: list[int], embedding_dim: int,
              pooling: list[float]) -> list[dict[str, Any]]:
    """Per table: its features, rows, lookups and the distinct ids the example batches touch (and their bytes)."""
    ids: list[list[torch.Tensor]] = [[] for _ in range(num_tables)]
    lookups = [0] * num_tables
    names = feature_names(features)
    for batch in inputs:
        kjt = batch.args[1].to_dict()
        for j, name in enumerate(names):
            values = kjt[name].values()
            t = table_of(j, num_tables)
            ids[t].append(values)
            lookups[t] += int(values.numel())
    out = []
    for t in range(num_tables):
        unique = int(torch.unique(torch.cat(ids[t])).numel()) if ids[t] else 0
        out.append({
            "table": f"t_{t}", "features": [f for j, f in enumerate(names) if table_of(j, num_tables) == t],
            "num_embeddings": hash_sizes[t], "embedding_dim": embedding_dim,
            "mean_pooling": [pooling[j] for j in range(features) if table_of(j, num_tables) == t],
            "lookups": lookups[t], "unique_ids": unique, "unique_share": unique / hash_sizes[t],
            "footprint_bytes": unique * embedding_dim * 4, "table_bytes": hash_sizes[t] * embedding_dim * 4,
        })
    return out


def provide(options: dict[str, Any], *, batches: int = 1, seed: int = 0) -> Provided:
    """Build one point of the DLRM design space and its power-law batches.

    `bottom_mlp` lists the hidden sizes of the dense arch; a last layer of `embedding_dim` is appended
    because DLRM interacts the dense output with the embeddings. `top_mlp` is the whole over arch.
    `num_tables` (null: one per sparse feature) tables serve the features round-robin;
    `num_embeddings` takes one value for all tables or a list, one per table, and `pooling_factors`
    one value or a list, one per sparse feature. `interaction` is dot, cat or dcn (with `dcn_layers`
    and `dcn_low_rank`); `max_lookups` (null: no cap) caps every bag.
    """
    opts = resolve_options(NAME, options, PRESETS, seed)
    check = OptionCheck(NAME, opts)
    batch_size = check.integer("batch_size")
    dense = check.integer("dense_features", *DENSE_RANGE)
    sparse = check.integer("sparse_features", *SPARSE_RANGE)
    embedding_dim = check.integer("embedding_dim")
    bottom = check.sizes("bottom_mlp")
    top = check.sizes("top_mlp")
    num_tables = sparse if opts["num_tables"] is None else check.integer("num_tables", 1, max(1, sparse))
    hash_sizes = check.per_table("num_embeddings", num_tables, 1, integer=True)
    pooling = check.per_table("pooling_factors", sparse, 1, integer=False)
    alpha = check.number("alpha", 0.0)
    check.integer("seed", 0)
    interaction = check.one_of("interaction", INTERACTIONS)
    dcn_layers = check.integer("dcn_layers", 1, 16)
    dcn_low_rank = check.integer("dcn_low_rank", 1)
    max_lookups = None if opts["max_lookups"] is None else check.integer("max_lookups", 1)
    check.done()
    opts.update(
        bottom_mlp=bottom, top_mlp=top, alpha=alpha,
        num_embeddings=one_or_list(hash_sizes), pooling_factors=one_or_list(pooling),
    )

    model = seeded_build(
        opts["seed"],
        lambda: build(interaction, shared_collection(sparse, num_tables, hash_sizes, embedding_dim), dense, bottom, top,
                      embedding_dim, sparse, dcn_layers, dcn_low_rank),
    )
    feature_hash = [hash_sizes[table_of(j, num_tables)] for j in range(sparse)]
    inputs = recsys_batches(batches, opts["seed"], batch_size, dense, feature_hash, pooling, alpha, max_lookups)
    tables = footprint(inputs, sparse, num_tables, hash_sizes, embedding_dim, pooling)
    shared = f", {num_tables} shared tables" if num_tables < sparse else ""
    cap = f", at most {max_lookups} lookups per bag" if max_lookups is not None else ""
    inter = f"{interaction} interaction" + (f" ({dcn_layers} cross layers, rank {dcn_low_rank})" if interaction == "dcn" else "")
    description = (
        f"synthetic torchrec DLRM: {dense} dense / {sparse} sparse features{shared}, hash sizes {span(hash_sizes)} "
        f"x {embedding_dim} dims, bottom MLP {bottom}, top MLP {top}, {inter}, pooling {span(pooling)}{cap}, "
        f"batch {batch_size}"
    )
    details = {
        "tables": tables,
        "unique_ids": sum(t["unique_ids"] for t in tables),
        "footprint_bytes": sum(t["footprint_bytes"] for t in tables),
        "rule": "unique_ids: distinct ids over every example batch, per table (before any preprocessing); "
                "footprint_bytes = unique_ids x embedding_dim x 4 (float32 rows)",
    }
    return Provided(model=model, inputs=inputs, name=NAME, options=opts, description=description, details=details)
