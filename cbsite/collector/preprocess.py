"""Optional steps between the provider and the capture, each recorded in run.json's `preprocessing`.

- `shrink_hash_sizes`: make torchrec embedding tables fit one device, ids remapped into range.
- `replicate_batch`: grow a small captured batch to the target batch size, keeping its distribution.
- `describe_inputs`: the structure and shapes of an example batch, for run.json's `inputs`.

Every step returns a record `{"name", "parameters", "changed"}`; a run with its records says exactly
how the profiled model and inputs differ from what the provider gave.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections import Counter
from typing import Any, Callable

import torch
from torch import nn

from cbsite.collector.providers import Inputs
from cbsite.errors import CbsiteError

Record = dict[str, Any]


def _kjt_type() -> type[Any] | None:
    """torchrec's KeyedJaggedTensor if torchrec is loaded, else None.

    torchrec takes seconds to import and a transformer user may not have it; and an input can only be
    a KeyedJaggedTensor if torchrec was imported to make it. So look, never import.
    """
    module = sys.modules.get("torchrec.sparse.jagged_tensor")
    return getattr(module, "KeyedJaggedTensor", None)


# --------------------------------------------------------------------------------------------------
# Walking an example batch


def _map_leaves(obj: Any, fn: Callable[[Any, str], Any], path: str) -> Any:
    """Rebuild `obj` with every leaf replaced by `fn(leaf, path)`, through tuples, lists and dicts.

    Leaves are tensors, KeyedJaggedTensors and anything that is not one of those containers. Paths
    read like Python: `args[1]`, `kwargs['features'][0]`.
    """
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple rebuilds from fields
        return type(obj)(*(_map_leaves(v, fn, f"{path}[{i}]") for i, v in enumerate(obj)))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_map_leaves(v, fn, f"{path}[{i}]") for i, v in enumerate(obj))
    if isinstance(obj, dict):
        return type(obj)((k, _map_leaves(v, fn, f"{path}[{k!r}]")) for k, v in obj.items())
    return fn(obj, path)


def _map_inputs(inputs: Inputs, fn: Callable[[Any, str], Any]) -> Inputs:
    args = tuple(_map_leaves(a, fn, f"args[{i}]") for i, a in enumerate(inputs.args))
    kwargs = {k: _map_leaves(v, fn, f"kwargs[{k!r}]") for k, v in inputs.kwargs.items()}
    return Inputs(args=args, kwargs=kwargs)


def _leaves(inputs: Inputs) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []

    def keep(leaf: Any, path: str) -> Any:
        found.append((path, leaf))
        return leaf

    _map_inputs(inputs, keep)
    return found


def _per_key(kjt: Any) -> list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """(key, lengths, values, weights) of each key of a fixed-stride KeyedJaggedTensor."""
    stride = kjt.stride()
    lengths = kjt.lengths().split(stride)
    values = kjt.values().split(kjt.length_per_key())
    weights = kjt.weights_or_none()
    weights = weights.split(kjt.length_per_key()) if weights is not None else [None] * len(values)
    return list(zip(kjt.keys(), lengths, values, weights))


# --------------------------------------------------------------------------------------------------
# shrink_hash_sizes


def shrink_hash_sizes(
    model: nn.Module,
    inputs: list[Inputs],
    *,
    factor: float | None = None,
    cap: int | None = None,
) -> tuple[nn.Module, list[Inputs], Record]:
    """Shrink every torchrec embedding table, by `factor` (size / factor, rounded up) or to `cap` rows.

    Production tables can need terabytes; shrunk, the model profiles on one device while every
    lookup, pooling and MLP keeps its shape (only the table's row count changes). Each
    EmbeddingBagCollection / EmbeddingCollection is rebuilt from its configs with the new row counts
    and put back under the same name, so FQNs, embedding dims and feature names are unchanged; the
    first rows of the old weights are kept. Ids of the features those tables serve are remapped
    (`id % new_size`) in every KeyedJaggedTensor of `inputs`, which keeps the power-law shape of
    the traffic (hot ids stay distinct when the table keeps more rows than there are hot ids).

    The model is changed in place and returned; `inputs` are returned as new objects.
    """
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    new_size = _shrink_rule(factor, cap)
    rebuilt: dict[int, nn.Module] = {}
    tables: dict[str, dict[str, int]] = {}
    feature_sizes: dict[str, int] = {}
    for path, module in model.named_modules():
        if not isinstance(module, (EmbeddingBagCollection, EmbeddingCollection)):
            continue
        if type(module) not in (EmbeddingBagCollection, EmbeddingCollection):
            raise CbsiteError(
                f"cannot shrink {path or '<root>'}: {type(module).__qualname__} is a subclass of a torchrec "
                f"embedding collection whose constructor cbsite does not know; shrink its tables in your provider"
            )
        new_module, sizes, features = _rebuild_collection(module, new_size)
        rebuilt[id(module)] = new_module
        table_dict = "embedding_bags" if isinstance(module, EmbeddingBagCollection) else "embeddings"
        for table, (before, after) in sizes.items():
            tables[".".join(p for p in (path, table_dict, table) if p)] = {"before": before, "after": after}
        for feature, size in features.items():
            # A feature read by several tables must fit the smallest of them.
            feature_sizes[feature] = min(size, feature_sizes.get(feature, size))
    if not rebuilt:
        raise CbsiteError(
            "shrinking hash sizes needs torchrec EmbeddingBagCollection or EmbeddingCollection tables, "
            "and this model has none; drop the shrink option"
        )
    model = _swap_modules(model, rebuilt)

    remapped: list[str] = []
    kjt_type = _kjt_type()

    def remap(leaf: Any, path: str) -> Any:
        if kjt_type is None or not isinstance(leaf, kjt_type):
            return leaf
        if not any(k in feature_sizes for k in leaf.keys()):
            return leaf
        if path not in remapped:
            remapped.append(path)
        return _remap_kjt(leaf, feature_sizes)

    new_inputs = [_map_inputs(batch, remap) for batch in inputs]
    record = {
        "name": "shrink_hash_sizes",
        "parameters": {"factor": factor, "cap": cap},
        "changed": {
            "tables": tables,
            "remapped_features": sorted(feature_sizes),
            "remapped_inputs": remapped,
        },
    }
    return model, new_inputs, record


def _shrink_rule(factor: float | None, cap: int | None) -> Callable[[int], int]:
    if (factor is None) == (cap is None):
        raise CbsiteError("shrinking hash sizes takes exactly one of factor (e.g. 100) or cap (e.g. 100000)")
    if factor is not None:
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor >= 1 or math.isinf(factor):
            raise CbsiteError(f"shrink factor {factor!r}: use a finite number >= 1 (table rows are divided by it)")
        return lambda n: max(1, math.ceil(n / factor))
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise CbsiteError(f"shrink cap {cap!r}: use a positive integer number of rows")
    return lambda n: min(n, cap)


def _rebuild_collection(
    module: nn.Module, new_size: Callable[[int], int]
) -> tuple[nn.Module, dict[str, tuple[int, int]], dict[str, int]]:
    """A new collection of the same kind with shrunk configs; (module, table sizes, feature sizes)."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    if isinstance(module, EmbeddingBagCollection):
        configs = module.embedding_bag_configs()
        shrunk = _shrunk_configs(configs, new_size)
        new = EmbeddingBagCollection(tables=shrunk, is_weighted=module.is_weighted(), device=module.device)
        old_tables, new_tables = module.embedding_bags, new.embedding_bags
    else:
        assert isinstance(module, EmbeddingCollection)
        configs = module.embedding_configs()
        shrunk = _shrunk_configs(configs, new_size)
        new = EmbeddingCollection(
            tables=shrunk,
            device=module.device,
            need_indices=module.need_indices(),
            use_gather_select=module.use_gather_select(),
            use_gather_select_per_sharding=module.use_gather_select_per_sharding(),
        )
        old_tables, new_tables = module.embeddings, new.embeddings
    with torch.no_grad():
        for name, table in new_tables.items():
            old_weight = old_tables[name].weight
            if old_weight.device.type != "meta":  # a meta table has no values to keep
                table.weight.copy_(old_weight[: table.weight.shape[0]])
            table.weight.requires_grad_(old_weight.requires_grad)
    new.train(module.training)
    sizes = {c.name: (c.num_embeddings, s.num_embeddings) for c, s in zip(configs, shrunk)}
    features = {f: s.num_embeddings for s in shrunk for f in s.feature_names}
    return new, sizes, features


def _shrunk_configs(configs: list[Any], new_size: Callable[[int], int]) -> list[Any]:
    # Copies, so the old module's configs (and any caller holding them) keep their sizes.
    return [
        dataclasses.replace(c, num_embeddings=new_size(c.num_embeddings), feature_names=list(c.feature_names))
        for c in configs
    ]


def _swap_modules(model: nn.Module, replacements: dict[int, nn.Module]) -> nn.Module:
    """Put each replacement wherever the old module hangs, under every parent that holds it."""
    if id(model) in replacements:
        return replacements[id(model)]
    for parent in model.modules():
        for name, child in list(parent._modules.items()):
            if child is not None and id(child) in replacements:
                parent._modules[name] = replacements[id(child)]
    return model


def _remap_kjt(kjt: Any, feature_sizes: dict[str, int]) -> Any:
    """The same KeyedJaggedTensor with each listed feature's ids taken modulo its table size."""
    values = kjt.values().split(kjt.length_per_key())
    new_values = torch.cat([v % feature_sizes[k] if k in feature_sizes else v for k, v in zip(kjt.keys(), values)])
    variable = kjt.variable_stride_per_key()
    # Only the values change: keep lengths, offsets, weights and the cached per-key splits.
    return type(kjt)(
        keys=kjt.keys(),
        values=new_values,
        weights=kjt.weights_or_none(),
        lengths=kjt.lengths(),
        offsets=kjt.offsets(),
        stride=None if variable else kjt.stride(),
        stride_per_key_per_rank=kjt.stride_per_key_per_rank() if variable else None,
        length_per_key=kjt.length_per_key(),
        offset_per_key=kjt.offset_per_key(),
        inverse_indices=kjt.inverse_indices_or_none(),
    )


# --------------------------------------------------------------------------------------------------
# replicate_batch


def replicate_batch(
    inputs: list[Inputs], target_batch_size: int, *, batch_size: int | None = None
) -> tuple[list[Inputs], Record]:
    """Grow each example batch to `target_batch_size` samples by repeating it, then cutting.

    Capturing with a small batch is cheap; profiling wants the production batch size. Tensors whose
    dim 0 is the batch size are tiled along dim 0; KeyedJaggedTensors are tiled per key (each key's
    lengths and the matching ids and weights), so pooling factors and the id distribution are those of
    the captured batch. Anything else (scalars, lookup tables, non-tensors, variable-stride KJTs) is
    left as it is and listed in the record.

    The batch size is the most common dim 0 among the tensors and KJT strides of a batch (ties go to
    the first seen), unless `batch_size` is given.
    """
    if isinstance(target_batch_size, bool) or not isinstance(target_batch_size, int) or target_batch_size < 1:
        raise CbsiteError(f"target batch size {target_batch_size!r}: use a positive integer")
    kjt_type = _kjt_type()
    out: list[Inputs] = []
    sources: list[int] = []
    replicated: list[str] = []
    untouched: list[str] = []
    for batch in inputs:
        source = batch_size if batch_size is not None else _detect_batch_size(batch, kjt_type)
        if target_batch_size < source:
            raise CbsiteError(
                f"target batch size {target_batch_size} is smaller than the captured batch ({source}); "
                f"capture with a batch of at most {target_batch_size}, or raise the target"
            )
        sources.append(source)
        if target_batch_size == source:
            out.append(batch)
            continue
        reps = math.ceil(target_batch_size / source)

        def tile(leaf: Any, path: str, source: int = source, reps: int = reps) -> Any:
            if isinstance(leaf, torch.Tensor) and leaf.dim() > 0 and leaf.shape[0] == source:
                _note(replicated, path)
                return _tile_tensor(leaf, reps, target_batch_size)
            if _is_fixed_stride_kjt(leaf, kjt_type) and leaf.stride() == source:
                _note(replicated, path)
                return _tile_kjt(leaf, reps, target_batch_size)
            _note(untouched, path)
            return leaf

        out.append(_map_inputs(batch, tile))
    record = {
        "name": "replicate_batch",
        "parameters": {"target_batch_size": target_batch_size, "batch_size": batch_size},
        "changed": {
            "batch_size": {
                "before": sources[0] if len(set(sources)) == 1 else sources,
                "after": target_batch_size,
            },
            "replicated_inputs": replicated,
            "untouched_inputs": untouched,
        },
    }
    return out, record


def _note(paths: list[str], path: str) -> None:
    if path not in paths:
        paths.append(path)


def _is_fixed_stride_kjt(leaf: Any, kjt_type: type[Any] | None) -> bool:
    # A variable-stride KJT has a batch size per key (and per rank): no single dim to tile.
    return kjt_type is not None and isinstance(leaf, kjt_type) and not leaf.variable_stride_per_key()


def batch_size_of(batch: Inputs) -> int | None:
    """The batch size of an example batch (the most common dim 0), or None when nothing has one."""
    try:
        return _detect_batch_size(batch, _kjt_type())
    except CbsiteError:
        return None


def _detect_batch_size(batch: Inputs, kjt_type: type[Any] | None) -> int:
    candidates: list[int] = []
    for _, leaf in _leaves(batch):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            candidates.append(leaf.shape[0])
        elif _is_fixed_stride_kjt(leaf, kjt_type):
            candidates.append(leaf.stride())
    if not candidates:
        raise CbsiteError(
            "cannot replicate the batch: its inputs hold no tensor with a batch dimension; drop the target batch size"
        )
    return Counter(candidates).most_common(1)[0][0]


def _tile_tensor(t: torch.Tensor, reps: int, target: int) -> torch.Tensor:
    tiled = t.detach().repeat(reps, *([1] * (t.dim() - 1)))[:target].contiguous()
    return tiled.requires_grad_(t.requires_grad)  # a replicated grad leaf stays a grad leaf


def _tile_kjt(kjt: Any, reps: int, target: int) -> Any:
    """Each key's samples repeated `reps` times and cut to `target`; ids and weights follow lengths."""
    lengths, values, weights = [], [], []
    for _, key_lengths, key_values, key_weights in _per_key(kjt):
        new_lengths = key_lengths.repeat(reps)[:target]
        count = int(new_lengths.sum())
        lengths.append(new_lengths)
        values.append(key_values.repeat(reps)[:count])
        if key_weights is not None:
            weights.append(key_weights.repeat(reps)[:count])
    return type(kjt).from_lengths_sync(
        keys=kjt.keys(),
        values=torch.cat(values) if values else kjt.values(),
        lengths=torch.cat(lengths) if lengths else kjt.lengths(),
        weights=torch.cat(weights) if weights else None,
    )


# --------------------------------------------------------------------------------------------------
# describe_inputs


def describe_inputs(inputs: Inputs) -> dict[str, Any]:
    """JSON-serialisable structure of one example batch: shapes and dtypes, KJT keys and pooling."""
    kjt_type = _kjt_type()

    def describe(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return {"type": "tensor", "shape": list(obj.shape), "dtype": str(obj.dtype).removeprefix("torch.")}
        if kjt_type is not None and isinstance(obj, kjt_type):
            return _describe_kjt(obj)
        if isinstance(obj, (tuple, list)):
            return {"type": type(obj).__name__, "items": [describe(v) for v in obj]}
        if isinstance(obj, dict):
            return {"type": "dict", "items": {str(k): describe(v) for k, v in obj.items()}}
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return {"type": type(obj).__name__, "value": obj}
        return {"type": f"{type(obj).__module__}.{type(obj).__qualname__}"}

    return {
        "args": [describe(a) for a in inputs.args],
        "kwargs": {k: describe(v) for k, v in inputs.kwargs.items()},
    }


def _describe_kjt(kjt: Any) -> dict[str, Any]:
    desc: dict[str, Any] = {
        "type": "KeyedJaggedTensor",
        "keys": list(kjt.keys()),
        "values": int(kjt.values().numel()),
        "dtype": str(kjt.values().dtype).removeprefix("torch."),
        "weighted": kjt.weights_or_none() is not None,
    }
    if kjt.variable_stride_per_key():
        desc["stride_per_key"] = dict(zip(kjt.keys(), kjt.stride_per_key()))
        strides = kjt.stride_per_key()
    else:
        desc["stride"] = kjt.stride()
        strides = [kjt.stride()] * len(kjt.keys())
    desc["mean_pooling"] = {
        k: round(n / s, 4) if s else 0.0 for k, n, s in zip(kjt.keys(), kjt.length_per_key(), strides)
    }
    return desc
