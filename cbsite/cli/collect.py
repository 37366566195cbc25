"""The commands that collect runs: `collect` (one model, or one rank under torchrun) and `sweep` (a study), with
the collection options they share with `compare` and `demo`, grouped as `--help` shows them."""

from __future__ import annotations

import argparse
import contextlib
import json
from dataclasses import dataclass
from typing import Any, Sequence

from cbsite.cli.common import add_command, note_stale, parse_options, parse_value, require, staging_in, verbosity
from cbsite.cli.completion import completes, plugin_names, provider_names
from cbsite.cli.runview import print_run
from cbsite.errors import CbsiteError

PROVIDER_HELP = "dlrm | deepfm | dlrm-synthetic | nanogpt | package.module:function"


@dataclass(frozen=True)
class Groups:
    """The option groups of a collecting command, so that each command adds its own options where they belong."""

    model: Any
    selection: Any
    timing: Any
    output: Any


def collect_groups(p: argparse.ArgumentParser) -> Groups:
    """The option groups of a collecting command, in the order --help shows them."""
    return Groups(p.add_argument_group("model and inputs"), p.add_argument_group("selection"),
                  p.add_argument_group("timing"), p.add_argument_group("output"))


def add_collect_args(groups: Groups) -> Groups:
    """The collection options of collect, compare, sweep and demo, in their groups: selection, timing, output."""
    s = groups.selection
    s.add_argument("--max-depth", type=int, default=None, help="deepest component level to measure (default: all)")
    s.add_argument("--include", action="append", default=[], help="glob on path or module type; repeatable")
    s.add_argument("--exclude", action="append", default=[], help="glob on path or module type; repeatable")
    s.add_argument("--phases", default="forward,backward", help="phases to measure, comma-separated")
    s.add_argument("--no-step", action="store_true",
                   help="skip the whole model's training step and eval forward (step throughput in run.json)")
    s.add_argument("--count-every-twin", action="store_true",
                   help="count FLOPs, bytes and peak memory of every component, also of twins (identical modules on "
                        "inputs of the same shapes, e.g. GPT-2's 12 blocks), which by default take the first one's counts")
    completes(s.add_argument("--plugin", action="append", default=[],
                             help="profiler/preprocessor/reporter plugin by name, e.g. trace, ops, log, compile; "
                                  "repeatable (replaces the list of [tool.cbsite] in pyproject.toml or cbsite.toml)"),
              plugin_names)
    s.add_argument("--plugin-option", action="append", default=[], metavar="PLUGIN.KEY=VALUE",
                   help="plugin option, e.g. compile.mode=max-autotune; repeatable")
    t = groups.timing
    t.add_argument("--budget", type=float, default=0.1, help="seconds of timed runs per component and phase")
    t.add_argument("--rounds", type=int, default=1,
                   help="repeat the timing in this many processes (the collecting one, then fresh workers) so the "
                        "run carries its run-to-run noise; gates judge latency only with 2 or more")
    t.add_argument("--threads", type=int, default=None,
                   help="intra-op threads (default on CPU: 1, the honest choice on shared machines; manual: Latency verdicts)")
    t.add_argument("--max-component-s", type=float, default=None,
                   help="wall seconds one component and phase may spend in timing (default: 20x --budget, at least 5)")
    t.add_argument("--device", default="cpu", help="torch device to measure on, e.g. cpu, cuda, cuda:1")
    t.add_argument("--dtype", default="float32", help="dtype of the model and its inputs, e.g. bfloat16")
    t.add_argument("--peak-flops", type=float, default=None,
                   help="peak FLOP/s used for MFU (default: the device table on GPU, calibrated on CPU)")
    t.add_argument("--peak-bandwidth", type=float, default=None,
                   help="peak bytes/s used for bandwidth utilisation (default: table on GPU, calibrated on CPU)")
    t.add_argument("--no-calibrate", action="store_true",
                   help="with both --peak-flops and --peak-bandwidth: no CPU calibration at the start and end of the "
                        "run, so no drift check either (run.json `calibration` says so)")
    t.add_argument("--memory-limit", default=None, metavar="SIZE",
                   help="most memory the collecting process may hold on CPU, e.g. 20GB (default: 90%% of what is "
                        "available at the start); a component that needs more fails as 'out of memory', its "
                        "children are measured and it is estimated from them")
    groups.output.add_argument("--no-progress", action="store_true", help="no progress bar or progress lines")
    return groups


