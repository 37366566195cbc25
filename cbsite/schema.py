"""The data contract: the single source of column names, their Arrow types and the run metadata.

Everything that reads or writes `components.parquet` or `run.json` takes names from here.
This module imports neither torch nor any site library.
"""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa

from cbsite.errors import CbsiteError

SCHEMA_VERSION = 3
# Version history (one migration per step in migration.MIGRATIONS):
#   1 -> 2: raw timing samples (samples.parquet) and the `samples` / `rounds` keys of run.json. Runs
#           written at version 1 kept no samples: they migrate with `samples: null` and say so; no
#           sample is ever invented for them.
#   2 -> 3: sharded runs (torchrun): the DISTRIBUTED_FIELDS columns, ranks.parquet (one row per rank) and
#           run.json's `distributed`. A run of one process migrates with those columns null and
#           `distributed: null`.

# Key under which run.json is embedded in the Parquet key-value metadata.
PARQUET_META_KEY = b"cbsite.run"

PHASES = ("forward", "backward")
STATUSES = ("measured", "estimated", "failed", "skipped")

# \A...\Z, not ^...$: `$` also matches before a final newline, so re.match would accept "dlrm\n".
NAME_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
RUN_ID_RE = re.compile(r"\A\d{8}T\d{6}Z-[0-9a-f]{6}\Z")

# Identity of a row: which component, in which run, in which phase.
IDENTITY_FIELDS: list[pa.Field] = [
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("model", pa.string(), nullable=False),
    pa.field("version", pa.string(), nullable=False),
    pa.field("path", pa.string(), nullable=False),  # torch FQN; root is ""
    pa.field("parent", pa.string()),  # null for the root
    pa.field("name", pa.string(), nullable=False),  # last path segment; "" for the root
    pa.field("depth", pa.int32(), nullable=False),
    pa.field("module_type", pa.string(), nullable=False),  # qualified class name
    pa.field("is_leaf", pa.bool_(), nullable=False),
    pa.field("order", pa.int32(), nullable=False),  # pre-order index
    pa.field("call_count", pa.int32(), nullable=False),  # calls per forward of the whole model
    pa.field("phase", pa.string(), nullable=False),
    pa.field("status", pa.string(), nullable=False),
    pa.field("error", pa.string()),
]

# Metrics are per call; null where not applicable or not measured.
METRIC_FIELDS: list[pa.Field] = [
    pa.field("latency_ms", pa.float64()),  # median
    pa.field("latency_p25_ms", pa.float64()),
    pa.field("latency_p75_ms", pa.float64()),
    pa.field("samples", pa.int64()),  # timed runs behind the median
    pa.field("cpu_time_ms", pa.float64()),
    pa.field("device_time_ms", pa.float64()),
    pa.field("flops", pa.int64()),
    pa.field("tflops_per_s", pa.float64()),
    pa.field("mfu", pa.float64()),
    pa.field("bytes_moved", pa.int64()),  # roofline estimate: inputs + outputs of every aten op
    pa.field("bandwidth_gbps", pa.float64()),
    pa.field("bandwidth_util", pa.float64()),
    pa.field("arithmetic_intensity", pa.float64()),  # flops / bytes_moved
    pa.field("param_bytes", pa.int64()),  # unique parameters and buffers of the subtree
    pa.field("param_count", pa.int64()),
    pa.field("peak_memory_bytes", pa.int64()),
    pa.field("unsupported_ops", pa.list_(pa.string())),  # ops without a FLOP formula
    # Free-text labels an expert needs to read a number right, e.g. that a dense embedding
    # gradient writes the whole table in backward. Added beside the design's columns.
    pa.field("notes", pa.list_(pa.string())),
    pa.field("input_shapes", pa.string()),  # compact description of the replayed inputs
]

