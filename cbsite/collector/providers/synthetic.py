"""`dlrm-synthetic`: a DLRM family on torchrec's DLRM, shaped by a few knobs for design-space sweeps.

Where `dlrm` mirrors one production-like configuration, this provider exposes the axes a sweep varies:
how many dense and sparse features, how big and wide the tables are, the MLP shapes, the pooling
factors and the batch size. Bounds keep every point of a sweep a plausible recommendation model.
"""

from __future__ import annotations

from typing import Any

from torchrec.models.dlrm import DLRM

from cbsite.collector.providers import OptionCheck, Provided, resolve_options
from cbsite.collector.providers.dlrm import (
    embedding_bag_collection,
    one_or_list,
    recsys_batches,
    seeded_build,
    sparse_options,
    span,
)

NAME = "dlrm-synthetic"

DENSE_RANGE = (64, 4096)
SPARSE_RANGE = (4, 128)

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        batch_size=8, dense_features=64, sparse_features=4, num_embeddings=100, embedding_dim=8,
        bottom_mlp=[32], top_mlp=[16, 1], pooling_factors=2, alpha=1.05,
    ),
    "small": dict(
        batch_size=128, dense_features=256, sparse_features=16, num_embeddings=10_000, embedding_dim=32,
        bottom_mlp=[256, 128], top_mlp=[256, 64, 1], pooling_factors=8, alpha=1.05,
    ),
    "medium": dict(
        batch_size=1024, dense_features=1024, sparse_features=64, num_embeddings=50_000, embedding_dim=64,
        bottom_mlp=[1024, 512, 256], top_mlp=[1024, 512, 256, 1], pooling_factors=16, alpha=1.05,
    ),
}


def provide(options: dict[str, Any], *, batches: int = 1, seed: int = 0) -> Provided:
    """Build one point of the DLRM design space and its power-law batches.

    `bottom_mlp` lists the hidden sizes of the dense arch; a last layer of `embedding_dim` is appended
    because DLRM interacts the dense output with the embeddings. `top_mlp` is the whole over arch.
    One table per sparse feature; `num_embeddings` and `pooling_factors` take one value for all of
    them or a list, one per sparse feature.
    """
    opts = resolve_options(NAME, options, PRESETS, seed)
    check = OptionCheck(NAME, opts)
    batch_size = check.integer("batch_size")
    dense = check.integer("dense_features", *DENSE_RANGE)
    sparse = check.integer("sparse_features", *SPARSE_RANGE)
    embedding_dim = check.integer("embedding_dim")
    bottom = check.sizes("bottom_mlp")
    top = check.sizes("top_mlp")
    hash_sizes, pooling, alpha = sparse_options(check, sparse, "pooling_factors")
    check.done()
    opts.update(
        bottom_mlp=bottom, top_mlp=top, alpha=alpha,
        num_embeddings=one_or_list(hash_sizes), pooling_factors=one_or_list(pooling),
    )

    model = seeded_build(
        opts["seed"],
        lambda: DLRM(
            embedding_bag_collection=embedding_bag_collection(hash_sizes, embedding_dim),
            dense_in_features=dense,
            dense_arch_layer_sizes=[*bottom, embedding_dim],
            over_arch_layer_sizes=top,
        ),
    )
    inputs = recsys_batches(batches, opts["seed"], batch_size, dense, hash_sizes, pooling, alpha)
    description = (
        f"synthetic torchrec DLRM: {dense} dense / {sparse} sparse features, hash sizes {span(hash_sizes)} "
        f"x {embedding_dim} dims, bottom MLP {bottom}, top MLP {top}, pooling {span(pooling)}, batch {batch_size}"
    )
    return Provided(model=model, inputs=inputs, name=NAME, options=opts, description=description)