def add_run_identity(g: Any) -> None:
    """Options that shape the example inputs and label a run, for collect and sweep."""
    g.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                   help="provider option, e.g. -o embedding_dim=32 (JSON values where they parse); repeatable")
    g.add_argument("--batches", type=int, default=3, help="distinct example batches replayed in rotation")
    g.add_argument("--seed", type=int, default=0, help="seed of the model's weights and the example batches")
    g.add_argument("--shrink-factor", type=float, default=None, help="divide embedding hash sizes by this")
    g.add_argument("--shrink-cap", type=int, default=None, help="cap embedding hash sizes at this many rows")
    g.add_argument("--batch-size", type=int, default=None, help="replicate the example batch to this size")


def add_labels(g: Any) -> None:
    g.add_argument("--tag", action="append", default=[], help="a tag recorded in run.json; repeatable")
    g.add_argument("--notes", default="", help="free text recorded in run.json")


def plugin_selection(args: argparse.Namespace, default: Sequence[str] = (),
                     default_options: dict[str, dict[str, Any]] | None = None) -> tuple[tuple[str, ...], dict[str, dict[str, Any]]]:
    """Plugins and options from the configuration file found from the working directory, then the CLI."""
    from pathlib import Path

    from cbsite.collector.plugins.registry import merged_selection, parse_option_pairs

    cli_options = parse_option_pairs(args.plugin_option, parse_value)
    names, options, _ = merged_selection(args.plugin or list(default), cli_options, Path.cwd())
    if not args.plugin and default:  # the demo's defaults: file options apply only to plugins it selects
        options = {k: v for k, v in options.items() if k in names}
        for name, values in (default_options or {}).items():
            options[name] = {**values, **options.get(name, {})}
    return tuple(names), options


def collect_config(args: argparse.Namespace, plugins: tuple[tuple[str, ...], dict[str, dict[str, Any]]] | None = None) -> Any:
    """The CollectConfig of the collection options."""
    from cbsite.collector import CollectConfig
    from cbsite.collector.memory import parse_size

    names, options = plugins if plugins is not None else plugin_selection(args)
    return CollectConfig(
        plugins=names,
        plugin_options=options,
        max_depth=args.max_depth,
        include=tuple(args.include),
        exclude=tuple(args.exclude),
        phases=tuple(p.strip() for p in args.phases.split(",") if p.strip()),
        min_run_time=args.budget,
        device=args.device,
        dtype=args.dtype,
        peak_flops=args.peak_flops,
        peak_bandwidth=args.peak_bandwidth,
        calibrate=not _no_calibrate(args),
        num_threads=args.threads,
        step=not args.no_step,
        count_twins_once=not getattr(args, "count_every_twin", False),
        rounds=args.rounds,
        max_component_s=args.max_component_s,
        memory_limit=None if getattr(args, "memory_limit", None) is None else parse_size(args.memory_limit),
        # A bar on a terminal, occasional lines in a log; none with -q.
        progress=not args.no_progress and verbosity(args) >= 0,
    )


def _no_calibrate(args: argparse.Namespace) -> bool:
    """--no-calibrate, refused without both peaks: MFU and bandwidth utilisation would have no denominator."""
    if not getattr(args, "no_calibrate", False):
        return False
    missing = [flag for flag, value in (("--peak-flops", args.peak_flops), ("--peak-bandwidth", args.peak_bandwidth))
               if value is None]
    if missing:
        raise CbsiteError(f"--no-calibrate needs both peaks: give {' and '.join(missing)} too (e.g. --peak-flops 1e11 "
                          "--peak-bandwidth 1e10), or leave --no-calibrate out to calibrate the CPU's peaks")
    return True


def collect_request(args: argparse.Namespace) -> Any:
    """The CollectRequest of `cbsite collect`'s arguments."""
    from cbsite.collector.request import CollectRequest, Preprocessing
    from cbsite.provenance import git_state

    version = args.version
    if version == "auto":
        git = git_state()
        if git is None:
            raise CbsiteError("--version auto needs a git work tree here; give a version name instead")
        version = git["short"] + ("-dirty" if git["dirty"] else "")
    return CollectRequest(
        provider=args.provider,
        options=parse_options(args.option),
        model_name=args.model,
        version=version,
        batches=args.batches,
        seed=args.seed,
        preprocessing=Preprocessing(args.shrink_factor, args.shrink_cap, args.batch_size),
        config=collect_config(args),
        tags=tuple(args.tag),
        notes=args.notes,
    )