# Filled by the built-in profiler plugins (null where the plugin did not run).
PLUGIN_FIELDS: list[pa.Field] = [
    # compile: the component alone under torch.compile, against its eager latency above
    pa.field("compiled_latency_ms", pa.float64()),
    pa.field("compile_speedup", pa.float64()),  # eager latency / compiled latency
    pa.field("compile_time_s", pa.float64()),  # first compiled call, compilation included
    pa.field("graph_breaks", pa.int32()),
    pa.field("graph_break_reasons", pa.list_(pa.string())),
    # numerics: the component's outputs under two configurations
    pa.field("numerics_reference", pa.string()),  # e.g. "eager float32 vs compiled"
    pa.field("numerics_max_abs_err", pa.float64()),
    pa.field("numerics_max_rel_err", pa.float64()),
    pa.field("numerics_ok", pa.bool_()),
    # any plugin's scalar metrics, named "<plugin>.<metric>", and plugins that failed on this row
    pa.field("plugin_metrics", pa.list_(pa.struct([("name", pa.string()), ("value", pa.float64())]))),
    pa.field("plugin_errors", pa.list_(pa.string())),
]

LINK_FIELDS: list[pa.Field] = [
    pa.field("trace_file", pa.string()),
    pa.field("memory_file", pa.string()),
    pa.field("log_file", pa.string()),
]

# Sharded runs (cbsite collect --distributed): null in a run of one process. In components.parquet a row holds
# the slowest rank's figures (the rank the step waits for); ranks.parquet holds every rank's row.
DISTRIBUTED_FIELDS: list[pa.Field] = [
    pa.field("rank", pa.int32()),  # the rank whose figures the row holds (not ops.parquet's `rank`, a position)
    pa.field("imbalance", pa.float64()),  # latency of the slowest rank / mean over the ranks
    pa.field("kind", pa.string()),  # "compute" | "communication" (issues collectives), for every row of a sharded run
    pa.field("sharding_type", pa.string()),  # of a sharded piece: table_wise, row_wise, column_wise, ...
    pa.field("collectives", pa.list_(pa.string())),  # c10d ops of one replay with their counts, e.g. "c10d::alltoall_base_ x2"
    pa.field("comm_bytes_sent", pa.int64()),  # per call: bytes this rank hands its collectives
    pa.field("comm_bytes_received", pa.int64()),  # per call: bytes its collectives fill (its own share included)
]

COMPONENTS_SCHEMA = pa.schema(IDENTITY_FIELDS + METRIC_FIELDS + PLUGIN_FIELDS + LINK_FIELDS + DISTRIBUTED_FIELDS)
COLUMNS: list[str] = COMPONENTS_SCHEMA.names

# ops.parquet: the top operators (and kernels on GPU) per component and phase, from the ops plugin.
OPS_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("version", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("phase", pa.string(), nullable=False),
        pa.field("rank", pa.int32(), nullable=False),  # 1 = largest self CPU (or device) time
        pa.field("op", pa.string(), nullable=False),  # aten op or kernel name
        pa.field("kind", pa.string(), nullable=False),  # "op" | "kernel"
        pa.field("calls", pa.int64()),  # per call of the component
        pa.field("cpu_time_ms", pa.float64()),  # self CPU time per call of the component
        pa.field("device_time_ms", pa.float64()),
        pa.field("flops", pa.int64()),
        pa.field("share", pa.float64()),  # of the component's total self time over all ops
    ]
)
OPS_COLUMNS: list[str] = OPS_SCHEMA.names

# samples.parquet: every timed block behind a run's (or a comparison's) latencies. Medians, intervals
# and verdicts are derived from these rows, never the other way round.
SAMPLES_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),  # the run this arm's blocks belong to
        pa.field("model", pa.string(), nullable=False),
        pa.field("version", pa.string(), nullable=False),
        pa.field("session_id", pa.string(), nullable=False),  # the measurement session (= run id of a plain run)
        pa.field("path", pa.string(), nullable=False),  # component path in this arm's model
        pa.field("key", pa.string(), nullable=False),  # aligned component key of a comparison (the head path)
        pa.field("phase", pa.string(), nullable=False),
        pa.field("process", pa.int32(), nullable=False),  # 0 = the collecting process; 1.. = fresh workers
        pa.field("round", pa.int32(), nullable=False),  # repetition the block belongs to (= process here)
        pa.field("pair", pa.int32(), nullable=False),  # A/B block pair within the process (block index for one arm)
        pa.field("arm", pa.string(), nullable=False),  # "run" | "base" | "head"
        pa.field("position", pa.int8(), nullable=False),  # order within the pair: 0 first, 1 second
        pa.field("seconds_per_call", pa.float64(), nullable=False),
        pa.field("calls", pa.int64(), nullable=False),  # calls of the component in the block
        pa.field("start_s", pa.float64(), nullable=False),  # wall-clock start, epoch seconds
        pa.field("wait_s", pa.float64(), nullable=False),  # seconds the process waited for a CPU in the block
        pa.field("contended", pa.bool_(), nullable=False),  # waited long enough to be left out of medians
    ]
)
SAMPLES_COLUMNS: list[str] = SAMPLES_SCHEMA.names

