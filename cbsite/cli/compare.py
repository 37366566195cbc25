"""The commands that compare: `diff` (two archived runs) and `compare` (two providers measured together in one
session), both with the regression gate's exit status."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from cbsite.cli.collect import PROVIDER_HELP, add_collect_args, add_labels, collect_config, collect_groups
from cbsite.cli.common import add_command, console, parse_options, require, staging_in, verbosity
from cbsite.cli.completion import completes, provider_names, run_names
from cbsite.errors import CbsiteError


def cmd_diff(args: argparse.Namespace) -> int:
    """Compare HEAD with BASE; print a table, Markdown or JSON; exit 1 when a gate rule is broken."""
    from cbsite.api import judge
    from cbsite.archive import read_run, resolve_run

    # Rules are checked before any run is read, so a typo in a rule fails fast (exit 2).
    rules = gate_rules(args)
    base_ref, head_ref = resolve_run(args.base, args.runs), resolve_run(args.head, args.runs)
    judged = judge(read_run(base_ref.path), read_run(head_ref.path), args.runs, rules, args.phase, args.match_moved)
    return report_diff(args, judged.diff, judged.gate, judged.evidence, judged.phase, base_ref, head_ref)


def report_diff(args: argparse.Namespace, rd: Any, gate: Any, evidence: Any, phase: str | None, base_ref: Any,
                head_ref: Any) -> int:
    """Print a diff (table, Markdown or JSON) with its latency verdicts; the exit status of its gate."""
    import json

    from cbsite import review

    url = review.diff_page_url(args.site_url, base_ref, head_ref, args.runs) if args.site_url else None
    if args.format == "markdown":
        sys.stdout.write(review.markdown(rd, gate, phase=phase, site_url=url, top=args.top, latency=evidence))
    elif args.format == "json":
        print(json.dumps(review.to_json(rd, gate, match_moved=args.match_moved, site_url=url, latency=evidence), indent=1))
    else:
        review.print_table(rd, gate, console(), phase=phase, top=args.top, latency=evidence)
        if url:
            print(f"diff page: {url}")
    return 0 if gate is None or gate.passed else 1


def gate_rules(args: argparse.Namespace) -> list[Any]:
    """--fail-on rules, else those of the configuration file; checked before anything runs (exit 2 on a typo)."""
    from cbsite.api import gate_rules as rules_of

    return rules_of(args.fail_on)


def check_providers(args: argparse.Namespace) -> None:
    """Refuse before any collection a side that is no provider; where both name archived runs (a run id,
    model@version, a run folder), say that `cbsite diff` compares those."""
    from cbsite import archive
    from cbsite.collector.plugins.registry import available

    installed = available("providers")
    unknown = [s for s in (args.base, args.head) if s not in installed and ":" not in s]
    if not unknown:
        return

    def archived(spec: str) -> bool:
        try:
            archive.resolve_run(spec, args.runs)
        except (CbsiteError, OSError):
            return False
        return True

    if all(archived(s) or "@" in s for s in unknown):
        raise CbsiteError(f"{' and '.join(repr(s) for s in unknown)} {'is not a provider but names a run' if len(unknown) == 1 else 'are not providers but name runs'} "
                          "of the archive (run id, model@version or run folder): compare two archived runs "
                          f"with: cbsite diff {args.base} {args.head}"
                          + (f" --runs {args.runs}" if args.runs != Path("runs") else "")
                          + "; cbsite compare measures two providers (models) afresh")
    raise CbsiteError(f"unknown provider {unknown[0]!r}: use one of {', '.join(sorted(installed))} or "
                      "'package.module:function' for your own model (archived runs are compared with cbsite diff)")


def cmd_compare(args: argparse.Namespace) -> int:
    """Measure BASE and HEAD together in one session; print verdicts; exit 1 when a gate rule is broken."""
    from cbsite.gate import check

    rules = gate_rules(args)
    check_providers(args)
    from cbsite.collector.providers import needs

    require("torch", *needs(args.base), *needs(args.head))
    from cbsite.collector.request import CollectRequest
    from cbsite.collector.session.compare import CompareConfig, compare
    from cbsite.diff.comparison import from_record
    from cbsite.diff.rundiff import diff_runs

    config = collect_config(args)
    cfg = CompareConfig(processes=args.processes, layout=args.order, pairs=args.pairs, block_s=args.block_time,
                        alpha=args.alpha, floor=args.floor, share_inputs=not args.no_shared_inputs)
    worktree = None
    if args.base_rev:
        worktree = _worktree(args.base_rev)
        cfg = CompareConfig(**{**cfg.__dict__, "layout": "abba", "base_sys_path": (str(worktree),)})
    common = dict(batches=args.batches, seed=args.seed, config=config, tags=tuple(args.tag), notes=args.notes)
    base = CollectRequest(provider=args.base, options=parse_options(args.base_option), model_name=args.model,
                          version=args.base_version, **common)
    head = CollectRequest(provider=args.head, options=parse_options(args.head_option), model_name=args.model,
                          version=args.head_version, **common)
    quiet = verbosity(args) < 0
    try:
        with staging_in(args.runs):
            result = compare(base, head, cfg, progress=config.progress,
                             say=lambda line: None if quiet else print(line, file=sys.stderr, flush=True))
            path = result.save(args.runs)
    finally:
        if worktree is not None:
            _remove_worktree(worktree)
    rd = diff_runs(result.base, result.head, match_moved=True)
    evidence = from_record(result.record)
    gate = check(rd, rules, None, latency=evidence) if rules else None
    summary = result.record["summary"]["verdicts"]
    print(f"saved {result.base.path}\nsaved {result.head.path}\ncomparison {path} "
          f"({result.record['wall_s']:.0f} s, {cfg.processes} processes, {result.record['threads']} thread(s)): "
          + ", ".join(f"{n} {v}" for v, n in summary.items() if n), file=sys.stderr)
    args.match_moved, args.site_url, args.phase = True, None, None
    return report_diff(args, rd, gate, evidence, None, _ref(result.base), _ref(result.head))


def _ref(run: Any) -> Any:
    from cbsite.archive import RunRef

    return RunRef(run.model, run.version, run.run_id, run.path)


def _worktree(rev: str) -> Path:
    """A detached git worktree of REV in a temporary folder: the base side imports the package from there."""
    import subprocess
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="cbsite-base-rev-"))
    done = subprocess.run(["git", "worktree", "add", "--detach", str(folder), rev], capture_output=True, text=True)
    if done.returncode != 0:
        raise CbsiteError(f"--base-rev {rev}: git worktree add failed: {done.stderr.strip() or done.stdout.strip()}; "
                          "run cbsite compare inside the git repository of the package under test")
    return folder


def _remove_worktree(folder: Path) -> None:
    import subprocess

    subprocess.run(["git", "worktree", "remove", "--force", str(folder)], capture_output=True)


def _add_report_args(p: argparse.ArgumentParser) -> Any:
    g = p.add_argument_group("report and gate")
    g.add_argument("--format", choices=("table", "markdown", "json"), default="table",
                   help="table (terminal), markdown (a PR comment) or json (see cbsite/diff/diff.schema.json)")
    g.add_argument("--top", type=int, default=5, help="top contributors shown per metric")
    return g


def add_parsers(sub: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    p = add_command(sub, "diff", "compare two archived runs, component by component; gate with --fail-on",
                    "Compare HEAD with BASE. Exit status: 0 passed (or no rules), 1 a --fail-on rule is broken, "
                    "2 a usage error (bad rule, unknown run).", parents)
    completes(p.add_argument("base", help="the older run: run id, model@version (its newest run), model or run folder"),
              run_names)
    completes(p.add_argument("head", help="the newer run, in the same forms"), run_names)
    g = _add_report_args(p)
    g.add_argument("--phase", choices=("forward", "backward"), default=None,
                   help="compare and gate one phase only (default: every phase both runs have)")
    g.add_argument("--match-moved", action=argparse.BooleanOptionalAction, default=True,
                   help="match renamed or re-wrapped modules by structure and report them as moved (default: on)")
    g.add_argument("--fail-on", action="append", default=[], metavar="RULE",
                   help="gate rule [GLOB:]METRIC>+N%%, e.g. flops>+5%% or 'over_arch.*:latency>+20%%'; repeatable; "
                        "replaces fail_on of [tool.cbsite.gate] in pyproject.toml")
    g.add_argument("--site-url", default=None, help="URL of the published site version; links the diff page")
    p.set_defaults(func=cmd_diff)

    p = add_command(sub, "compare", "measure two models together and judge every component's latency",
                    "Collect BASE and HEAD (two providers, or one with other options) as runs, then time both in fresh "
                    "worker processes in random A/B block pairs, and judge every component: regressed, improved, "
                    "unchanged or inconclusive. To compare runs already in the archive, use cbsite diff. Exit status: "
                    "0 passed (or no rules), 1 a --fail-on rule is broken, 2 a usage error, 4 a missing dependency.",
                    parents)
    groups = collect_groups(p)
    m = groups.model
    completes(m.add_argument("base", help=f"base provider: {PROVIDER_HELP}"), provider_names)
    completes(m.add_argument("head", help="head provider, in the same forms (often the same one with other options)"),
              provider_names)
    m.add_argument("-B", "--base-option", action="append", default=[], metavar="KEY=VALUE",
                   help="base provider option; repeatable")
    m.add_argument("-H", "--head-option", action="append", default=[], metavar="KEY=VALUE",
                   help="head provider option; repeatable")
    m.add_argument("--base-version", default="base", help="version name of the base run")
    m.add_argument("--head-version", default="head", help="version name of the head run")
    m.add_argument("--model", default=None, help="model name in the archive for both (default: the provider's)")
    m.add_argument("--batches", type=int, default=3, help="distinct example batches replayed in rotation")
    m.add_argument("--seed", type=int, default=0, help="seed of the models' weights and the example batches")
    s = p.add_argument_group("session")
    s.add_argument("--base-rev", default=None,
                   help="git revision of the package for the base side (a worktree; processes alternate ABBA)")
    s.add_argument("--processes", type=int, default=6, help="worker processes, one after another")
    s.add_argument("--order", choices=("interleaved", "abba"), default="interleaved",
                   help="interleaved: both sides in every process, random A/B block pairs; "
                        "abba: one side per process in A B B A order")
    s.add_argument("--pairs", type=int, default=8, help="A/B block pairs per component, phase and process")
    s.add_argument("--block-time", type=float, default=0.01, help="seconds of one timed block")
    s.add_argument("--alpha", type=float, default=0.01, help="level of the one-sided tests")
    s.add_argument("--floor", type=float, default=0.05,
                   help="smallest relative change called regressed or improved (0.05 = 5%%)")
    s.add_argument("--no-shared-inputs", action="store_true",
                   help="time each side on its own captured inputs even where the shapes agree")
    add_collect_args(groups)
    add_labels(groups.output)
    g = _add_report_args(p)
    g.add_argument("--fail-on", action="append", default=[], metavar="RULE",
                   help="gate rule [GLOB:]METRIC>+N%%; latency rules use the verdicts (N%% is the magnitude floor)")
    p.set_defaults(func=cmd_compare)
