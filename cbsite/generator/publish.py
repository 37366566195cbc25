"""`cbsite publish`: write a built site into a directory in mike's layout.

    DIR/versions.json      mike's format: [{"version", "title", "aliases"}], newest version first
    DIR/<version>/         the site built with Material's version selector (extra.version.provider: mike)
                           its sitemap.xml lists its pages, so the selector switches to the same page
    DIR/<alias>/           a copy of the version it points to (works on any static host, no redirects)
    DIR/index.html         a redirect to the default alias or version

mike itself only writes to a git branch; the bookkeeping (ordering, moving aliases) reuses its Versions class.
Publishing a version rewrites only its own folder, the folders of its aliases, versions.json and (when asked,
or when there is none yet) the root redirect; other versions are never touched. The root carries cbsite's
marker (sitedir.py) and a publish holds its lock; each folder is swapped in whole.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Sequence
from xml.sax.saxutils import escape

from mike.versions import Versions

from cbsite import schema
from cbsite.errors import CbsiteError
from cbsite.generator import build, sitedir, templating

VERSIONS_JSON = "versions.json"
# Where a version's sitemap says its pages are when the configuration has no site_url (MkDocs then lists none).
# Material's version selector only needs the list: it takes the path of the current page relative to the
# current version, looks for that path in the chosen version's sitemap (relative to the sitemap's own
# common prefix, host ignored) and opens it in the chosen version's folder, else that version's home.
SITEMAP_HOST = "https://cbsite.invalid/"


def _load_versions(out: Path) -> Versions:
    path = out / VERSIONS_JSON
    if not path.exists():
        return Versions()
    try:
        return Versions.loads(path.read_text())
    except (ValueError, KeyError, TypeError) as exc:
        raise CbsiteError(f"{path} is not a mike versions.json ({exc}); publish into an empty folder") from exc


def _dump_versions(versions: Versions) -> str:
    """mike's format with sorted aliases (mike writes a set's order, which varies from run to run)."""
    data = []
    for info in versions:  # mike's order: newest version first
        item = {"version": str(info.version), "title": info.title, "aliases": sorted(info.aliases)}
        if info.properties:
            item["properties"] = info.properties
        data.append(item)
    return json.dumps(data, indent=2) + "\n"


def _replace_dir(src: Path, dest: Path) -> None:
    """Put a copy of `src` at `dest`, swapping it in only once complete (under the publish root's lock)."""
    sitedir.check_out(dest, None, flag="version folder")
    with sitedir.staged(dest) as stage:
        shutil.copytree(src, stage, dirs_exist_ok=True)


def _fill_sitemap(site: Path, site_version: str) -> None:
    """List the version's pages in its sitemap.xml (and .gz) where MkDocs listed none (no site_url), so that
    switching version from a page opens the same page in the other version. A page is an HTML file outside
    assets/ and search/ (a folder's index.html is the folder's URL); the gzip keeps MkDocs' header time."""
    sitemap = site / "sitemap.xml"
    if not sitemap.is_file() or "<url>" in sitemap.read_text():
        return
    urls = set()
    for page in site.rglob("*.html"):
        rel = page.relative_to(site).as_posix()
        if rel == "404.html" or rel.split("/", 1)[0] in ("assets", "search"):
            continue
        urls.add(rel[: -len("index.html")] if rel == "index.html" or rel.endswith("/index.html") else rel)
    base = f"{SITEMAP_HOST}{site_version}/"
    text = ('<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">\n'
            + "".join(f"    <url><loc>{escape(base + u)}</loc></url>\n" for u in sorted(urls)) + "</urlset>\n")
    sitemap.write_text(text)
    packed = site / "sitemap.xml.gz"
    mtime = int.from_bytes(packed.read_bytes()[4:8], "little") if packed.is_file() else 0
    buf = io.BytesIO()
    with gzip.GzipFile(filename="sitemap.xml.gz", fileobj=buf, mode="wb", mtime=mtime) as gz:
        gz.write(text.encode())
    packed.write_bytes(buf.getvalue())


def _write(path: Path, text: str) -> None:
    """Replace a file whole: a reader (or a kill) never sees half of it."""
    tmp = path.parent / f".{path.name}.cbsite-tmp"
    tmp.write_text(text)
    os.replace(tmp, path)


def publish(
    runs: Path, out: Path, site_version: str, *, aliases: Sequence[str] = (), set_default: bool = False,
    title: str | None = None, config: Path | None = None, perfetto_origin: str = "https://ui.perfetto.dev",
    extra_diffs: Sequence[tuple[str, str]] = (), strict: bool = True, quiet: bool = False, allow_empty: bool = False,
) -> Path:
    """Build the archive and publish it as `site_version` into `out`; return the version's folder.

    `out` must be new, empty or a folder cbsite published into (its marker file); the version and alias
    folders are replaced whole, each swapped in when complete, under a lock on `out`. An archive with no
    readable run replaces no existing version or alias unless `allow_empty`.
    """
    runs, out = Path(runs).resolve(), Path(out).resolve()
    schema.check_name("site version", site_version)
    for alias in aliases:
        schema.check_name("alias", alias)
    if site_version in aliases:
        raise CbsiteError(f"alias {site_version!r} is the version's own name; choose another alias")
    sitedir.check_out(out, runs, kind=sitedir.PUBLISHED)
    with sitedir.locked(out):
        sitedir.check_out(out, runs, kind=sitedir.PUBLISHED)
        out.mkdir(parents=True, exist_ok=True)
        if sitedir.marker_kind(out) is None:
            sitedir.write_marker(out, sitedir.PUBLISHED)
        versions = _load_versions(out)
        for info in versions:
            if site_version in info.aliases:
                raise CbsiteError(f"{site_version!r} is already an alias of version {info.version}; choose another version name")
            if str(info.version) in aliases:
                raise CbsiteError(f"alias {str(info.version)!r} is already a published version; choose another alias")
        for name in (site_version, *aliases):
            sitedir.check_out(out / name, None, flag="version folder")
        with tempfile.TemporaryDirectory(prefix="cbsite-publish-") as tmp:
            site = Path(tmp) / "site"
            result = build.build(runs, site, config=config, perfetto_origin=perfetto_origin, extra_diffs=extra_diffs,
                                 strict=strict, quiet=quiet, versioned=True)
            replaced = [out / n for n in (site_version, *aliases) if (out / n).exists()]
            if not result.runs and replaced and not allow_empty:
                raise CbsiteError(build.empty_archive_message(runs, replaced[0], result.warnings))
            _fill_sitemap(site, site_version)
            _replace_dir(site, out / site_version)
        for alias in aliases:
            _replace_dir(out / site_version, out / alias)
        versions.add(site_version, title, list(aliases), update_aliases=True)
        _write(out / VERSIONS_JSON, _dump_versions(versions))
        index = out / "index.html"
        if set_default or not index.exists():
            target = aliases[0] if aliases else site_version
            _write(index, templating.environment().get_template("publish/redirect.html.j2").render(target=target))
    return out / site_version
