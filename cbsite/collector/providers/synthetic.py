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

* **table placement** (`placement`, CUDA only): the tables as fbgemm's table-batched embeddings
  (`SplitTableBatchedEmbeddingBagsCodegen`, `TableBatchedEmbeddingBagCollection` below) in device
  memory (`device`), in unified virtual memory (`uvm`), or in UVM with a cache of `cache_ratio` of the
  rows in device memory (`uvm_caching`, default ratio 0.2). Unset, the tables are torchrec's
  `EmbeddingBagCollection`, as on CPU.

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
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from cbsite.collector.distributed.sharding import provider_choice
from cbsite.collector.providers import OptionCheck, Provided, resolve_options
from cbsite.collector.providers.dlrm import feature_names, one_or_list, recsys_batches, seeded_build, span
from cbsite.errors import CbsiteError

NAME = "dlrm-synthetic"

DENSE_RANGE = (64, 4096)
SPARSE_RANGE = (4, 128)
INTERACTIONS = ("dot", "cat", "dcn")
# placement -> fbgemm's EmbeddingLocation (`host` is the CPU kernel's location: tests of the wrapper only, not an option)
PLACEMENTS = {"device": "DEVICE", "uvm": "MANAGED", "uvm_caching": "MANAGED_CACHING"}
DEFAULT_CACHE_RATIO = 0.2  # fbgemm's own default cache_load_factor

_COMMON = dict(num_tables=None, interaction="dot", dcn_layers=2, max_lookups=None, placement=None, cache_ratio=None,
               sharding=None, compute_kernel=None)
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


class TableBatchedEmbeddingBagCollection(nn.Module):
    """An EmbeddingBagCollection on fbgemm's table-batched embeddings, its tables placed where `location` says.

    The same interface as torchrec's `EmbeddingBagCollection` for DLRM's `SparseArch`:
    `embedding_bag_configs()`, and a `KeyedJaggedTensor` in, a `KeyedTensor` of sum-pooled embeddings
    (one `embedding_dim` slice per feature) out. Every table is one `SplitTableBatchedEmbeddingBagsCodegen`
    (the child `tbe`, measured as a component of its own) with `feature_table_map` for shared tables.
    `location` is a fbgemm `EmbeddingLocation` name: DEVICE, MANAGED (UVM), MANAGED_CACHING (UVM with
    `cache_ratio` of the rows cached in device memory) on CUDA; HOST on CPU. The fused optimizer is exact
    SGD at learning rate 0, as the step's optimizer: backward replays run in full and move no row.
    Weights are drawn on the CPU generator (torchrec's uniform bounds per table), so a seed gives the
    same tables on any device.
    """

    def __init__(self, tables: list[EmbeddingBagConfig], location: str, device: str | torch.device,
                 cache_ratio: float = DEFAULT_CACHE_RATIO) -> None:
        super().__init__()
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )

        device = torch.device(device)
        self._configs = list(tables)
        self.location = location
        self.features = [f for t in tables for f in t.feature_names]
        self.dims = [t.embedding_dim for t in tables for _ in t.feature_names]
        where = EmbeddingLocation[location]
        compute = ComputeDevice.CUDA if device.type == "cuda" else ComputeDevice.CPU
        self.tbe = SplitTableBatchedEmbeddingBagsCodegen(
            [(t.num_embeddings, t.embedding_dim, where, compute) for t in tables],
            feature_table_map=[i for i, t in enumerate(tables) for _ in t.feature_names],
            cache_load_factor=cache_ratio, optimizer=EmbOptimType.EXACT_SGD, learning_rate=0.0,
            pooling_mode=PoolingMode.SUM, device=device,
        )
        with torch.no_grad():
            for t, weight in zip(tables, self.tbe.split_embedding_weights()):
                rows = torch.empty(t.num_embeddings, t.embedding_dim).uniform_(t.get_weight_init_min(), t.get_weight_init_max())
                weight.copy_(rows.to(weight.device))

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return self._configs

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        if features.keys() != self.features:
            features = features.permute([features.keys().index(f) for f in self.features])
        values = features.values()
        if self.location != "HOST" and values.device.type != "cuda":
            raise CbsiteError(f"dlrm-synthetic's tables live in CUDA memory ({self.location}) but the ids are on "
                              f"{values.device}: collect with --device cuda")
        pooled = self.tbe(indices=values.long(), offsets=features.offsets().long())
        return KeyedTensor(keys=list(self.features), length_per_key=list(self.dims), values=pooled)