def show_saved(run: Any, args: argparse.Namespace, path: Any, suffix: str = "") -> None:
    if verbosity(args) >= 0:
        print_run(run, top=args.top, verbosity=verbosity(args))
    print(f"saved {path}{suffix}")


def cmd_collect(args: argparse.Namespace) -> int:
    from cbsite.collector.providers import needs

    # Before the calibration worker starts: a missing torch (or torchrec for dlrm) is one line, not a traceback.
    require("torch", *needs(args.provider))
    # No torch in either: the worker starts before torch is imported here.
    from cbsite.collector.clean_worker import kept_worker
    from cbsite.collector.cpu_plan import DEFAULT_CPU_THREADS, start_job

    if args.distributed:
        return _collect_distributed(args, collect_request(args))
    # A CPU collection calibrates in a clean worker: started now, with its start calibration as its first job, so that
    # its interpreter, its torch import and the calibration run beside this process's imports and the model's build,
    # and the collection waits for less of it (device.start_calibration takes that job).
    calibrates = args.device == "cpu" and not _no_calibrate(args)
    first = start_job(args.dtype, args.threads or DEFAULT_CPU_THREADS) if calibrates else None
    with kept_worker(start_now=True, first=first) if calibrates else contextlib.nullcontext():
        from cbsite.collector.collect import collect

        note_stale(args.runs)
        with staging_in(args.runs):
            run = collect(collect_request(args))
    # Saved once the worker is gone: a collection killed while saving leaves no process of its own behind (an
    # orphaned worker held the caller's pipes open).
    show_saved(run, args, run.save(args.runs))
    return 0


def _collect_distributed(args: argparse.Namespace, request: Any) -> int:
    """One rank of `torchrun ... -m cbsite collect ... --distributed`: rank 0 saves the one run, atomically."""
    from dataclasses import replace

    from cbsite.collector.distributed.collect import collect_distributed
    from cbsite.collector.distributed.group import close, init

    group = init(args.device, args.dist_timeout)
    try:
        if group.rank != 0:  # one progress display and one summary: rank 0's
            request = replace(request, config=replace(request.config, progress=False))
        with staging_in(args.runs):
            run = collect_distributed(request, group)
        if run is not None:
            show_saved(run, args, run.save(args.runs), f" ({group.world_size} ranks)")
    finally:
        close()
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    """Collect one run per point of a grid of provider options (a study); --list prints the points only."""
    import re

    from cbsite import study as cstudy

    name = args.study or re.sub(r"[^A-Za-z0-9._-]", "-", f"{args.provider}-study").lstrip("._-")[:64]
    sweep = cstudy.Study.from_grid(name, args.provider, args.grid, base_options=parse_options(args.option),
                                   zip_axes=args.zip, model=args.model)
    selected = cstudy.select(sweep.points, args.k)
    if args.list:
        done = cstudy.done_points(args.runs, sweep) if args.runs.is_dir() else {}
        print(f"{sweep.describe()}; {len(selected)} selected" + (f" by -k {args.k!r}" if args.k else ""))
        for p in selected:
            options = " ".join(f"{k}={json.dumps(v)}" for k, v in p.options.items())
            print(f"  {p.label}  {options}" + ("  (done)" if p.label in done else ""))
        return 0
    if not selected:
        raise CbsiteError(f"-k {args.k!r} selects none of the {len(sweep.points)} points; see them with --list")
    from cbsite.collector.providers import needs

    require("torch", *needs(args.provider))
    from cbsite.collector.executors import run_sweep
    from cbsite.collector.request import CollectRequest, Preprocessing

    config = collect_config(args)
    config = type(config)(**{**config.__dict__, "progress": False})  # points run in workers: one line each
    request = CollectRequest(provider=args.provider, batches=args.batches, seed=args.seed,
                             preprocessing=Preprocessing(args.shrink_factor, args.shrink_cap, args.batch_size),
                             config=config, tags=tuple(args.tag), notes=args.notes)
    note_stale(args.runs)
    quiet = verbosity(args) < 0
    record = run_sweep(sweep, selected, args.runs, request, executor=args.executor, workers=args.workers,
                       options=parse_options(args.executor_option), pin=not args.no_pin, expression=args.k,
                       say=lambda line: None if quiet else print(line, flush=True))
    chosen = {p.label for p in selected}
    failed = [e for e in record["points"] if e["label"] in chosen and e["status"] == "failed"]
    finished = [e for e in record["points"] if e["label"] in chosen and e["status"] == "done"]
    print(f"study {sweep.name}: {len(finished)} of {len(selected)} selected points done, {len(failed)} failed "
          f"(record: {cstudy.folder(args.runs, sweep.name) / cstudy.STUDY_JSON})")
    return 1 if failed else 0


