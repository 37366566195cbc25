"""MkDocs hooks of the manual (mkdocs.manual.yml): pages generated from the code at build time, so they cannot drift.

- `<!-- cli-reference -->` becomes every `cbsite` subcommand's help, rendered from `cbsite.cli.build_parser()`.
- `<!-- plugin-options -->` becomes a table of the installed plugins and their declared options.
- `<!-- columns -->` becomes one line per column of components.parquet, in `cbsite.schema`'s order. A column
  without a line here (or a line for a column that no longer exists) is a warning, which `--strict` makes an error.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any, Callable

log = logging.getLogger("mkdocs.hooks.manual")

CLI_MARKER = "<!-- cli-reference -->"
COLUMNS_MARKER = "<!-- columns -->"
PLUGINS_MARKER = "<!-- plugin-options -->"
HELP_WIDTH = "80"  # argparse wraps to $COLUMNS: a fixed width makes the page the same on every machine

# One line per column of components.parquet. Keys must be exactly cbsite.schema.COMPONENTS_SCHEMA's names.
COLUMN_LINES: dict[str, str] = {
    "run_id": "the run, `YYYYMMDDTHHMMSSZ-xxxxxx` (UTC time + 6 hex), so runs sort by time",
    "model": "model name in the archive (`--model`, default the provider's name)",
    "version": "version name (`--version`; `auto` is the git short hash, `-dirty` when tracked files changed)",
    "path": "the torch FQN: `model.get_submodule(path)` returns the module; the root is `\"\"`",
    "parent": "the parent's path; null for the root",
    "name": "last segment of the path; `\"\"` for the root",
    "depth": "0 for the root, 1 for its children, ...",
    "module_type": "qualified class name of the module",
    "is_leaf": "true when the module has no child modules",
    "order": "pre-order index: stable sibling order, as `named_modules()` gives it",
    "call_count": "calls per forward of the whole model (a shared module counts every call)",
    "phase": "`forward` or `backward`",
    "status": "`measured`, `estimated` (sum of its children), `failed` or `skipped`",
    "error": "why the row failed or was skipped; null otherwise",
    "latency_ms": "median milliseconds per call, from timed blocks of about budget/20 (median of rounds' medians)",
    "latency_p25_ms": "25th percentile of the blocks behind the median",
    "latency_p75_ms": "75th percentile of the blocks behind the median",
    "samples": "calls timed behind the median",
    "cpu_time_ms": "process CPU time (all threads) per call, read around the same timed blocks",
    "device_time_ms": "CUDA-event time per call; null on CPU",
    "flops": "floating-point operations per call (2 per multiply-accumulate): FlopCounterMode plus cbsite's formulas",
    "tflops_per_s": "`flops / latency`, in TFLOP/s",
    "mfu": "`tflops_per_s` / the device's peak FLOP/s for the run's dtype (run.json `device`)",
    "bytes_moved": "roofline estimate: input + output bytes of every aten op per call (views move nothing)",
    "bandwidth_gbps": "`bytes_moved / latency`, in GB/s",
    "bandwidth_util": "`bandwidth_gbps` / the device's peak bandwidth; above 1 is normal for cache-resident data",
    "arithmetic_intensity": "`flops / bytes_moved`, FLOP per byte",
    "param_bytes": "bytes of the unique parameters and buffers of the subtree (tied weights once)",
    "param_count": "number of elements of those parameters and buffers",
    "peak_memory_bytes": "most bytes the phase's own allocations hold at once in one run of batch 0",
    "unsupported_ops": "ops met that have no FLOP formula: never a silent zero",
    "notes": "what an expert needs to read the row right (contention, twins, rules applied)",
    "input_shapes": "compact description of the replayed inputs",
    "compiled_latency_ms": "compile plugin: latency of the component under `torch.compile`",
    "compile_speedup": "compile plugin: eager latency / compiled latency",
    "compile_time_s": "compile plugin: seconds of the first compiled call, compilation included",
    "graph_breaks": "compile plugin: number of graph breaks",
    "graph_break_reasons": "compile plugin: why each graph break happened",
    "numerics_reference": "numerics plugin: what was compared, e.g. `eager float32 vs bfloat16`",
    "numerics_max_abs_err": "numerics plugin: largest absolute error of the outputs",
    "numerics_max_rel_err": "numerics plugin: largest relative error of the outputs",
    "numerics_ok": "numerics plugin: within the dtype-aware tolerance",
    "plugin_metrics": "any plugin's scalar metrics, named `<plugin>.<metric>`",
    "plugin_errors": "plugins that raised on this row, with their error (the run goes on)",
    "trace_file": "trace plugin: the Kineto trace, relative to the run folder",
    "memory_file": "memory plugin: the laid-out allocation timeline, relative to the run folder",
    "log_file": "log plugin: what the component printed or warned, relative to the run folder",
    "rank": "sharded runs: the rank whose figures the row holds (the slowest); null in a run of one process",
    "imbalance": "sharded runs: slowest rank's latency / mean over the ranks",
    "kind": "sharded runs: `compute` or `communication` (the component issues collectives)",
    "sharding_type": "sharded runs: of a sharded piece, e.g. `table_wise`, `row_wise`, `column_wise`",
    "collectives": "sharded runs: c10d ops of one replay with their counts, e.g. `c10d::alltoall_base_ x2`",
    "comm_bytes_sent": "sharded runs: bytes per call this rank hands its collectives",
    "comm_bytes_received": "sharded runs: bytes per call its collectives fill (its own share included)",
}


def render_cli(build_parser: Callable[[], argparse.ArgumentParser] | None = None) -> str:
    """Markdown of `cbsite --help` and of every subcommand's `--help`, in the parser's order."""
    if build_parser is None:
        from cbsite.cli import build_parser
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_WIDTH
    try:
        parser = build_parser()
        parts = ["```text", parser.format_help().rstrip(), "```", ""]
        for action in parser._subparsers._group_actions:  # argparse keeps subcommands only here
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                summary = (helps.get(name) or "").rstrip(".")
                parts += [f"## cbsite {name}", "", summary[:1].upper() + summary[1:] + ".", "",
                          "```text", sub.format_help().rstrip(), "```", ""]
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous
    return "\n".join(parts)


def render_columns() -> str:
    """A Markdown table: every column of components.parquet, its Arrow type and one line on what it holds."""
    from cbsite import schema

    names = schema.COMPONENTS_SCHEMA.names
    for name in names:
        if name not in COLUMN_LINES:
            log.warning("column %r of components.parquet has no line in docs/hooks/manual.py COLUMN_LINES: add one", name)
    for name in COLUMN_LINES:
        if name not in names:
            log.warning("COLUMN_LINES in docs/hooks/manual.py describes %r, which components.parquet no longer has", name)
    rows = ["| column | type | what it holds |", "| --- | --- | --- |"]
    for field in schema.COMPONENTS_SCHEMA:
        line = COLUMN_LINES.get(field.name, "(undocumented)").replace("|", "\\|")
        rows.append(f"| `{field.name}` | `{field.type}` | {line} |")
    return f"Schema version {schema.SCHEMA_VERSION}, {len(names)} columns (`cbsite/schema.py`).\n\n" + "\n".join(rows)


def render_plugin_options() -> str:
    """A Markdown table of every installed profiler, preprocessor and reporter plugin with its declared options."""
    from cbsite.collector.plugins.registry import SELECTABLE, available

    rows = ["| plugin | kind | what it does | options (default) |", "| --- | --- | --- | --- |"]
    for kind in SELECTABLE:
        for name, entry in sorted(available(kind).items()):
            cls = entry.load()
            options = "<br>".join(
                f"`{key}` ({option.default!r}){': ' + option.help if option.help else ''}"
                for key, option in (getattr(cls, "options", {}) or {}).items()) or "none"
            description = (getattr(cls, "description", "") or "").replace("|", "\\|")
            rows.append(f"| `{name}` | {kind[:-1]} | {description} | {options.replace('|', chr(92) + '|')} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, render_cli())
    if COLUMNS_MARKER in markdown:
        markdown = markdown.replace(COLUMNS_MARKER, render_columns())
    if PLUGINS_MARKER in markdown:
        markdown = markdown.replace(PLUGINS_MARKER, render_plugin_options())
    return markdown
