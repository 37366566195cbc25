"""Sharding plans: the `sharding` and `compute_kernel` provider options, turned into torchrec's DMP.

`dlrm`, `deepfm` and `dlrm-synthetic` take

* `sharding`: one sharding type for every table (`table_wise`, `row_wise`, `column_wise`,
  `table_row_wise`, `data_parallel`; dashes work too), a list with one type per table, or `planner`
  (torchrec's `EmbeddingShardingPlanner` decides, from its cost model of this topology). Unset in a
  distributed collection (`--distributed`), it is `planner`: `with_default_plan` fills it in before the
  provider runs, so run.json's provider options say so and the plan it chose is printed and recorded (a
  user's function that returns the plain model is sharded by the planner too: `planned`);
* `compute_kernel`: `fused` or `dense` (one, or one per table); unset, torchrec picks per sharding type
  (`data_parallel` needs `dense`).

Placement is fixed so every rank computes the same plan without talking: table-wise puts table i on
rank i mod world size, column-wise splits every table over all ranks, table-row-wise uses host 0.
The sharded model is torchrec's `DistributedModelParallel`; its dense part is wrapped in DDP as in
training. Sharding needs the process group (torchrun and `cbsite collect --distributed`).
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn

from cbsite.errors import CbsiteError

SHARDING_TYPES = ("table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel")
PLANNER = "planner"
KERNELS = ("fused", "dense")


def _normal(value: Any) -> Any:
    return value.replace("-", "_") if isinstance(value, str) else value


def check_options(sharding: Any, kernel: Any, num_tables: int) -> tuple[list[str] | None, list[str | None], list[str]]:
    """(sharding type per table or None for the planner, kernel per table, problems) for the two options."""
    problems: list[str] = []
    types: list[str] | None
    if _normal(sharding) == PLANNER:
        types = None
    else:
        values = [_normal(v) for v in sharding] if isinstance(sharding, (list, tuple)) else [_normal(sharding)] * num_tables
        if len(values) != num_tables or any(v not in SHARDING_TYPES for v in values):
            problems.append(f"sharding={sharding!r} (use one of {', '.join(SHARDING_TYPES)} or {PLANNER!r}, "
                            f"or a list of {num_tables} sharding types, one per table)")
            values = [SHARDING_TYPES[0]] * num_tables
        types = values
    if kernel is None:
        kernels: list[str | None] = [None] * num_tables
    else:
        kernels = list(kernel) if isinstance(kernel, (list, tuple)) else [kernel] * num_tables
        if len(kernels) != num_tables or any(k not in KERNELS for k in kernels):
            problems.append(f"compute_kernel={kernel!r} (use {' or '.join(KERNELS)}, or a list of {num_tables}, one per table)")
            kernels = [None] * num_tables
    if types is not None:
        bad = [i for i, (t, k) in enumerate(zip(types, kernels)) if t == "data_parallel" and k == "fused"]
        if bad:
            problems.append(f"compute_kernel: table {bad[0]} is data_parallel, which runs the dense kernel only")
    return types, kernels, problems


def require_group(provider: str) -> tuple[int, int]:
    """(rank, world size) of the initialised process group, or a CbsiteError saying how to launch."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise CbsiteError(
            f"provider {provider!r}: the sharding option shards the tables over ranks and needs the process group: "
            f"launch with `torchrun --nproc-per-node N -m cbsite collect {provider} --distributed -o sharding=...`"
        )
    return dist.get_rank(), dist.get_world_size()