def add_parsers(sub: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    p = add_command(sub, "collect", "profile every submodule of a model into the archive",
                    "Profile every submodule of a model, forward and backward, each replayed alone from its captured "
                    "inputs, and save the run into the archive. Exit status: 0 saved (failed components are results, "
                    "not errors), 2 a usage error, 4 a missing dependency (docs: exit codes).", parents)
    groups = collect_groups(p)
    g = groups.model
    completes(g.add_argument("provider", help=PROVIDER_HELP), provider_names)
    g.add_argument("--version", default="v0", help="version name of the run, or 'auto' for the git short hash (+ -dirty)")
    g.add_argument("--model", default=None, help="model name in the archive (default: the provider's)")
    add_run_identity(g)
    add_collect_args(groups)
    add_labels(groups.output)
    groups.output.add_argument("--top", type=int, default=15, help="components shown in the summary table")
    d = p.add_argument_group("distributed")
    d.add_argument("--distributed", action="store_true",
                   help="one rank of a sharded model's collection: launch with torchrun --nproc-per-node N -m cbsite "
                        "collect ... --distributed; without -o sharding=..., torchrec's planner shards the tables "
                        "(manual: Sharded models)")
    d.add_argument("--dist-timeout", type=float, default=300.0,
                   help="seconds a collective may wait for the other ranks before the job ends")
    p.set_defaults(func=cmd_collect)

    p = add_command(sub, "sweep", "collect one run per point of a grid of options (a study)",
                    "Run a study: the cross product (or --zip) of --grid option values, one run per point, tagged "
                    "study:NAME and point:LABEL (the label is the run's version). Points already in the archive are "
                    "skipped; a failing point is recorded in runs/_studies/NAME/study.json and the others go on. "
                    "Exit status: 0 all selected points done, 1 some failed, 2 a usage error.", parents)
    groups = collect_groups(p)
    g = groups.model
    completes(g.add_argument("provider", help=PROVIDER_HELP), provider_names)
    add_run_identity(g)
    s = p.add_argument_group("study")
    s.add_argument("--grid", action="append", default=[], required=True, metavar="KEY=V1,V2,...",
                   help="an axis: provider option and its values (JSON where they parse); repeatable")
    s.add_argument("--zip", action="store_true", help="zip the axes (i-th values together) instead of the cross product")
    s.add_argument("--list", action="store_true", help="print the points and their labels; run nothing")
    s.add_argument("-k", default=None, metavar="EXPR",
                   help="select points by label as pytest -k does: substrings with and, or, not, parentheses")
    s.add_argument("--study", default=None, help="study name (default: PROVIDER-study)")
    s.add_argument("--model", default=None, help="model name of the points' runs (default: the study name)")
    s.add_argument("--executor", choices=("local", "submitit", "ray"), default="local",
                   help="local: pinned process pool; submitit: Slurm job arrays (or cluster=local|debug); ray: optional")
    s.add_argument("--workers", type=int, default=1, help="points at once (local: one exclusive core set each)")
    s.add_argument("--executor-option", action="append", default=[], metavar="KEY=VALUE",
                   help="submitit parameters, e.g. cluster=local, slurm_partition=dev, cpus_per_task=8; repeatable")
    s.add_argument("--no-pin", action="store_true", help="local executor: do not pin workers to cores (benchmarks)")
    add_collect_args(groups)
    add_labels(groups.output)
    p.set_defaults(func=cmd_sweep)
