"""Search entries for component paths: one per distinct path of a model, on the newest run page that has it.

A person searches a component path to find that component; an entry per path and per version would repeat
the same paths hundreds of times in an index that every page fetches. So each distinct path of a model gets
one entry, addressed `<run page>#find=PATH` (the run page opens that component, runlinks.js), on the run that
stands for the newest version holding it (the newest run of each version, as in trends and diffs).

The entries go straight into the search plugin's index (Material's, or MkDocs' own) when the site is built:
written into the page as HTML, the search plugin would parse every one of them again on every build, and each
run page would carry a list of all its paths. An entry is what the search plugin makes of a heading: titled by
the whole path, with every tail of the path that starts after a `.` or a `_` as its hidden text
(rundata.search_terms), so that a middle part of a path finds it and the result shows that path alone.
"""

from __future__ import annotations

import html
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

from mkdocs.plugins import BasePlugin, event_priority

from cbsite.archive import Run
from cbsite.generator import rundata

ANCHOR = "#find="
BOOST = 50  # above the pages' own sections: a path's entry comes before a run page whose run id starts alike


def assign(models: Iterable[tuple[list[Run], Mapping[str, list[str]]]]) -> dict[str, list[str]]:
    """Run id -> the component paths its page's entries carry: per model (its versions' newest runs, oldest
    first, and each run id's paths), every path on the newest run that has it, in that run's path order."""
    out: dict[str, list[str]] = {}
    for runs, paths_of in models:
        seen: set[str] = set()
        for run in reversed(runs):
            mine = [p for p in paths_of.get(run.run_id, []) if p and p not in seen]
            seen.update(mine)
            if mine:
                out[run.run_id] = mine
    return out


def entries(url: str, paths: list[str]) -> list[dict[str, Any]]:
    """The search entries of `paths` on the page at `url`, as Material's search plugin writes a heading's."""
    out = []
    for p in paths:
        terms = rundata.search_terms(p)
        out.append({"location": url + ANCHOR + urllib.parse.quote(p, safe="/"), "title": html.escape(p, quote=False),
                    "text": f"<p>{html.escape(' '.join(terms), quote=False)}</p>" if terms else "", "boost": BOOST})
    return out


def is_component_entry(entry: Mapping[str, Any]) -> bool:
    return ANCHOR in str(entry.get("location", ""))


def search_index(config: Any) -> list[dict[str, Any]] | None:
    """The entries list of the build's search plugin (Material's SearchIndex, MkDocs' own); None without one."""
    for plugin in config.plugins.values():
        index = getattr(plugin, "search_index", None)
        for name in ("entries", "_entries"):
            if isinstance(getattr(index, name, None), list):
                return getattr(index, name)
    return None


class ComponentSearch:
    """The component entries of a build: `pages` maps a page's source (relative to the generated docs, e.g.
    `runs/m/v/id/index.md`) to its paths; `prefix` is where those docs lie in the site's docs (the MkDocs plugin)."""

    def __init__(self, pages: Mapping[str, list[str]] | None = None, prefix: str = "") -> None:
        self.pages: dict[str, list[str]] = dict(pages or {})
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.urls: dict[str, str] = {}
        self.previous: dict[str, list[dict[str, Any]]] = {}  # page URL -> its entries in the previous index

    def locate(self, files: Any) -> None:
        """Each page's URL as MkDocs builds it (directory URLs or not)."""
        self.urls = {f.src_uri: f.url for f in files.documentation_pages()
                     if f.src_uri.startswith(self.prefix) and f.src_uri[len(self.prefix):] in self.pages}

    def take_previous(self, entries: dict[str, list[dict[str, Any]]]) -> None:
        """Take the component entries out of the previous index's entries by page URL (reuse.previous_entries,
        built under the same code and configuration): a page whose paths are the same gets them back as they
        were, not made again."""
        for url, items in entries.items():
            mine = [e for e in items if is_component_entry(e)]
            if mine:
                self.previous[url] = mine
                items[:] = [e for e in items if not is_component_entry(e)]

    def _entries(self, url: str, paths: list[str]) -> list[dict[str, Any]]:
        before = self.previous.get(url)
        if before is not None and [e.get("title") for e in before] == [html.escape(p, quote=False) for p in paths]:
            return before  # an entry is made from its page's URL and its path alone
        return entries(url, paths)

    def add_to(self, config: Any) -> int:
        """Append the entries, in page order, after every page's own (a section follows its page in Material's
        index); returns how many. Nothing without a search plugin."""
        index = search_index(config)
        if index is None:
            return 0
        n = len(index)
        for src in sorted(self.pages):
            url = self.urls.get(self.prefix + src)
            if url is not None:
                index.extend(self._entries(url, self.pages[src]))
        return len(index) - n


class ComponentSearchPlugin(BasePlugin):
    """`cbsite build` adds this to the generated project's plugins (after search)."""

    def __init__(self, search: ComponentSearch) -> None:
        super().__init__()
        self.search = search

    def on_files(self, files: Any, *, config: Any) -> Any:
        self.search.locate(files)
        return files

    @event_priority(50)  # after the cache's merge of the index (reuse.py), before the search plugin writes it
    def on_post_build(self, *, config: Any) -> None:
        self.search.add_to(config)