def same_on_every_rank(what: str, entry: dict[str, Any]) -> None:
    """Every rank's `entry` compared with rank 0's before anything is built from it; on a mismatch, every rank raises
    one line naming the keys that differ and each rank's value. Ranks given different sharding options built
    different plans and died in torchrec (SIGSEGV) with nothing said; one small all-gather of each rank's entry (JSON)
    costs milliseconds."""
    import json

    import torch.distributed as dist

    text = json.dumps(entry, sort_keys=True, default=str)
    seen: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(seen, text)
    if len(set(seen)) == 1:
        return
    mine = [json.loads(t) for t in seen]
    keys = sorted({k for e in mine for k in e if any(e.get(k) != mine[0].get(k) for e in mine)})
    listed = "; ".join(f"{k}: " + ", ".join(f"rank {r} {json.dumps(e.get(k), default=str)}" for r, e in enumerate(mine)
                                              if r == 0 or e.get(k) != mine[0].get(k)) for k in keys)
    raise CbsiteError(f"the ranks were given different {what} ({listed}); give every rank the same options "
                      "(the same -o values, model and cbsite command on every node)")


# The built-in providers that shard their tables (they take the `sharding` option).
SHARDING_PROVIDERS = ("dlrm", "deepfm", "dlrm-synthetic")


def with_default_plan(provider: str, options: dict[str, Any]) -> dict[str, Any]:
    """A distributed collection's provider options: torchrec's planner where a built-in is given no `sharding`
    (an unsharded model cannot be collected with --distributed); other providers' options are theirs."""
    if provider in SHARDING_PROVIDERS and options.get("sharding") is None and options.get("placement") is None:
        return {**options, "sharding": PLANNER}
    return options


def planned(model: nn.Module, provider: dict[str, Any]) -> tuple[nn.Module, dict[str, Any]]:
    """A distributed collection's model and run.json `provider` entry: a `DistributedModelParallel` as given; any other
    model with an `EmbeddingBagCollection` (a user's function that returns the plain model) sharded by torchrec's
    planner, its plan recorded in `provider.details.sharding`; anything else as given (the collection refuses it)."""
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    if isinstance(model, DistributedModelParallel):
        return model, provider
    if not any(isinstance(m, EmbeddingBagCollection) for m in model.modules()):
        return model, provider
    dmp, described = shard(model, None, [None])
    return dmp, {**provider, "details": {**(provider.get("details") or {}), "sharding": described}}


def plan_summary(described: dict[str, Any]) -> str:
    """One line of a described plan (see `describe_plan`), e.g. `table_wise x2 (ranks 0, 1), row_wise x1 (ranks 0, 1)`:
    tables per sharding type and the ranks holding them."""
    counts: dict[str, int] = {}
    ranks: dict[str, set[int]] = {}
    for tables in described.values():
        for entry in tables.values():
            kind = entry["sharding_type"]
            counts[kind] = counts.get(kind, 0) + 1
            ranks.setdefault(kind, set()).update(entry["ranks"])
    return ", ".join(f"{kind} x{n} (rank{'s' * (len(ranks[kind]) != 1)} {', '.join(map(str, sorted(ranks[kind])))})"
                     for kind, n in counts.items())


