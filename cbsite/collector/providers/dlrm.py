"""`dlrm`: torchrec's DLRM (sparse, dense, interaction and over arch) on power-law sparse traffic.

Also home of the sparse-input sampler the other recommendation providers share. Real recommendation
traffic is heavy-tailed twice over: a few ids take most lookups (which decides how well embedding rows
stay in cache) and a few bags are very long (which decides the pooling work). Uniform ids would make
every lookup a cache miss and misprice the sparse arch, so both are drawn from a truncated power law.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Sequence

import torch
from torchrec.models.dlrm import DLRM
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from cbsite.collector.distributed.sharding import provider_choice
from cbsite.collector.providers import Inputs, OptionCheck, Provided, batch_seed, resolve_options
from cbsite.errors import CbsiteError

NAME = "dlrm"

# Per size: tiny is for tests (milliseconds), small is the CPU default (about 10 ms for forward +
# backward on 2 cores), medium is Criteo-shaped (26 sparse, 13 dense features) for a real device.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        batch_size=8, num_tables=3, num_embeddings=100, embedding_dim=8, dense_in_features=13,
        dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[16, 1], mean_pooling=3, alpha=1.05,
        sharding=None, compute_kernel=None,
    ),
    "small": dict(
        batch_size=128, num_tables=8, num_embeddings=10_000, embedding_dim=32, dense_in_features=13,
        dense_arch_layer_sizes=[128, 32], over_arch_layer_sizes=[128, 64, 1], mean_pooling=8, alpha=1.05,
        sharding=None, compute_kernel=None,
    ),
    "medium": dict(
        batch_size=2048, num_tables=26, num_embeddings=100_000, embedding_dim=64, dense_in_features=13,
        dense_arch_layer_sizes=[512, 256, 64], over_arch_layer_sizes=[512, 256, 1], mean_pooling=20,
        alpha=1.05, sharding=None, compute_kernel=None,
    ),
}

# Multipliers that scatter hot ids across a table the way hashing does (see `power_law_ids`).
_SCATTER_PRIMES = (1_000_003, 998_244_353, 2_147_483_647)


def power_law_ids(count: int, hash_size: int, alpha: float, generator: torch.Generator) -> torch.Tensor:
    """`count` int64 ids in [0, hash_size) whose frequency falls as rank^-alpha (Zipf-like).

    Sampled by inverting the CDF of a power law truncated to [1, hash_size + 1): O(count) for any
    hash size, no probability table. Ranks are then scattered by a multiplicative bijection mod
    hash_size, because hashed feature ids put hot rows all over a table, not in its first rows.
    """
    u = torch.rand(count, generator=generator, dtype=torch.float64)
    top = float(hash_size + 1)
    if abs(1.0 - alpha) < 1e-9:
        x = torch.exp(u * math.log(top))
    else:
        e = 1.0 - alpha
        x = (1.0 + u * (top**e - 1.0)) ** (1.0 / e)
    ranks = (x.floor().to(torch.int64) - 1).clamp_(0, hash_size - 1)
    prime = next((p for p in _SCATTER_PRIMES if math.gcd(p, hash_size) == 1), 1) % hash_size
    if (hash_size - 1) * prime >= 2**63:  # the product would overflow int64: keep ranks in order
        return ranks
    return (ranks * prime) % hash_size


@lru_cache(maxsize=64)
def _pooling_distribution(mean: float, alpha: float) -> torch.Tensor:
    """P(length = k) ∝ k^-alpha on 1..c, with the smallest c whose mean reaches `mean`."""
    limit = 16
    while True:
        k = torch.arange(1, limit + 1, dtype=torch.float64)
        weights = k.pow(-alpha)
        means = (weights * k).cumsum(0) / weights.cumsum(0)
        if means[-1] >= mean:
            c = int(torch.searchsorted(means, torch.tensor([mean], dtype=torch.float64)).item()) + 1
            return weights[:c] / weights[:c].sum()
        if limit >= 2**20:  # bags of a million ids are not a recommendation workload
            raise CbsiteError(
                f"a mean pooling factor of {mean} cannot be reached with alpha={alpha}: "
                f"a power law this steep has a smaller mean; lower alpha or the pooling factor"
            )
        limit *= 2


def power_law_lengths(count: int, mean: float, alpha: float, generator: torch.Generator) -> torch.Tensor:
    """`count` bag lengths >= 1, heavy-tailed (P(k) ∝ k^-alpha), with a mean close to `mean`."""
    probs = _pooling_distribution(float(mean), float(alpha))
    if len(probs) == 1:
        return torch.ones(count, dtype=torch.int64)
    return torch.multinomial(probs, count, replacement=True, generator=generator) + 1


def sample_kjt(
    keys: Sequence[str],
    hash_sizes: Sequence[int],
    mean_pooling: Sequence[float],
    alpha: float,
    batch_size: int,
    generator: torch.Generator,
    max_lookups: int | None = None,
) -> KeyedJaggedTensor:
    """A KeyedJaggedTensor of `batch_size` samples: per key, power-law lengths and power-law ids.

    `max_lookups` caps every bag (ids per sample and feature), as production pipelines truncate long
    histories: lengths are drawn from the power law, then clipped.
    """
    values, lengths = [], []
    for hash_size, mean in zip(hash_sizes, mean_pooling):
        key_lengths = power_law_lengths(batch_size, mean, alpha, generator)
        if max_lookups is not None:
            key_lengths = key_lengths.clamp(max=max_lookups)
        lengths.append(key_lengths)
        values.append(power_law_ids(int(key_lengths.sum()), hash_size, alpha, generator))
    return KeyedJaggedTensor.from_lengths_sync(
        keys=list(keys), values=torch.cat(values), lengths=torch.cat(lengths).to(torch.int32)
    )


def feature_names(count: int) -> list[str]:
    """Criteo-style categorical feature names, as torchrec's examples use."""
    return [f"cat_{i}" for i in range(count)]