def placement_problem(placement: str) -> str | None:
    """Why `placement` cannot be built here (no CUDA device, or fbgemm's CPU-only build), or None."""
    from importlib import metadata

    if not torch.cuda.is_available():
        return (f"placement={placement!r} puts the tables in CUDA memory through fbgemm's table-batched "
                "embeddings: it needs CUDA, and torch here has no CUDA device; leave placement unset on CPU")
    try:
        metadata.version("fbgemm-gpu-cpu")
    except metadata.PackageNotFoundError:
        return None
    return (f"placement={placement!r} needs fbgemm's CUDA build (fbgemm-gpu), and fbgemm-gpu-cpu is installed here: "
            "`make install` on a CUDA machine installs fbgemm-gpu")


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
    and `dcn_low_rank`); `max_lookups` (null: no cap) caps every bag. `placement` (null: torchrec's
    EmbeddingBagCollection) puts the tables on CUDA through fbgemm's table-batched embeddings: `device`,
    `uvm` or `uvm_caching` with `cache_ratio` (default 0.2); it is refused up front without CUDA.
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
    placement = None if opts["placement"] is None else check.one_of("placement", tuple(PLACEMENTS))
    cache_ratio = None
    if opts["cache_ratio"] is not None:
        value = opts["cache_ratio"]
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1
        check.require(ok, "cache_ratio", "the share of each table's rows cached in device memory: above 0, at most 1")
        check.require(placement == "uvm_caching", "cache_ratio", "a cache ratio is for placement=uvm_caching only")
        cache_ratio = float(value) if ok else DEFAULT_CACHE_RATIO
    elif placement == "uvm_caching":
        cache_ratio = DEFAULT_CACHE_RATIO
    if placement is not None:
        check.require(embedding_dim % 4 == 0, "embedding_dim", "fbgemm's table-batched embeddings need a multiple of 4")
        check.require(opts["sharding"] is None, "sharding", "sharded tables are torchrec's; leave placement unset to shard")
    sharded = provider_choice(check, NAME, num_tables) if placement is None else None
    check.done()
    if placement is not None and (problem := placement_problem(placement)):
        raise CbsiteError(f"option {problem}")
    opts.update(
        bottom_mlp=bottom, top_mlp=top, alpha=alpha, cache_ratio=cache_ratio,
        num_embeddings=one_or_list(hash_sizes), pooling_factors=one_or_list(pooling),
    )

    def collection() -> nn.Module:
        ebc = shared_collection(sparse, num_tables, hash_sizes, embedding_dim)
        if placement is None:
            return ebc
        return TableBatchedEmbeddingBagCollection(ebc.embedding_bag_configs(), PLACEMENTS[placement], "cuda",
                                                  cache_ratio or DEFAULT_CACHE_RATIO)

    model = seeded_build(
        opts["seed"],
        lambda: build(interaction, collection(), dense, bottom, top, embedding_dim, sparse, dcn_layers, dcn_low_rank),
    )
    feature_hash = [hash_sizes[table_of(j, num_tables)] for j in range(sparse)]
    data_seed = sharded.data_seed(opts["seed"]) if sharded else opts["seed"]
    inputs = recsys_batches(batches, data_seed, batch_size, dense, feature_hash, pooling, alpha, max_lookups)
    tables = footprint(inputs, sparse, num_tables, hash_sizes, embedding_dim, pooling)
    shared = f", {num_tables} shared tables" if num_tables < sparse else ""
    cap = f", at most {max_lookups} lookups per bag" if max_lookups is not None else ""
    where = {None: "", "device": ", tables in device memory (fbgemm TBE)", "uvm": ", tables in UVM (fbgemm TBE)",
             "uvm_caching": f", tables in UVM with {cache_ratio:.0%} of rows cached in device memory (fbgemm TBE)"
             if cache_ratio is not None else ""}[placement]
    inter = f"{interaction} interaction" + (f" ({dcn_layers} cross layers, rank {dcn_low_rank})" if interaction == "dcn" else "")
    description = (
        f"synthetic torchrec DLRM: {dense} dense / {sparse} sparse features{shared}, hash sizes {span(hash_sizes)} "
        f"x {embedding_dim} dims, bottom MLP {bottom}, top MLP {top}, {inter}, pooling {span(pooling)}{cap}, "
        f"batch {batch_size}{where}"
    )
    details = {
        "tables": tables,
        "unique_ids": sum(t["unique_ids"] for t in tables),
        "footprint_bytes": sum(t["footprint_bytes"] for t in tables),
        "placement": None if placement is None else {"placement": placement, "fbgemm_location": PLACEMENTS[placement],
                                                     "cache_ratio": cache_ratio},
        "rule": "unique_ids: distinct ids over every example batch, per table (before any preprocessing); "
                "footprint_bytes = unique_ids x embedding_dim x 4 (float32 rows)",
    }
    if sharded:
        model, details["sharding"] = sharded.apply(model)
        description += f", sharded ({sharded.label()}, batch {batch_size} per rank)"
    return Provided(model=model, inputs=inputs, name=NAME, options=opts, description=description, details=details)
