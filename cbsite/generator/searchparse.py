"""Material's search parse of the site's pages, in the build's worker processes instead of MkDocs' one.

Material's search plugin parses every page's HTML into index entries (`SearchIndex.add_entry_from_context`) in the
process that runs MkDocs, after the workers have computed the pages' data and while they only make the `.gz` copies:
at 1,000 runs this parse is most of MkDocs' time, on one core. reuse.ReusePlugin sends each page to the workers
instead (`Offload`): the page is marked excluded for the plugin's own parse, Material's `SearchIndex` parses it in a
worker, and the entries go into the index in page order (reuse.py's merge), so the index is the same byte for byte
(tests/test_build_speed_workers.py builds a site both ways). Only Material's plugin is offloaded; MkDocs' own search
plugin parses in-process as before.
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.process
import pickle
from dataclasses import dataclass
from typing import Any

MATERIAL_INDEX = ("material.plugins.search.plugin", "SearchIndex")


@dataclass
class PageForSearch:
    """What Material's SearchIndex reads of a page: its HTML, table of contents, URL, front matter and title."""

    content: str
    toc: Any
    url: str
    meta: dict[str, Any]
    title: str


def entries(config: dict[str, Any], page: PageForSearch) -> list[dict[str, Any]]:
    """Material's own entries for one page (runs in a worker process, or in-process where the pool failed)."""
    from material.plugins.search.plugin import SearchIndex

    index = SearchIndex(**config)
    index.add_entry_from_context(page)
    return index.entries


def material_search(config: Any) -> Any | None:
    """The build's Material search plugin, or None (no search plugin, or MkDocs' own)."""
    for plugin in config.plugins.values():
        index = getattr(plugin, "search_index", None)
        if (type(index).__module__, type(index).__name__) == MATERIAL_INDEX:
            return plugin
    return None


class Offload:
    """Pages sent to the pool for their search entries, collected in `results` (page URL -> entries)."""

    def __init__(self, pool: concurrent.futures.Executor) -> None:
        self.pool: concurrent.futures.Executor | None = pool
        self.settings: dict[str, Any] | None = None  # Material's search settings, read at the first page
        self.pending: dict[str, tuple[concurrent.futures.Future[list[dict[str, Any]]], PageForSearch]] = {}

    def send(self, page: Any, html: str, config: Any) -> bool:
        """Send `page` (with the HTML it will have) to a worker; True when sent, and its own meta then says
        `search: exclude` until `restore` (so the plugin's in-process parse skips it)."""
        if self.pool is not None and self.settings is None:
            plugin = material_search(config)
            if plugin is None:
                self.pool = None  # MkDocs' own search plugin, or none: nothing to send
            else:
                self.settings = dict(plugin.config)
        search = page.meta.get("search") or {}
        if self.pool is None or self.settings is None or not isinstance(search, dict) or search.get("exclude"):
            return False
        item = PageForSearch(html, page.toc, page.url, dict(page.meta), str(page.title))
        try:
            future = self.pool.submit(entries, self.settings, item)
        except RuntimeError:  # a pool shut down or broken (BrokenProcessPool is one): the rest are parsed in-process
            self.pool = None
            return False
        self.pending[page.url] = (future, item)
        page.meta = {**page.meta, "search": {**search, "exclude": True}}
        return True

    def restore(self, page: Any) -> None:
        """The page's own front matter back, before the theme renders it."""
        if page.url in self.pending:
            page.meta = self.pending[page.url][1].meta

    def results(self) -> dict[str, list[dict[str, Any]]]:
        """Every sent page's entries; a page whose worker failed is parsed here instead."""
        out: dict[str, list[dict[str, Any]]] = {}
        for url, (future, item) in self.pending.items():
            try:
                out[url] = future.result()
            except (concurrent.futures.process.BrokenProcessPool, pickle.PicklingError, TypeError, AttributeError,
                    OSError):  # the pool, not the page: a page Material cannot parse raises here as it would have
                assert self.settings is not None  # read before the first page was sent
                out[url] = entries(self.settings, item)
        self.pending.clear()
        return out
