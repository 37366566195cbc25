"""`deepfm`: torchrec's SimpleDeepFMNN, whose interaction arch holds `deep_fm` and `fm` siblings.

Same power-law sparse traffic as `dlrm` (the sampler lives there), so the two models' sparse arches
are comparable run to run.
"""

from __future__ import annotations

from typing import Any

from torchrec.models.deepfm import SimpleDeepFMNN

from cbsite.collector.distributed.sharding import provider_choice
from cbsite.collector.providers import OptionCheck, Provided, resolve_options
from cbsite.collector.providers.dlrm import (
    embedding_bag_collection,
    one_or_list,
    recsys_batches,
    seeded_build,
    span,
    sparse_options,
)

NAME = "deepfm"

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        batch_size=8, num_tables=3, num_embeddings=100, embedding_dim=8, dense_in_features=13,
        hidden_layer_size=16, deep_fm_dimension=8, mean_pooling=3, alpha=1.05, sharding=None, compute_kernel=None,
    ),
    "small": dict(
        batch_size=128, num_tables=8, num_embeddings=10_000, embedding_dim=32, dense_in_features=13,
        hidden_layer_size=128, deep_fm_dimension=64, mean_pooling=8, alpha=1.05, sharding=None, compute_kernel=None,
    ),
    "medium": dict(
        batch_size=2048, num_tables=26, num_embeddings=100_000, embedding_dim=64, dense_in_features=13,
        hidden_layer_size=512, deep_fm_dimension=256, mean_pooling=20, alpha=1.05, sharding=None, compute_kernel=None,
    ),
}


def provide(options: dict[str, Any], *, batches: int = 1, seed: int = 0) -> Provided:
    """Build a torchrec SimpleDeepFMNN and power-law batches `(dense_features, sparse_features)`.

    `num_embeddings` and `mean_pooling` take one value for all tables or a list, one per table;
    `sharding` and `compute_kernel` shard the tables over the ranks (cbsite.collector.distributed.sharding).
    """
    opts = resolve_options(NAME, options, PRESETS, seed)
    check = OptionCheck(NAME, opts)
    batch_size = check.integer("batch_size")
    num_tables = check.integer("num_tables")
    embedding_dim = check.integer("embedding_dim")
    dense_in = check.integer("dense_in_features")
    hidden = check.integer("hidden_layer_size")
    deep_fm_dim = check.integer("deep_fm_dimension")
    hash_sizes, pooling, alpha = sparse_options(check, num_tables, "mean_pooling")
    sharded = provider_choice(check, NAME, num_tables)
    check.done()
    opts.update(alpha=alpha, num_embeddings=one_or_list(hash_sizes), mean_pooling=one_or_list(pooling))

    model = seeded_build(
        opts["seed"],
        lambda: SimpleDeepFMNN(
            num_dense_features=dense_in,
            embedding_bag_collection=embedding_bag_collection(hash_sizes, embedding_dim),
            hidden_layer_size=hidden,
            deep_fm_dimension=deep_fm_dim,
        ),
    )
    data_seed = sharded.data_seed(opts["seed"]) if sharded else opts["seed"]
    inputs = recsys_batches(batches, data_seed, batch_size, dense_in, hash_sizes, pooling, alpha)
    description = (
        f"torchrec SimpleDeepFMNN, {num_tables} tables x {embedding_dim} dims, hash sizes {span(hash_sizes)}, "
        f"batch {batch_size}, power-law ids and pooling (alpha {alpha}, mean pooling {span(pooling)})"
    )
    details = {}
    if sharded:
        model, details["sharding"] = sharded.apply(model)
        description += f", sharded ({sharded.label()}, batch {batch_size} per rank)"
    return Provided(model=model, inputs=inputs, name=NAME, options=opts, description=description, details=details)
