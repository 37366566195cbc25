"""Discovery through entry points, selection from the CLI and configuration files, up-front validation.

Built-in plugins register through the same entry point groups a third party uses
(`cbsite.providers`, `cbsite.preprocessors`, `cbsite.profilers`, `cbsite.reporters`), so there is one
way in. Loading is lazy: an entry point is imported only when it is selected.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, Mapping, Sequence

from cbsite.config import find_config
from cbsite.errors import CbsiteError

GROUPS = {
    "providers": "cbsite.providers",
    "preprocessors": "cbsite.preprocessors",
    "profilers": "cbsite.profilers",
    "reporters": "cbsite.reporters",
}
# Kinds a user selects with --plugin (providers are chosen by the positional provider argument).
SELECTABLE = ("profilers", "preprocessors", "reporters")
# "gate" belongs to the regression gate (cbsite.review), which reads the same table.
CONFIG_KEYS = ("plugins", "options", "gate")


def available(kind: str) -> dict[str, EntryPoint]:
    """Installed plugins of one kind by name (the entry point's name)."""
    return {ep.name: ep for ep in _installed(GROUPS[kind], _import_path_state())}


def _import_path_state() -> tuple[tuple[str, int], ...]:
    """The import path with each folder's modification time: a package installed or removed (a `pip install` in a
    notebook's kernel) changes its folder's, as importlib's own finders assume."""
    state = []
    for entry in sys.path:
        try:
            state.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            state.append((entry, 0))
    return tuple(state)


@functools.lru_cache(maxsize=16)
def _installed(group: str, path_state: tuple[tuple[str, int], ...]) -> tuple[EntryPoint, ...]:
    # Each lookup reads every installed package's metadata (tens of ms) and a collection makes a dozen.
    return tuple(entry_points(group=group))


def load(kind: str, name: str) -> Any:
    """The object an entry point names; CbsiteError listing the known names when there is none."""
    found = available(kind)
    if name not in found:
        raise CbsiteError(f"unknown {kind[:-1]} {name!r}; known: {', '.join(sorted(found)) or 'none'}")
    return found[name].load()


@dataclass(frozen=True)
class Selection:
    """The validated plugin selection: per kind, (name, class, options with defaults) in order."""

    profilers: tuple[tuple[str, Any, dict[str, Any]], ...] = ()
    preprocessors: tuple[tuple[str, Any, dict[str, Any]], ...] = ()
    reporters: tuple[tuple[str, Any, dict[str, Any]], ...] = ()

    def describe(self) -> dict[str, dict[str, Any]]:
        """For run.json `config.plugins`: every selected plugin with its effective options."""
        return {name: {"kind": kind[:-1], "options": opts}
                for kind in SELECTABLE for name, _, opts in getattr(self, kind)}

    def instances(self, kind: str) -> list[Any]:
        return [cls(dict(opts)) for _, cls, opts in getattr(self, kind)]


def select(names: Sequence[str], options: Mapping[str, Mapping[str, Any]] | None = None) -> Selection:
    """Resolve plugin names across the selectable kinds and check their options; every problem at once.

    `options` maps a plugin name to its option values. A name may be written `kind:name` when two
    kinds share it.
    """
    options = dict(options or {})
    catalogue = {kind: available(kind) for kind in SELECTABLE}
    problems: list[str] = []
    chosen: dict[str, list[tuple[str, Any, dict[str, Any]]]] = {k: [] for k in SELECTABLE}
    seen: set[str] = set()
    for spec in names:
        kind_hint, _, name = spec.rpartition(":")
        kinds = [k for k in SELECTABLE if name in catalogue[k] and (not kind_hint or k.startswith(kind_hint))]
        if not kinds:
            problems.append(f"unknown plugin {spec!r}")
            continue
        if len(kinds) > 1:
            problems.append(f"plugin name {name!r} is both a {' and a '.join(k[:-1] for k in kinds)}; write kind:name")
            continue
        if name in seen:
            continue
        seen.add(name)
        cls = catalogue[kinds[0]][name].load()
        declared = dict(getattr(cls, "options", {}) or {})
        given = dict(options.get(name, {}))
        for key, value in given.items():
            if key not in declared:
                problems.append(f"unknown option {name}.{key} (options of {name}: {', '.join(declared) or 'none'})")
                continue
            why = declared[key].check(value)
            if why:
                problems.append(f"option {name}.{key}={value!r}: {why}")
        effective = {k: o.default for k, o in declared.items()} | {k: v for k, v in given.items() if k in declared}
        chosen[kinds[0]].append((name, cls, effective))
    for name in options:
        if name not in seen and not any(name == s.rpartition(":")[2] for s in names):
            problems.append(f"options given for {name!r}, which is not selected (add --plugin {name})")
    if problems:
        known = "; ".join(f"{kind}: {', '.join(sorted(catalogue[kind])) or 'none'}" for kind in SELECTABLE)
        raise CbsiteError("; ".join(problems) + f". Known plugins — {known}")
    return Selection(**{k: tuple(v) for k, v in chosen.items()})


def parse_option_pairs(pairs: Sequence[str], parse_value: Any) -> dict[str, dict[str, Any]]:
    """`plugin.key=value` pairs into {plugin: {key: value}}; every malformed pair reported at once."""
    out: dict[str, dict[str, Any]] = {}
    bad = []
    for pair in pairs:
        target, eq, value = pair.partition("=")
        plugin, dot, key = target.partition(".")
        if not eq or not dot or not plugin or not key:
            bad.append(pair)
            continue
        out.setdefault(plugin, {})[key] = parse_value(value)
    if bad:
        raise CbsiteError(
            f"plugin option{'s' if len(bad) > 1 else ''} {', '.join(map(repr, bad))} not written plugin.key=value; "
            f"e.g. --plugin-option compile.mode=max-autotune"
        )
    return out


def config_selection(path: Path, table: Mapping[str, Any]) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """`plugins = [...]` and `[options.<plugin>]` of a configuration table; bad keys reported at once."""
    problems = [f"unknown key {key!r}" for key in table if key not in CONFIG_KEYS]
    names = table.get("plugins", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        problems.append("plugins must be a list of plugin names")
        names = []
    opts = table.get("options", {})
    if not isinstance(opts, dict) or not all(isinstance(v, dict) for v in opts.values()):
        problems.append("options must be tables, one per plugin: [options.compile] (or [tool.cbsite.options.compile])")
        opts = {}
    if problems:
        raise CbsiteError(f"{path}: " + "; ".join(problems) + f" (valid keys: {', '.join(CONFIG_KEYS)})")
    return list(names), {k: dict(v) for k, v in opts.items()}


def merged_selection(
    cli_names: Sequence[str], cli_options: Mapping[str, Mapping[str, Any]], cwd: Path
) -> tuple[list[str], dict[str, dict[str, Any]], str | None]:
    """CLI over configuration file: --plugin replaces the file's list when given; options merge, CLI wins."""
    found = find_config(cwd)
    names: list[str] = []
    options: dict[str, dict[str, Any]] = {}
    source = None
    if found:
        path, table = found
        names, options = config_selection(path, table)
        source = str(path)
    if cli_names:
        names = list(cli_names)
        # The file's options for plugins the command line did not select are not a mistake here.
        selected_names = {n.rpartition(":")[2] for n in names}
        options = {k: v for k, v in options.items() if k in selected_names}
    for plugin, values in cli_options.items():
        options.setdefault(plugin, {}).update(values)
    return names, options, source