def embedding_bag_collection(hash_sizes: Sequence[int], embedding_dim: int) -> EmbeddingBagCollection:
    """One table per feature: table `t_cat_i` serves feature `cat_i`."""
    tables = [
        EmbeddingBagConfig(name=f"t_{f}", embedding_dim=embedding_dim, num_embeddings=n, feature_names=[f])
        for f, n in zip(feature_names(len(hash_sizes)), hash_sizes)
    ]
    return EmbeddingBagCollection(tables=tables)


def recsys_batches(
    batches: int,
    seed: int,
    batch_size: int,
    dense_in_features: int,
    hash_sizes: Sequence[int],
    mean_pooling: Sequence[float],
    alpha: float,
    max_lookups: int | None = None,
) -> list[Inputs]:
    """Distinct `(dense_features, sparse_features)` batches, each from its own seeded generator."""
    out = []
    keys = feature_names(len(hash_sizes))
    for index in range(batches):
        g = torch.Generator().manual_seed(batch_seed(seed, index))
        dense = torch.rand(batch_size, dense_in_features, generator=g)
        sparse = sample_kjt(keys, hash_sizes, mean_pooling, alpha, batch_size, g, max_lookups)
        out.append(Inputs(args=(dense, sparse)))
    return out


def sparse_options(check: OptionCheck, tables: int, pooling_key: str) -> tuple[list[int], list[float], float]:
    """Hash sizes and pooling per table, and alpha, of the power-law sparse inputs (checked, with seed)."""
    hash_sizes = check.per_table("num_embeddings", tables, 1, integer=True)
    pooling = check.per_table(pooling_key, tables, 1, integer=False)
    alpha = check.number("alpha", 0.0)
    check.integer("seed", 0)
    return hash_sizes, pooling, alpha


def seeded_build(seed: int, build: Any) -> Any:
    """Call `build()` with torch's RNG seeded, leaving the caller's RNG state as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def provide(options: dict[str, Any], *, batches: int = 1, seed: int = 0) -> Provided:
    """Build a torchrec DLRM and power-law batches.

    `dense_arch_layer_sizes` must end with `embedding_dim` (torchrec feeds the dense arch's output to
    the interaction beside the embeddings); when it is not given, the preset's hidden sizes are kept
    and its last size follows `embedding_dim`, so `embedding_dim=128` alone is a valid change.
    `num_embeddings` and `mean_pooling` take one value for all tables or a list, one per table.
    `sharding` and `compute_kernel` shard the tables over the ranks of a distributed collection
    (cbsite.collector.distributed.sharding); each rank then draws its own batches.
    """
    opts = resolve_options(NAME, options, PRESETS, seed)
    if "dense_arch_layer_sizes" not in options:
        opts["dense_arch_layer_sizes"] = [*opts["dense_arch_layer_sizes"][:-1], opts["embedding_dim"]]
    check = OptionCheck(NAME, opts)
    batch_size = check.integer("batch_size")
    num_tables = check.integer("num_tables")
    embedding_dim = check.integer("embedding_dim")
    dense_in = check.integer("dense_in_features")
    dense_sizes = check.sizes("dense_arch_layer_sizes")
    over_sizes = check.sizes("over_arch_layer_sizes")
    hash_sizes, pooling, alpha = sparse_options(check, num_tables, "mean_pooling")
    check.require(
        dense_sizes[-1] == embedding_dim, "dense_arch_layer_sizes",
        f"its last size must equal embedding_dim={embedding_dim}",
    )
    sharded = provider_choice(check, NAME, num_tables)
    check.done()
    opts.update(
        dense_arch_layer_sizes=dense_sizes, over_arch_layer_sizes=over_sizes, alpha=alpha,
        num_embeddings=one_or_list(hash_sizes), mean_pooling=one_or_list(pooling),
    )

    model = seeded_build(
        opts["seed"],
        lambda: DLRM(
            embedding_bag_collection=embedding_bag_collection(hash_sizes, embedding_dim),
            dense_in_features=dense_in,
            dense_arch_layer_sizes=dense_sizes,
            over_arch_layer_sizes=over_sizes,
        ),
    )
    data_seed = sharded.data_seed(opts["seed"]) if sharded else opts["seed"]
    inputs = recsys_batches(batches, data_seed, batch_size, dense_in, hash_sizes, pooling, alpha)
    description = (
        f"torchrec DLRM, {num_tables} tables x {embedding_dim} dims, hash sizes {span(hash_sizes)}, "
        f"batch {batch_size}, power-law ids and pooling (alpha {alpha}, mean pooling {span(pooling)})"
    )
    details = {}
    if sharded:
        model, details["sharding"] = sharded.apply(model)
        description += f", sharded ({sharded.label()}, batch {batch_size} per rank)"
    return Provided(model=model, inputs=inputs, name=NAME, options=opts, description=description, details=details)


def one_or_list(values: list[Any]) -> Any:
    """A per-table option as the user would write it: one value when all tables agree."""
    return values[0] if len(set(values)) == 1 else values


def span(values: Sequence[Any]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo}" if lo == hi else f"{lo}-{hi}"