def rank_seed(seed: int, rank: int) -> int:
    """The seed of rank `rank`'s example batches: each rank of data-parallel training reads its own data.

    Rank 0 keeps `seed`, so its batches are those of an unsharded run with the same seed.
    """
    if rank == 0:
        return seed
    digest = hashlib.sha256(f"cbsite-rank:{seed}:{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def _generator(kind: str, table: int, world: int, kernel: str | None) -> Any:
    from torchrec.distributed import sharding_plan as sp

    if kind == "table_wise":
        return sp.table_wise(rank=table % world, compute_kernel=kernel)
    if kind == "row_wise":
        return sp.row_wise(compute_kernel=kernel)
    if kind == "column_wise":
        return sp.column_wise(ranks=list(range(world)), compute_kernel=kernel)
    if kind == "table_row_wise":
        return sp.table_row_wise(host_index=0)
    return sp.data_parallel()


def _kernel_value(kernel: str | None) -> str | None:
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel

    return None if kernel is None else {"fused": EmbeddingComputeKernel.FUSED.value,
                                        "dense": EmbeddingComputeKernel.DENSE.value}[kernel]


def shard(model: nn.Module, types: Sequence[str] | None, kernels: Sequence[str | None]) -> tuple[nn.Module, dict[str, Any]]:
    """`model` as a `DistributedModelParallel` over the process group, and the plan as JSON for run.json.

    Every `EmbeddingBagCollection` in the model is sharded; `types` and `kernels` list its tables in the
    order of `embedding_bag_configs()` (None: torchrec's planner decides).
    """
    import torch.distributed as dist
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, get_default_sharders
    from torchrec.distributed.types import ShardingPlan
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    world = dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    collections = [(path, m) for path, m in model.named_modules() if isinstance(m, EmbeddingBagCollection)]
    if not collections:
        raise CbsiteError("the sharding option needs a model with a torchrec EmbeddingBagCollection; this one has none")
    # Every rank must shard the same tables the same way: checked before the plan is built (a mismatch crashed).
    same_on_every_rank("sharding options", {
        "sharding": list(types) if types is not None else PLANNER,
        "compute_kernel": list(kernels),
        "tables": {path: [[c.name, c.num_embeddings, c.embedding_dim] for c in ebc.embedding_bag_configs()]
                   for path, ebc in collections},
    })
    if types is None:
        topology = Topology(world_size=world, compute_device=device.type)
        plan = EmbeddingShardingPlanner(topology=topology).collective_plan(model, get_default_sharders(), dist.GroupMember.WORLD)
    else:
        plans = {}
        for path, ebc in collections:
            configs = ebc.embedding_bag_configs()
            per_table = {c.name: _generator(types[i % len(types)], i, world, _kernel_value(kernels[i % len(kernels)]))
                         for i, c in enumerate(configs)}
            plans[path] = construct_module_sharding_plan(ebc, per_table, world_size=world, local_size=world,
                                                         device_type=device.type)
        plan = ShardingPlan(plans)
    dmp = DistributedModelParallel(module=model, device=device, plan=plan, sharders=get_default_sharders())
    described = describe_plan(plan)
    if types is None and dist.get_rank() == 0:  # one line per job: which plan the planner chose
        print(f"cbsite: torchrec's planner chose, for {world} ranks: {plan_summary(described)}", file=sys.stderr,
              flush=True)
    return dmp, described


def describe_plan(plan: Any) -> dict[str, Any]:
    """{module path: {table: {sharding_type, compute_kernel, ranks}}}: what run.json records of the plan."""
    out: dict[str, Any] = {}
    for path, module_plan in plan.plan.items():
        out[path] = {
            table: {"sharding_type": ps.sharding_type, "compute_kernel": ps.compute_kernel, "ranks": list(ps.ranks or [])}
            for table, ps in module_plan.items()
        }
    return out


@dataclass(frozen=True)
class Choice:
    """A provider's checked sharding options: a type per table (None: the planner) and a kernel per table."""

    types: list[str] | None
    kernels: list[str | None]

    def data_seed(self, seed: int) -> int:
        """The seed of this rank's example batches (see `rank_seed`)."""
        rank, _ = require_group("sharded")
        return rank_seed(seed, rank)

    def apply(self, model: nn.Module) -> tuple[nn.Module, dict[str, Any]]:
        return shard(model, self.types, self.kernels)

    def label(self) -> str:
        """e.g. `table_wise x2, row_wise x1` or `torchrec's planner`."""
        if self.types is None:
            return "torchrec's planner"
        counts: dict[str, int] = {}
        for t in self.types:
            counts[t] = counts.get(t, 0) + 1
        return ", ".join(f"{t} x{n}" for t, n in counts.items())


def provider_choice(check: Any, provider: str, num_tables: int) -> Choice | None:
    """The `sharding` and `compute_kernel` options of a built-in provider, checked with its other options
    (`check` is its `OptionCheck`, which collects the problems); None when the run is not sharded."""
    opts = check.options
    if opts.get("sharding") is None:
        if opts.get("compute_kernel") is not None:
            check.problems.append(f"compute_kernel={opts['compute_kernel']!r} (it is for sharded tables: give sharding=... too)")
        return None
    types, kernels, problems = check_options(opts["sharding"], opts.get("compute_kernel"), num_tables)
    check.problems.extend(problems)
    if not problems:
        require_group(provider)
    return Choice(types, kernels)