# Metrics that add up across children (per call x call_count); the rest are ratios or maxima.
ADDITIVE_METRICS = ("latency_ms", "cpu_time_ms", "device_time_ms", "flops", "bytes_moved")
# Static metrics are exact for every module, callable or not, and are never estimated.
STATIC_METRICS = ("param_bytes", "param_count")

# Metadata keys every run.json has.
REQUIRED_META_KEYS = (
    "schema_version",
    "run_id",
    "model",
    "version",
    "created_at",
    "versions",
    "device",
    "dtype",
    "provider",
    "config",
    "preprocessing",
    "inputs",
    "git",
    "tags",
    "notes",
    "wall_time_s",
    "counts",
)


# The JSON types of the metadata every reader indexes into (the site and the CLI read the rest defensively).
META_TYPES: dict[str, tuple[type, ...]] = {
    "schema_version": (int,),
    "run_id": (str,),
    "model": (str,),
    "version": (str,),
    "created_at": (str,),
    "versions": (dict,),
    "device": (dict,),
    "dtype": (str,),
    "provider": (dict,),
    "config": (dict,),
    "preprocessing": (list,),
    "inputs": (dict,),
    "git": (dict, type(None)),
    "tags": (list,),
    "notes": (str,),
    "wall_time_s": (int, float, type(None)),
    "counts": (dict,),
}
_JSON_NAMES = {int: "a number", float: "a number", str: "a string", dict: "an object", list: "a list", type(None): "null"}


def check_name(kind: str, value: str) -> str:
    """Refuse a model or version name that is not safe as one path segment on any file system."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise CbsiteError(
            f"invalid {kind} name {value!r}: use 1-64 characters from letters, digits, '.', '_' "
            f"and '-', starting with a letter or digit (e.g. 'dlrm' or 'v2.1')"
        )
    return value


def check_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """Check that run metadata has every required key and valid names."""
    if not isinstance(meta, dict):
        raise CbsiteError(f"run metadata is a {type(meta).__name__}, not a mapping; was it written by cbsite?")
    missing = [k for k in REQUIRED_META_KEYS if k not in meta]
    if missing:
        raise CbsiteError(f"run metadata is missing {', '.join(missing)}; was it written by cbsite?")
    wrong = [
        f"{key} is {_JSON_NAMES.get(type(meta[key]), type(meta[key]).__name__)}, not "
        + " or ".join(dict.fromkeys(_JSON_NAMES[t] for t in types))
        for key, types in META_TYPES.items()
        if not isinstance(meta[key], types) or (type(meta[key]) is bool and bool not in types)
    ]
    if wrong:
        raise CbsiteError(f"run metadata has wrong types: {'; '.join(wrong)}")
    bad_counts = [k for k, v in meta["counts"].items() if type(v) is not int]
    if bad_counts:
        raise CbsiteError(f"run metadata has wrong types: counts[{bad_counts[0]!r}] is not a whole number")
    check_name("model", meta["model"])
    check_name("version", meta["version"])
    if not isinstance(meta["run_id"], str) or not RUN_ID_RE.fullmatch(meta["run_id"]):
        raise CbsiteError(f"invalid run id {meta['run_id']!r}: expected YYYYMMDDTHHMMSSZ-xxxxxx")
    return meta


def empty_row() -> dict[str, Any]:
    """A row with every column present and null, so writers fill in only what they know."""
    return {name: None for name in COLUMNS}
