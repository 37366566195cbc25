"""The site configuration: the user's base mkdocs.yml, our `extra.cbsite` options, and what the build forces.

The user's file is read with a YAML loader that keeps unknown tags (`!!python/name:...`, `!ENV`) as they are,
so the generated project's mkdocs.yml carries them through untouched for MkDocs to interpret.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cbsite.errors import CbsiteError

DEFAULT_PERFETTO_ORIGIN = "https://ui.perfetto.dev"
DEFAULTS_FILE = Path(__file__).resolve().parent / "templates" / "mkdocs.defaults.yml"
CBSITE_KEYS = {"perfetto_origin"}
# Words split on white space, hyphens and punctuation, but a component path is one word: `.` splits only at the
# end of a sentence, `_` never. Split into its parts, `over_arch.model.0._mlp.1._linear` searched for `over_arch`,
# `model`, `0`, `_mlp`, `1`, `_linear`, each a prefix: "0" and "1" matched the start of every run id's tail
# ("20261130T150038Z-067f0d") in the boosted page titles, and another model's run page came first. A component's
# search entry (searchpaths.py) gives its path whole and every tail after a `.` or `_`, so `t_cat_0` finds it too.
SEARCH_SEPARATOR = r"[\s\-,:;!=\[\]()\"/]+|\.(?=[\s,;:)]|$)|&[lg]t;"
CSS = "assets/cbsite/cbsite.css"
SITE_JS = "assets/cbsite/site.js"  # on every page: search results carry the query; a file:// page says why it fails
ORIGIN_RE = re.compile(r"\Ahttps?://[A-Za-z0-9.-]+(:\d{1,5})?\Z")  # \Z: `$` would accept a final newline


class Tagged:
    """A YAML node with a tag we do not interpret; dumped back exactly as it was written."""

    def __init__(self, tag: str, value: Any, kind: str) -> None:
        self.tag, self.value, self.kind = tag, value, kind


class _Loader(yaml.SafeLoader):
    pass


def _construct_tagged(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Tagged:
    if isinstance(node, yaml.ScalarNode):
        return Tagged(node.tag, loader.construct_scalar(node), "scalar")
    if isinstance(node, yaml.SequenceNode):
        return Tagged(node.tag, loader.construct_sequence(node, deep=True), "sequence")
    return Tagged(node.tag, loader.construct_mapping(node, deep=True), "mapping")


_Loader.add_multi_constructor("!", _construct_tagged)
_Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: _construct_tagged(loader, suffix, node))


class _Dumper(yaml.SafeDumper):
    pass


def _represent_tagged(dumper: yaml.SafeDumper, data: Tagged) -> yaml.Node:
    if data.kind == "scalar":
        return dumper.represent_scalar(data.tag, data.value)
    if data.kind == "sequence":
        return dumper.represent_sequence(data.tag, data.value)
    return dumper.represent_mapping(data.tag, data.value)


_Dumper.add_representer(Tagged, _represent_tagged)


def dump_yaml(data: dict[str, Any]) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, default_flow_style=False)


@dataclass
class SiteConfig:
    base: dict[str, Any]  # the user's mkdocs.yml (or our defaults), minus extra.cbsite
    perfetto_origin: str
    source: Path | None  # the file it came from, for relative paths such as theme.custom_dir


def load_site_config(config: Path | None, perfetto_origin: str = DEFAULT_PERFETTO_ORIGIN) -> SiteConfig:
    """Read the base config; None means ./mkdocs.yml when present, else the built-in defaults.

    An explicit `perfetto_origin` argument (anything but the default) wins over `extra.cbsite.perfetto_origin`.
    """
    if config is None:
        config = Path("mkdocs.yml") if Path("mkdocs.yml").is_file() else None
    path = config if config is not None else DEFAULTS_FILE
    try:
        base = yaml.load(Path(path).read_text(), Loader=_Loader) or {}
    except FileNotFoundError:
        raise CbsiteError(f"config file {path} does not exist; pass an existing mkdocs.yml or none") from None
    except yaml.YAMLError as exc:
        raise CbsiteError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(base, dict):
        raise CbsiteError(f"config file {path} must be a mapping of MkDocs settings")
    base = copy.deepcopy(base)
    extra = base.get("extra") or {}
    ours = extra.pop("cbsite", None) or {}
    errors = []
    if not isinstance(ours, dict):
        errors.append("extra.cbsite must be a mapping")
        ours = {}
    for key in sorted(set(ours) - CBSITE_KEYS):
        errors.append(f"extra.cbsite.{key} is not an option (known: {', '.join(sorted(CBSITE_KEYS))})")
    origin = perfetto_origin
    if perfetto_origin == DEFAULT_PERFETTO_ORIGIN and "perfetto_origin" in ours:
        origin = ours["perfetto_origin"]
    if not isinstance(origin, str) or not ORIGIN_RE.match(origin.rstrip("/")):
        errors.append(f"perfetto origin {origin!r} must look like https://ui.perfetto.dev (scheme, host, optional port)")
    if errors:
        raise CbsiteError(f"bad settings in {path}: " + "; ".join(errors))
    if extra:
        base["extra"] = extra
    else:
        base.pop("extra", None)
    return SiteConfig(base=base, perfetto_origin=origin.rstrip("/"), source=Path(path) if config else None)


def project_config(site: SiteConfig, nav: list[Any], *, versioned: bool) -> tuple[dict[str, Any], list[str]]:
    """The generated project's mkdocs.yml: the user's settings plus what the site needs to work offline.

    Returns the config and notes about user settings that were overridden.
    """
    cfg = copy.deepcopy(site.base)
    notes: list[str] = []
    cfg.setdefault("site_name", "cbsite")
    cfg["docs_dir"] = "docs"
    cfg["site_dir"] = "site"
    cfg["nav"] = nav  # Only home and model pages: a nav of every run page would grow with the square of pages.
    # Run and diff pages are reached from those pages, on purpose not from the nav: say so to MkDocs,
    # which otherwise lists every one of them at each build.
    cfg["not_in_nav"] = "/runs/\n/diffs/\n"
    theme = cfg.get("theme") or {}
    if isinstance(theme, str):
        theme = {"name": theme}
    if theme.get("name", "material") != "material":
        notes.append(f"theme {theme.get('name')!r} replaced by 'material' (the site's pages and version selector need it)")
    theme["name"] = "material"
    theme["font"] = False  # no Google Fonts: the site must not reach the internet
    features = [f for f in theme.get("features", []) if f != "navigation.instant"]
    if len(features) != len(theme.get("features", [])):
        notes.append("theme feature navigation.instant removed: page scripts (icicle, table) need full page loads")
    theme["features"] = features
    if site.source is not None and isinstance(theme.get("custom_dir"), str):
        theme["custom_dir"] = str((site.source.parent / theme["custom_dir"]).resolve())
    cfg["theme"] = theme
    cfg["plugins"] = _plugins(cfg.get("plugins"), notes)
    extra_css = [c for c in cfg.get("extra_css", []) if c != CSS]
    cfg["extra_css"] = [CSS, *extra_css]
    cfg["extra_javascript"] = [SITE_JS, *[j for j in cfg.get("extra_javascript", []) if j != SITE_JS]]
    if versioned:
        extra = cfg.setdefault("extra", {})
        # alias: the selector shows each version's aliases ("2.0 latest"), so readers see which is current.
        extra["version"] = {"alias": True, **(extra.get("version") or {}), "provider": "mike"}
    return cfg, notes


def _plugins(plugins: Any, notes: list[str]) -> list[Any]:
    """Keep the user's plugins, drop `offline` (it would load a CDN script), and split search on dots."""
    items: list[Any] = list(plugins) if isinstance(plugins, list) else (
        [{k: v} for k, v in plugins.items()] if isinstance(plugins, dict) else ["search"]
    )
    out: list[Any] = []
    have_search = False
    for item in items:
        name = item if isinstance(item, str) else next(iter(item))
        opts = {} if isinstance(item, str) else dict(item[name] or {})
        if name in ("offline", "material/offline"):
            notes.append("plugin offline dropped: without a local iframe-worker it loads a CDN script; "
                         "serve the site over HTTP (cbsite serve) and search works offline")
            continue
        if name in ("search", "material/search"):
            have_search = True
            opts["separator"] = SEARCH_SEPARATOR
        out.append({name: opts} if opts else name)
    if not have_search:
        out.insert(0, {"search": {"separator": SEARCH_SEPARATOR}})
    return out
