"""The site generator: the archive of runs -> a versioned, offline MkDocs Material site.

The only package that imports jinja2, mkdocs and altair; it never imports torch. Entry points for the CLI:
`build_site`, `publish_site`, `serve`. Broken runs are skipped with a `SiteWarning` (Python warnings);
users' mistakes raise CbsiteError.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from cbsite.generator.build import BuildResult, SiteWarning
from cbsite.generator.config import DEFAULT_PERFETTO_ORIGIN

__all__ = ["BuildResult", "SiteWarning", "build_site", "publish_site", "serve"]


def build_site(
    runs: Path, out: Path, *, config: Path | None = None, perfetto_origin: str = DEFAULT_PERFETTO_ORIGIN,
    extra_diffs: Sequence[tuple[str, str]] = (), strict: bool = True, quiet: bool = False,
    project_dir: Path | None = None, allow_empty: bool = False, cache: Path | None = None,
) -> Path:
    """Build the site of the archive `runs` into `out` and return `out`.

    config None reads ./mkdocs.yml when present, else built-in defaults. `extra_diffs` adds diff pages for
    pairs of run specs (`model@version` or run ids) beyond each model's consecutive versions.
    `project_dir` keeps the generated MkDocs project there (for inspection; `mkdocs build` works on it).
    `out` must be new, empty or a site cbsite built (its marker file); the new site replaces it whole once
    complete. An archive with no readable run replaces an existing site only with `allow_empty`.
    `cache` is a folder kept between builds: runs and diffs it knows by content are not computed again.
    """
    from cbsite.generator.build import build

    return build(runs, out, config=config, perfetto_origin=perfetto_origin, extra_diffs=extra_diffs,
                 strict=strict, quiet=quiet, project_dir=project_dir, allow_empty=allow_empty, cache=cache).site


def publish_site(
    runs: Path, out: Path, site_version: str, *, aliases: Sequence[str] = (), set_default: bool = False,
    title: str | None = None, config: Path | None = None, perfetto_origin: str = DEFAULT_PERFETTO_ORIGIN,
    extra_diffs: Sequence[tuple[str, str]] = (), quiet: bool = False, allow_empty: bool = False,
) -> Path:
    """Publish the archive's site as `site_version` in mike's layout under `out`; return `out/site_version`."""
    from cbsite.generator.publish import publish

    return publish(runs, out, site_version, aliases=aliases, set_default=set_default, title=title, config=config,
                   perfetto_origin=perfetto_origin, extra_diffs=extra_diffs, quiet=quiet, allow_empty=allow_empty)


def serve(directory: Path, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve a built or published site over HTTP (the site needs HTTP, not file://)."""
    from cbsite.generator.serve import serve as _serve

    _serve(directory, host, port)
