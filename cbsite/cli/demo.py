"""`cbsite demo`: collect the demo models on CPU (a compared DLRM pair, DeepFM, nanoGPT, a small study) and build
the site."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Sequence

from cbsite.cli.collect import add_collect_args, collect_config, collect_groups, plugin_selection
from cbsite.cli.common import add_command, require, staging_in, verbosity
from cbsite.cli.site import add_build_args, add_site_args, cmd_build
from cbsite.errors import CbsiteError
from cbsite.format import counts as counts_text

# The demo: two versions of DLRM that differ the way model revisions do (a wider over arch and a bigger
# embedding dim), plus DeepFM and nanoGPT, on CPU-friendly sizes.
DEMO: tuple[tuple[str, str, str, dict[str, Any]], ...] = (
    ("dlrm", "dlrm", "v1", {}),
    ("dlrm", "dlrm", "v2", {"embedding_dim": 64, "over_arch_layer_sizes": [256, 128, 1]}),
    ("deepfm", "deepfm", "v1", {}),
    ("nanogpt", "nanogpt", "v1", {}),
)
# The demo's small study (a `cbsite sweep`, runs/demo-dense-sparse and runs/_studies): provider, study name, shared
# options, axes; collected without plugins, to depth 2, on a small budget: half a MB, minutes at most on 2 cores.
DEMO_STUDY = ("dlrm-synthetic", "demo-dense-sparse", {"size": "tiny"}, ("dense_features=64,512", "sparse_features=4,16"))
DEMO_STUDY_CONFIG = {"plugins": (), "plugin_options": {}, "max_depth": 2, "min_run_time": 0.05, "progress": False}

# `cbsite demo --full` (make demo-full; what collected the committed runs) collects every demo model with trace, ops,
# log, memory and compile, compiling components down to depth 2, and times the DLRM pair in compare's default
# worker processes.
DEMO_PLUGINS = ("trace", "ops", "log", "memory", "compile")
DEMO_PLUGIN_OPTIONS = {"compile": {"max_depth": 2}}
# `cbsite demo` (make demo), the quick first look: the DLRM pair is always measured, without compile and in fewer
# worker processes of fewer pairs (its verdicts follow the same rule, with fewer units behind them: more are
# inconclusive); deepfm, nanogpt and the study are collected only where the archive lacks them unchanged
# (`kept_demo_run`). --plugin / --plugin-option replace the plugin choice in both.
DEMO_QUICK_PLUGINS = ("trace", "ops", "log", "memory")
DEMO_QUICK_COMPARE: dict[str, Any] = {"processes": 3, "pairs": 4}


def kept_demo_run(runs: Path, provider: str, name: str, version: str, options: dict[str, Any], config: Any) -> Path | None:
    """A demo run of name@version already in the archive that this collection would repeat: the same provider and
    options, device (kind and CPU name), dtype, intra-op threads, torch version, phases, depth, budget, and at
    least the plugins (with the same options) asked for now. The newest such run, or None."""
    from cbsite import archive
    from cbsite.collector.config import threads_for
    from cbsite.collector.device import cpu_name
    from cbsite.provenance import package_versions

    torch_version = package_versions(("torch",))["torch"]  # as run.json records it; no torch import in the CLI

    for ref in reversed([r for r in archive.list_runs(runs) if (r.model, r.version) == (name, version)]):
        try:
            meta = archive.read_meta(ref.path)
        except Exception:  # noqa: BLE001 - an unreadable run is no reason to keep it
            continue
        got, device, plugins = meta.get("config", {}), meta.get("device", {}), meta.get("config", {}).get("plugins", {})
        same = (
            "demo" in meta.get("tags", ()) and meta.get("provider", {}).get("name") == provider
            and options.items() <= meta.get("provider", {}).get("options", {}).items()
            and device.get("kind") == config.device and (config.device != "cpu" or device.get("name") == cpu_name())
            and meta.get("dtype") == config.dtype and got.get("num_threads") == threads_for(config)
            and meta.get("versions", {}).get("torch") == torch_version
            and list(got.get("phases", ())) == list(config.phases) and got.get("max_depth") == config.max_depth
            and got.get("min_run_time") == config.min_run_time and not config.include and not config.exclude
            and all(p in plugins and all(plugins[p].get("options", {}).get(k) == v
                                         for k, v in config.plugin_options.get(p, {}).items()) for p in config.plugins)
        )
        if same:
            return ref.path
    return None


def _compare_pair(args: argparse.Namespace, config: Any, say: Any) -> None:
    """The two DLRM revisions, measured together (cbsite compare), so their diff page carries latency verdicts."""
    from cbsite.collector.request import CollectRequest
    from cbsite.collector.session.compare import CompareConfig, compare

    (provider, name, base_version, base_options), (_, _, head_version, head_options) = DEMO[:2]
    cfg = CompareConfig() if args.full else CompareConfig(**DEMO_QUICK_COMPARE)
    say(f"comparing {name}@{base_version} and {name}@{head_version} in one session ...")
    with staging_in(args.runs):
        side = dict(provider=provider, model_name=name, config=config, tags=("demo",))
        result = compare(CollectRequest(options=base_options, version=base_version, **side),
                         CollectRequest(options=head_options, version=head_version, **side),
                         cfg, progress=config.progress, say=lambda line: say("  " + line))
        record = result.save(args.runs)
    verdicts = ", ".join(f"{n} {v}" for v, n in result.record["summary"]["verdicts"].items() if n)
    say(f"  saved {result.base.path}, {result.head.path} and {record} ({result.record['wall_s']:.1f}s; {verdicts})")


def _single_runs(args: argparse.Namespace, config: Any, say: Any) -> None:
    """DeepFM and nanoGPT as single runs; the quick demo keeps those the archive already holds unchanged."""
    from cbsite.archive import shown
    from cbsite.collector.collect import collect
    from cbsite.collector.request import CollectRequest

    for provider, name, version, options in DEMO[2:]:
        kept = None if args.full else kept_demo_run(args.runs, provider, name, version, options, config)
        if kept is not None:
            say(f"kept {name}@{version}: {shown(kept)} was collected the same way on this machine")
            continue
        say(f"collecting {name}@{version} ...")
        with staging_in(args.runs):
            run = collect(CollectRequest(provider=provider, options=options, model_name=name, version=version,
                                         config=config, tags=("demo",)))
        say(f"  saved {run.save(args.runs)}  ({run.meta['wall_time_s']:.1f}s; {counts_text(run.meta)})")


def _study(args: argparse.Namespace, config: Any, say: Any) -> None:
    """The small study, as `cbsite sweep` runs it; points already in the archive are kept."""
    from dataclasses import replace

    from cbsite import study as cstudy
    from cbsite.collector.executors import run_sweep
    from cbsite.collector.request import CollectRequest

    provider, name, base_options, grid = DEMO_STUDY
    sweep = cstudy.Study.from_grid(name, provider, grid, base_options=base_options)
    say(f"sweeping study {name} ({len(sweep.points)} points, no plugins) ...")
    request = CollectRequest(provider=provider, config=replace(config, **DEMO_STUDY_CONFIG), tags=("demo",))
    record = run_sweep(sweep, sweep.points, args.runs, request, say=lambda line: say("  " + line))
    failed = [f"{e['label']}: {e['error']}" for e in record["points"] if e["status"] == "failed"]
    if failed:
        raise CbsiteError(f"the demo study {name} has failed points: " + "; ".join(failed))


def cmd_demo(args: argparse.Namespace) -> int:
    import time

    require("torch", "torchrec")  # the demo's models are torchrec's DLRM family (and nanoGPT)
    started = time.perf_counter()
    quiet = verbosity(args) < 0

    def say(line: str) -> None:
        if not quiet:
            print(line, flush=True)

    plugins = (DEMO_PLUGINS, DEMO_PLUGIN_OPTIONS) if args.full else (DEMO_QUICK_PLUGINS, {})
    config = collect_config(args, plugin_selection(args, *plugins))
    if not args.collect_only:  # a site folder that would be refused is refused before minutes of collecting
        from cbsite.generator.sitedir import check_out

        check_out(args.out, args.runs)
    say(f"the {'full' if args.full else 'quick'} demo, on {config.device}, with {', '.join(config.plugins) or 'no plugins'}"
        + ("" if args.full else " (cbsite demo --full: every model recollected, compiled, timed in more processes)"))
    _compare_pair(args, config, say)
    _single_runs(args, config, say)
    _study(args, config, say)
    say(f"collected in {time.perf_counter() - started:.0f} s")
    if args.collect_only:
        return 0
    code = cmd_build(args)
    say(f"demo done in {time.perf_counter() - started:.0f} s")
    return code


def add_parsers(sub: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    p = add_command(sub, "demo", "collect the demo models on CPU and build the site",
                    "Collect two DLRM revisions (compared), DeepFM, nanoGPT and a small study on CPU, then build the "
                    "site; open it with cbsite serve. Quick by default; --full recollects and compiles everything.",
                    parents)
    g = add_site_args(p)
    add_build_args(g)
    g.add_argument("--collect-only", action="store_true", help="collect the runs, build no site")
    g.add_argument("--full", action="store_true",
                   help="the complete demo (about 9 minutes on 2 cores): every model recollected and compiled to depth 2, "
                        "the DLRM pair timed in 6 worker processes; by default a quick one (about 2 minutes on 2 cores)")
    add_collect_args(collect_groups(p))
    p.set_defaults(func=cmd_demo)
