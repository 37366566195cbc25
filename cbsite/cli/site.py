"""The commands that make and serve the site: `build`, `publish`, `serve`. None imports torch."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Sequence

from cbsite.cli.common import add_command, note_stale, require, verbosity
from cbsite.errors import CbsiteError

SITE_MODULES = ("jinja2", "mkdocs", "material")


def build_cache(args: argparse.Namespace) -> Path | None:
    """--cache DIR, none with --no-cache, else the default cache of this output folder (incremental by default)."""
    if args.no_cache:
        return None
    if args.cache is not None:
        return args.cache
    from cbsite.generator.cache import default_cache_dir

    return default_cache_dir(args.out)


def cmd_build(args: argparse.Namespace) -> int:
    require(*SITE_MODULES)
    from cbsite.generator import build_site

    pairs = [tuple(p.split("..", 1)) for p in args.diff]
    if any(len(p) != 2 for p in pairs):
        raise CbsiteError("--diff takes BASE..HEAD, e.g. --diff dlrm@v1..dlrm@v3")
    note_stale(args.runs)
    out = build_site(args.runs, args.out, config=args.config, perfetto_origin=args.perfetto_origin, extra_diffs=pairs,
                     allow_empty=args.allow_empty, cache=build_cache(args), quiet=verbosity(args) < 1)
    print(f"site built in {out}; view it with: cbsite serve {out}")
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    require(*SITE_MODULES)
    from cbsite.generator import publish_site

    out = publish_site(
        args.runs, args.out, args.site_version, aliases=args.alias, set_default=args.set_default,
        title=args.title, config=args.config, perfetto_origin=args.perfetto_origin, allow_empty=args.allow_empty,
        quiet=verbosity(args) < 1,
    )
    print(f"published version {args.site_version} into {out} (serve it over HTTP: cbsite serve {args.out})")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from cbsite.generator import serve

    serve(args.dir, host=args.host, port=args.port)
    return 0


def add_site_args(p: argparse.ArgumentParser) -> Any:
    """The options every command that builds a site takes, in a group of their own."""
    g = p.add_argument_group("site")
    g.add_argument("--config", type=Path, default=None, help="base mkdocs.yml (default: ./mkdocs.yml when present)")
    g.add_argument("--perfetto-origin", default="https://ui.perfetto.dev", help="Perfetto UI origin (self-hosted too)")
    g.add_argument("--allow-empty", action="store_true",
                   help="let an archive with no readable run replace an existing site (refused otherwise)")
    return g


def add_build_args(g: Any) -> None:
    """Output folder, extra diff pages and the build cache: build's and demo's."""
    g.add_argument("--out", type=Path, default=Path("site"), help="site folder to write (replaced whole once built)")
    g.add_argument("--diff", action="append", default=[], metavar="BASE..HEAD",
                   help="extra diff page beyond each model's consecutive versions, e.g. dlrm@v1..dlrm@v3; repeatable")
    cache = g.add_mutually_exclusive_group()
    cache.add_argument("--cache", type=Path, default=None, metavar="DIR",
                       help="build cache kept between builds: only new or changed runs and their diffs are computed "
                            "(default: one per site folder under the user's cache directory)")
    cache.add_argument("--no-cache", action="store_true", help="build everything afresh, read and write no cache")


def add_parsers(sub: Any, parents: Sequence[argparse.ArgumentParser], archive: argparse.ArgumentParser) -> None:
    p = add_command(sub, "build", "build the site from the archive",
                    "Build the offline MkDocs Material site of the archive: every run, model and diff page. Incremental "
                    "by default (a cache per site folder); --no-cache builds everything afresh.", [*parents, archive])
    add_build_args(add_site_args(p))
    p.set_defaults(func=cmd_build)

    p = add_command(sub, "publish", "publish the site as a version in mike's layout",
                    "Build the site as one version of a versioned site in mike's layout (versions.json, aliases such "
                    "as latest), so Material's version selector works on any static host.", [*parents, archive])
    g = add_site_args(p)
    g.add_argument("--out", type=Path, required=True, help="root folder of the versioned site")
    g.add_argument("--site-version", required=True, help="name of this site version, e.g. 1.2 or the commit")
    g.add_argument("--alias", action="append", default=[], help="alias of this version, e.g. latest; repeatable")
    g.add_argument("--set-default", action="store_true", help="make the root redirect to this version/alias")
    g.add_argument("--title", default=None, help="title of this version in the selector (default: its name)")
    p.set_defaults(func=cmd_publish)

    p = add_command(sub, "serve", "serve a built or published site on localhost",
                    "Serve a built or published site over HTTP (its pages need HTTP, not file://).", parents)
    p.add_argument("dir", type=Path, nargs="?", default=Path("site"), help="site folder (default: site)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (0: any free port)")
    p.set_defaults(func=cmd_serve)
