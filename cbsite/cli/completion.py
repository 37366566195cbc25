"""Shell completion through argcomplete: `cbsite completion bash|zsh|fish` prints the script a shell sources, and
`complete` answers that script's TAB. The answer comes from the parser alone (the command modules import torch,
polars and mkdocs only inside their commands), run names from the archive's folder names, never its files, and
provider and plugin names from the installed entry points, none of them loaded."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Callable, Sequence

from cbsite.cli.common import DEFAULT_RUNS, add_command, require

SHELLS = ("bash", "zsh", "fish")


def complete(parser: argparse.ArgumentParser) -> None:
    """When the sourced script asks (it sets `_ARGCOMPLETE`), print the candidates for `COMP_LINE` and exit;
    otherwise return at once, without importing argcomplete."""
    if "_ARGCOMPLETE" not in os.environ:
        return
    try:
        import argcomplete
    except ImportError:  # an older install without it: TAB offers nothing, the command line still works
        return
    argcomplete.autocomplete(parser)


def run_names(prefix: str, parsed_args: argparse.Namespace | None = None, **_: Any) -> list[str]:
    """The run specs of the archive named by `--runs` (else the default) that start with `prefix`: each model and
    model@version, and run ids once the prefix is one's start (a digit)."""
    root = Path(getattr(parsed_args, "runs", None) or DEFAULT_RUNS)
    names: list[str] = []
    for model in _folders(root):
        if model.name.startswith("_"):  # records beside the models (_comparisons, _studies)
            continue
        names.append(model.name)
        for version in _folders(model):
            names.append(f"{model.name}@{version.name}")
            if prefix[:1].isdigit():
                names.extend(run.name for run in _folders(version))
    return sorted(n for n in set(names) if n.startswith(prefix))


def _folders(folder: Path) -> list[Path]:
    try:
        return [p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return []


def provider_names(prefix: str, **_: Any) -> list[str]:
    """The installed providers (entry points) that start with `prefix`; a module:function one is the user's to type."""
    from cbsite.collector.plugins.registry import available

    return sorted(name for name in available("providers") if name.startswith(prefix))


def plugin_names(prefix: str, **_: Any) -> list[str]:
    """The installed profiler, preprocessor and reporter plugins that start with `prefix`."""
    from cbsite.collector.plugins.registry import SELECTABLE, available

    return sorted({name for kind in SELECTABLE for name in available(kind) if name.startswith(prefix)})


def completes(action: argparse.Action, completer: Callable[..., list[str]]) -> argparse.Action:
    """`action` completed by `completer` (one of the above) on TAB."""
    action.completer = completer  # type: ignore[attr-defined]  # argcomplete reads this attribute
    return action


def cmd_completion(args: argparse.Namespace) -> int:
    require("argcomplete")
    import argcomplete

    print(argcomplete.shellcode(["cbsite"], shell=args.shell), end="")
    return 0


def add_parsers(sub: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    p = add_command(sub, "completion", "print the shell script that completes cbsite's commands, options and runs",
                    "Print the script that makes TAB complete cbsite's commands, options and the runs of the archive; "
                    "load it from the shell's startup file, e.g. `eval \"$(cbsite completion bash)\"` in ~/.bashrc.",
                    parents)
    p.add_argument("shell", choices=SHELLS, help="the shell the script is for")
    p.set_defaults(func=cmd_completion)
