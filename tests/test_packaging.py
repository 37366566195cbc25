"""cbsite as a wheel: the site's templates ship inside the package, so an installed cbsite with no source tree
builds a site from the demo runs (tests/data/runs).

The wheel is built from a copy of the package's sources (never in the repository, where setuptools would leave
build/ behind), with the development venv's setuptools (`--no-build-isolation`: no package index needed).
It is installed with `--no-deps` into a fresh venv (no system site packages). Its dependencies (polars, jinja2,
mkdocs-material, ...) are not downloaded again: a `.pth` file appends the development venv's site-packages
to the fresh venv's path, after the fresh venv's own, so `cbsite` itself can only come from the wheel (the
development venv's editable-install hook is a `.pth` file in that folder, and `.pth` files of a folder added
this way are not processed). The test checks that `cbsite` is imported from the fresh venv, and runs it in a
temporary working directory outside the repository.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "cbsite" / "generator" / "templates"


def _digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{cmd}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copyfile(ROOT / name, src / name)
    shutil.copytree(ROOT / "cbsite", src / "cbsite", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", str(src), "-w", str(out)], cwd=src)
    (whl,) = out.glob("cbsite-*.whl")
    return whl


def test_wheel_carries_every_template(wheel):
    """Every file of cbsite/generator/templates/ is in the wheel, byte for byte (so sites do not change)."""
    with zipfile.ZipFile(wheel) as zf:
        shipped = {n[len("cbsite/generator/templates/"):]: hashlib.sha256(zf.read(n)).hexdigest()
                   for n in zf.namelist() if n.startswith("cbsite/generator/templates/") and not n.endswith("/")}
        assert "cbsite/diff/diff.schema.json" in zf.namelist()
    assert shipped == _digest(TEMPLATES)
    for needed in ("mkdocs.defaults.yml", "pages/run.md.j2", "pages/_macros.j2", "assets/icicle.js", "publish/redirect.html.j2"):
        assert needed in shipped


def _metadata(wheel: Path) -> tuple[str, list[str]]:
    """The wheel's METADATA text and the names in its dist-info."""
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return zf.read(meta).decode(), zf.namelist()


def _requires(text: str) -> list[str]:
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def test_wheel_license_metadata_is_an_spdx_expression_with_its_file(wheel):
    """PEP 639: `License-Expression` (SPDX) and the license text shipped under dist-info/licenses, no legacy field."""
    text, names = _metadata(wheel)
    fields = dict(line.split(": ", 1) for line in text.split("\n\n")[0].splitlines() if ": " in line)
    assert tuple(map(int, fields["Metadata-Version"].split("."))) >= (2, 4)
    assert fields["License-Expression"] == "BSD-3-Clause"
    assert fields["License-File"] == "LICENSE"
    assert "License" not in fields  # the legacy free-text field
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def test_collect_extra_leaves_torchrec_to_its_own_extra(wheel):
    """A plain-PyTorch team installs cbsite[collect] without torchrec or fbgemm; cbsite[torchrec] adds them."""
    needs = _requires(_metadata(wheel)[0])
    by_extra: dict[str, list[str]] = {}
    for need in needs:
        extra = need.split("extra ==")[-1].strip().strip("'\"") if "extra ==" in need else ""
        by_extra.setdefault(extra, []).append(need.split(";")[0].strip())
    assert any(n.startswith("torch>=") for n in by_extra["collect"])
    assert not [n for n in by_extra["collect"] + by_extra[""] if n.startswith(("torchrec", "fbgemm"))]
    assert "cbsite[collect]" in by_extra["torchrec"] and any(n.startswith("torchrec>=") for n in by_extra["torchrec"])


def test_install_hints_name_the_extra_that_brings_the_package(wheel, monkeypatch):
    """The missing-dependency hint (exit 4) reads the extras: torchrec -> cbsite[torchrec], torch -> cbsite[collect]."""
    import importlib.metadata

    from cbsite.cli import _install_target

    needs = _requires(_metadata(wheel)[0])
    monkeypatch.setattr(importlib.metadata, "requires", lambda name: needs if name == "cbsite" else None)
    assert _install_target("torchrec") == "'cbsite[torchrec]'"
    assert _install_target("torch") == "'cbsite[collect]'"
    assert _install_target("mkdocs") == "'cbsite[site]'"


@pytest.mark.slow
def test_installed_wheel_builds_the_demo_runs(demo_runs, wheel, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    py = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet", "--no-deps", "--no-index", str(wheel)], cwd=tmp_path)
    purelib = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp_path).stdout.strip())
    (purelib / "zz_cbsite_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    work = tmp_path / "work"  # a user's folder: the demo runs, no source tree, no mkdocs.yml
    shutil.copytree(demo_runs, work / "runs")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["CBSITE_BUILD_JOBS"] = "1"
    where = _run([str(py), "-c", "import cbsite, cbsite.generator.templating as p; print(cbsite.__file__); print(p.TEMPLATES)"],
                 cwd=work, env=env).stdout.split()
    assert all(Path(w).is_relative_to(venv) for w in where), where
    assert not any(Path(w).is_relative_to(ROOT) for w in where), where
    plugin = _run([str(py), "-c", "from importlib.metadata import entry_points as e; "
                   "print(*[x.value for x in e(group='mkdocs.plugins', name='cbsite')])"], cwd=work, env=env).stdout.strip()
    assert plugin == "cbsite.generator.plugin:CbsitePlugin"  # the MkDocs plugin is registered by the wheel

    _run([str(venv / "bin" / "cbsite"), "build", "--runs", "runs", "--out", "site"], cwd=work, env=env)
    site = work / "site"
    assert (site / "index.html").is_file()
    assert (site / "models" / "dlrm" / "index.html").is_file()
    assert sorted((site / "runs" / "dlrm").iterdir())
    assert (site / "diffs" / "dlrm" / "v1" / "v2" / "index.html").is_file()
    for asset in ("icicle.js", "format.js", "cbsite.css", "vega.js"):
        assert (site / "assets" / "cbsite" / asset).is_file(), asset
    assert (site / "assets" / "cbsite" / "icicle.js").read_bytes() == (TEMPLATES / "assets" / "icicle.js").read_bytes()
    assert "assets/cbsite/cbsite.css" in (site / "index.html").read_text()
