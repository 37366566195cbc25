"""A reliable archive: nothing lost, one bad run never takes the rest down, archive content is
untrusted, module paths print as written. Real signals on a real `cbsite collect`, hostile archives
written to disk, a real MkDocs build, real profiles of a model with bracketed module names."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cbsite import archive, artifacts, leftovers
from cbsite.errors import CbsiteError
from tests.helpers.runfactory import make_run, write_archive

ROOT = Path(__file__).resolve().parents[1]
CBSITE = [sys.executable, "-m", "cbsite"]
SPEC = {"": {"a": {"a.x": None, "a.y": None}, "b": None}}


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CBSITE, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def _glob_rows(root: Path) -> tuple[set[str], int, set[str], int]:
    """What the README's readers see: polars' and DuckDB's `runs/**/components.parquet` (run ids, rows)."""
    pattern = f"{root}/**/components.parquet"
    df = pl.scan_parquet(pattern).select("run_id").collect()
    duckdb = pytest.importorskip("duckdb")
    dd = duckdb.sql(f"select run_id from read_parquet('{pattern}')").fetchall()
    return set(df.get_column("run_id").to_list()), df.height, {r[0] for r in dd}, len(dd)


# --- 1. crash safety: real signals on a real collect ---------------------------------------------

# `cbsite collect` as it is, except that saving stops right after components.parquet is staged: the signal
# then lands in the middle of a save, deterministically.
SAVE_HOOK = """
import sys, time
import pyarrow.parquet as pq
real = pq.write_table
def staged_then_wait(table, where, *args, **kwargs):
    real(table, where, *args, **kwargs)
    if str(where).endswith("components.parquet.partial"):
        print("staged", flush=True)
        time.sleep(600)
pq.write_table = staged_then_wait
from cbsite.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killed_collect_leaves_nothing_a_reader_sees_and_gc_removes_the_rest(sig, tmp_path):
    root = tmp_path / "runs"
    [complete] = write_archive(root, [make_run(SPEC, model="m", version="v1")])
    complete_rows = pl.read_parquet(complete / "components.parquet").height
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "CBSITE_QUIET": "1"}
    args = ["collect", "nanogpt", "-o", "size=tiny", "--max-depth", "1", "--phases", "forward", "--budget", "0.005",
            "--peak-flops", "1e11", "--peak-bandwidth", "1e10", "--no-calibrate", "--no-progress", "--no-step",
            "--max-component-s", "0.5", "--runs", str(root),
            "--plugin", "trace", "--plugin", "log", "--version", "v1"]
    proc = subprocess.Popen([sys.executable, "-c", SAVE_HOOK, *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(540, proc.kill)
    watchdog.start()
    try:
        line = proc.stdout.readline()
        assert line.strip() == "staged", proc.communicate()[1]
        # Mid-save: the run is staged with every file it will have, and no reader glob sees any of it.
        staged = sorted(p.name.split("-")[0] for p in (root / archive.STAGING_DIR).iterdir())
        assert staged == ["artifacts", "run"]
        assert _glob_rows(root) == ({complete.name}, complete_rows, {complete.name}, complete_rows)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=120)
    finally:
        watchdog.cancel()
        proc.kill()

    assert _glob_rows(root) == ({complete.name}, complete_rows, {complete.name}, complete_rows)
    assert [r.path for r in archive.list_runs(root)] == [complete]
    assert not [p for p in tmp.iterdir() if p.name.startswith("cbsite")]  # plugin staging never in the temp dir
    if sig == signal.SIGTERM:
        # Handled as Ctrl-C is: one line, exit 143, every cleanup ran (the save's and the plugins').
        assert proc.returncode == 143, stderr
        assert stderr.strip().splitlines()[-1] == "cbsite: terminated" and "Traceback" not in stderr, stderr
        assert leftovers.stale_staging(root) == [] and list((root / archive.STAGING_DIR).iterdir()) == []
        return
    assert proc.returncode == -signal.SIGKILL
    stale = leftovers.stale_staging(root)
    assert sorted(s.path.name.split("-")[0] for s in stale) == ["artifacts", "run"]
    assert all("is gone" in s.reason for s in stale)

    ls = _cli("ls", "--runs", str(root), cwd=tmp_path)
    assert ls.returncode == 0 and f"cbsite gc --runs {root}" in ls.stderr and "2 unfinished" in ls.stderr, ls.stderr
    dry = _cli("gc", "--runs", str(root), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0 and dry.stdout.count("would remove") == 2, dry.stdout
    assert len(leftovers.stale_staging(root)) == 2  # a dry run removes nothing
    gc = _cli("gc", "--runs", str(root), cwd=tmp_path)
    assert gc.returncode == 0 and gc.stdout.count("removed") == 2, gc.stdout
    assert leftovers.stale_staging(root) == [] and list((root / archive.STAGING_DIR).iterdir()) == []
    assert [r.path for r in archive.list_runs(root)] == [complete]
    ls = _cli("ls", "--runs", str(root), cwd=tmp_path)
    assert "cbsite gc" not in ls.stderr


def test_staging_of_a_live_writer_is_never_stale_and_older_partials_are(tmp_path):
    root = tmp_path / "runs"
    [complete] = write_archive(root, [make_run(SPEC, model="m", version="v1")])
    mine = archive.new_staging(archive.staging_dir(root), "run-")  # owned by this (live) process
    other = archive.new_staging(archive.staging_dir(root), "run-")
    owner = json.loads((other / archive.OWNER_FILE).read_text())
    (other / archive.OWNER_FILE).write_text(json.dumps({**owner, "host": "elsewhere"}))  # recent, another host
    # A half-written run staged the way cbsite did before (a dot-folder in the version).
    legacy = complete.parent / ".20260101T000000Z-abcdef.partial"
    legacy.mkdir()
    (legacy / "components.parquet").write_bytes((complete / "components.parquet").read_bytes()[:3000])
    with pytest.raises(pl.exceptions.PolarsError):
        pl.scan_parquet(f"{root}/**/components.parquet").collect()  # what the glob did with such remains
    assert [s.path for s in leftovers.stale_staging(root)] == [legacy]
    assert [s.path for s in leftovers.remove_stale(root)] == [legacy]
    assert mine.is_dir() and other.is_dir() and not legacy.exists()
    assert pl.scan_parquet(f"{root}/**/components.parquet").collect().height == pl.read_parquet(complete / "components.parquet").height


@pytest.mark.slow
def test_collect_and_build_name_the_gc_command_when_stale_folders_exist(tmp_path):
    root = tmp_path / "runs"
    write_archive(root, [make_run(SPEC, model="m", version="v1")])
    stale = archive.new_staging(archive.staging_dir(root), "run-")
    (stale / archive.OWNER_FILE).write_text(json.dumps({"pid": 2**22 + 12345, "host": os.uname().nodename}))
    hint = f"1 unfinished run folder in {root} left by interrupted runs; remove it with: cbsite gc --runs {root}"
    collect = _cli("collect", "no_such_module_xyz:build", "--runs", str(root), cwd=tmp_path)
    assert collect.returncode == 2 and collect.stderr.splitlines()[0] == f"cbsite: {hint}", collect.stderr
    build = _cli("build", "--runs", str(root), "--out", str(tmp_path / "site"), cwd=tmp_path)
    assert build.returncode == 0 and f"cbsite: {hint}" in build.stderr.splitlines(), build.stderr


# --- 4. readers that never crash: a hostile archive ------------------------------------------------


def _rewrite_rows(run_dir: Path, change) -> None:
    table = pq.read_table(run_dir / "components.parquet")
    pq.write_table(change(table), run_dir / "components.parquet")


def _set_column(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, values)


def _meta_edit(edit):
    def apply(run_dir: Path) -> None:
        meta = json.loads((run_dir / "run.json").read_text())
        edit(meta)
        (run_dir / "run.json").write_text(json.dumps(meta))
    return apply


BROKEN = {
    "list": lambda d: (d / "run.json").write_text("[1, 2]"),
    "not-utf8": lambda d: (d / "run.json").write_bytes(b'{"model": "caf\xe9"}'),
    "version-one": _meta_edit(lambda m: m.update(schema_version="one")),
    "version-null": _meta_edit(lambda m: m.update(schema_version=None)),
    "no-device": _meta_edit(lambda m: m.pop("device")),
    "device-text": _meta_edit(lambda m: m.update(device="cpu")),
    "wrong-types": lambda d: _rewrite_rows(d, lambda t: _set_column(t, "latency_ms", pa.array(["fast"] * t.num_rows))),
    "no-rows": lambda d: _rewrite_rows(d, lambda t: t.slice(0, 0)),
    "orphan": lambda d: _rewrite_rows(d, lambda t: _set_column(t, "parent", pa.array(["nowhere"] * t.num_rows))),
}
META_BROKEN = ("list", "not-utf8", "version-one", "version-null", "no-device", "device-text")


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> dict[str, Path]:
    """An archive of good runs and one broken run per way a run can be broken."""
    root = tmp_path_factory.mktemp("hostile") / "runs"
    runs = {"good": make_run(SPEC, model="good", version="v1"), "good2": make_run(SPEC, model="good", version="v2"),
            "inf": make_run(SPEC, model="odd", version="inf"), "castable": make_run(SPEC, model="odd", version="cast")}
    runs.update({name: make_run(SPEC, model="bad", version=name) for name in BROKEN})
    folders = dict(zip(runs, write_archive(root, runs.values())))
    for name, breaks in BROKEN.items():
        breaks(folders[name])

    def non_finite(t: pa.Table) -> pa.Table:
        latency = t.column("latency_ms").to_pylist()
        latency[1], latency[2] = float("inf"), float("nan")
        return _set_column(t, "latency_ms", pa.array(latency, pa.float64()))

    _rewrite_rows(folders["inf"], non_finite)
    # Types that convert exactly (int64 depth, float32 latency, large strings) are read as the schema's.
    _rewrite_rows(folders["castable"], lambda t: t.cast(pa.schema(
        [pa.field(f.name, pa.int64() if f.name == "depth" else pa.float32() if f.name == "latency_ms"
                  else pa.large_string() if f.type == pa.string() else f.type, f.nullable) for f in t.schema])))
    # A version folder whose name is not UTF-8, holding a copy of a good run.
    odd_version = root / "good" / os.fsdecode(b"v\xff")
    odd_version.mkdir()
    (odd_version / folders["good"].name).mkdir()
    for f in folders["good"].iterdir():
        (odd_version / folders["good"].name / f.name).write_bytes(f.read_bytes())
    return {"root": root, **folders}


def test_every_broken_run_is_one_error_naming_the_run(hostile):
    for name in BROKEN:
        with pytest.raises(CbsiteError) as info:
            archive.read_run(hostile[name])
        message = str(info.value)
        assert hostile[name].name in message and "\n" not in message, (name, message)
    for name in META_BROKEN:
        with pytest.raises(CbsiteError, match=hostile[name].name):
            archive.read_meta(hostile[name])
    assert "column latency_ms has type string" in _error(hostile["wrong-types"])
    assert "has no rows" in _error(hostile["no-rows"])
    assert "not UTF-8" in _error(hostile["not-utf8"]) and "holds a JSON list" in _error(hostile["list"])
    assert "schema_version must be a whole number, found 'one'" in _error(hostile["version-one"])
    assert "missing device" in _error(hostile["no-device"])


def _error(folder: Path) -> str:
    try:
        archive.read_run(folder)
    except CbsiteError as exc:
        return str(exc)
    raise AssertionError(f"{folder} was read")


def test_non_finite_and_castable_values_are_read_clean(hostile):
    odd = archive.read_run(hostile["inf"])
    assert odd.rows.get_column("latency_ms").to_list()[1:3] == [None, None]
    cast = archive.read_run(hostile["castable"])
    assert cast.rows.schema == archive.read_run(hostile["good"]).rows.schema
    from cbsite.generator import rundata

    data = rundata.components_json(odd, [])
    json.dumps(data, allow_nan=False)  # no NaN or inf reaches the site's JSON


def test_ls_and_show_say_one_line_per_bad_run(hostile, tmp_path):
    root = hostile["root"]
    ls = _cli("ls", "--runs", str(root), cwd=tmp_path)
    assert ls.returncode == 0, ls.stderr
    lines = ls.stdout.splitlines()
    for name in META_BROKEN:
        [row] = [line for line in lines if f" {name} " in line]
        assert "unreadable" in row, row
    assert any("v\\xff" in line and "not a valid version folder name" in line for line in lines), ls.stdout
    assert sum(" good " in line and "synthetic-cpu" in line for line in lines) == 2
    for name in BROKEN:
        show = _cli("show", str(hostile[name]), "--runs", str(root), cwd=tmp_path)
        assert show.returncode == 2 and "Traceback" not in show.stderr, show.stderr
        assert len(show.stderr.strip().splitlines()) == 1 and hostile[name].name in show.stderr, show.stderr


def test_build_skips_each_bad_run_with_a_warning_and_builds_the_rest(hostile, tmp_path):
    from cbsite.generator import build_site

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = build_site(hostile["root"], tmp_path / "site", quiet=True)
    texts = [str(w.message) for w in caught]
    for name in BROKEN:
        assert any(hostile[name].name in t and "skipped" in t for t in texts), (name, texts)
    assert any("v\\xff" in t for t in texts), texts
    site = result.site if hasattr(result, "site") else Path(result)
    built = {p.parent.name for p in (site / "runs").glob("*/*/*/index.html")}
    assert built == {hostile[n].name for n in ("good", "good2", "inf", "castable")}
    inf = json.loads(next((site / "runs").glob(f"odd/inf/{hostile['inf'].name}/components.json")).read_text())
    assert None in inf["forward"]["latency_ms"]


# --- 5. archive content is untrusted ---------------------------------------------------------------


class _Boom:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def untrusted(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("untrusted")
    root = base / "runs"
    secret = base / "home" / ".ssh"
    secret.mkdir(parents=True)
    (secret / "id_rsa").write_text("PRIVATE KEY")
    (secret / "id_rsa.txt").write_text("PRIVATE KEY")
    linked, planted = write_archive(root, [
        make_run(SPEC, model="linked", version="v1"),
        make_run(SPEC, model="planted", version="v1", metrics={"a.x": {"status": "measured"}}),
    ])
    (linked / "artifacts").symlink_to(secret, target_is_directory=True)  # `ln -s ~/.ssh artifacts`
    art = planted / "artifacts" / "a.x"
    art.mkdir(parents=True)
    home = "/home/alice/src/project/model.py"
    frames = [{"filename": home, "line": 3, "name": "forward"}, {"filename": "none", "line": 0, "name": f"{home}(3): forward"}]
    (art / "forward.memory.pickle").write_bytes(pickle.dumps({"device_traces": [[{"action": "alloc", "frames": frames}]],
                                                              "segments": []}))
    (art / "forward.memory.json").write_text(json.dumps(
        {"title": "t", "snapshot": "forward.memory.pickle", "timeline": {"frames": [f"forward ({home}:3)"]}}))
    (art / "backward.memory.json").write_text(json.dumps({"title": "t", "snapshot": "javascript:alert(1)", "timeline": {}}))
    (art / "log.txt").write_text(f'Traceback:\n  File "{home}", line 3\n')
    (art / "forward.trace.json.gz").write_bytes(gzip.compress(json.dumps({"traceName": "/tmp/tmpabc.json",
                                                                          "stack": [f"{home}(3): forward"]}).encode()))
    (art / "x.html").write_text("<script>alert(document.cookie)</script>")
    (art / "y.js").write_text("alert(1)")
    (art / "z.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>')
    (art / "leak.txt").symlink_to(secret / "id_rsa.txt")
    (art / "evil.memory.pickle").write_bytes(pickle.dumps(_Boom(str(base / "pwned"))))
    _rewrite_rows(planted, lambda t: _set_column(t, "memory_file", pa.array(
        ["artifacts/a.x/x.html" if p == "a.x" else None for p in t.column("path").to_pylist()], pa.string())))
    return {"base": base, "root": root, "linked": linked, "planted": planted}


@pytest.fixture(scope="module")
def untrusted_site(untrusted, tmp_path_factory) -> tuple[Path, list[str]]:
    from cbsite.generator import build_site

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = build_site(untrusted["root"], tmp_path_factory.mktemp("site") / "site", quiet=True)
    site = result.site if hasattr(result, "site") else Path(result)
    return site, [str(w.message) for w in caught]


def _published(site: Path, run: Path) -> Path:
    return next((site / "runs").glob(f"*/*/{run.name}"))


def test_a_symlinked_artifacts_folder_publishes_nothing(untrusted, untrusted_site):
    site, texts = untrusted_site
    assert not (_published(site, untrusted["linked"]) / "artifacts").exists()
    assert not [p for p in site.rglob("*") if "id_rsa" in p.name]
    assert not any(b"PRIVATE KEY" in p.read_bytes() for p in site.rglob("*") if p.is_file())
    assert any("artifacts is a symbolic link" in t for t in texts), texts


def test_only_known_artifact_types_from_real_files_are_published(untrusted, untrusted_site):
    site, texts = untrusted_site
    out = _published(site, untrusted["planted"]) / "artifacts" / "a.x"
    assert sorted(p.name for p in out.iterdir()) == [
        "backward.memory.json", "forward.memory.json", "forward.memory.pickle", "forward.trace.json.gz", "log.txt"]
    for name in ("x.html", "y.js", "z.svg", "leak.txt", "evil.memory.pickle"):
        assert any(name in t and "not published" in t for t in texts), (name, texts)
    assert not (untrusted["base"] / "pwned").exists()  # the hostile pickle was never run, nor published
    comps = json.loads((_published(site, untrusted["planted"]) / "components.json").read_text())
    assert not any(comps[phase]["memory_file"][i] for phase in comps["phases"] for i in range(len(comps["path"])))


def test_memory_links_stay_beside_the_timeline_and_no_local_path_is_published(untrusted, untrusted_site):
    site, _ = untrusted_site
    out = _published(site, untrusted["planted"]) / "artifacts" / "a.x"
    assert json.loads((out / "backward.memory.json").read_text())["snapshot"] is None  # was javascript:alert(1)
    assert json.loads((out / "forward.memory.json").read_text())["snapshot"] == "forward.memory.pickle"
    texts = {
        "memory.json": (out / "forward.memory.json").read_text(),
        "pickle": json.dumps(artifacts.plain_unpickle((out / "forward.memory.pickle").read_bytes())),
        "log": (out / "log.txt").read_text(),
        "trace": gzip.decompress((out / "forward.trace.json.gz").read_bytes()).decode(),
    }
    for kind, text in texts.items():
        assert "/home/" not in text and "alice" not in text and "/tmp/" not in text, (kind, text)
        assert "project/model.py" in text or kind == "trace" and "project/model.py" in text, (kind, text)
    # The site's viewer checks the link too (defence in depth for archives published by other tools).
    viewer = (ROOT / "cbsite" / "generator" / "templates" / "assets" / "memory.html").read_text()
    assert "snapshot.protocol === dataUrl.protocol" in viewer


def test_relative_paths_keep_what_is_not_a_local_path():
    keep = ["torch/nn/modules/linear.py(130): forward", "https://ui.perfetto.dev/#!/x/y", "10 GB/s", "aten::add", "a/b"]
    assert [artifacts.relative_paths(t) for t in keep] == keep
    assert artifacts.relative_paths("/usr/lib/python3.11/site-packages/torch/nn/x.py:3") == "torch/nn/x.py:3"
    assert artifacts.relative_paths("(/home/bob/x.py:1)") == "(x.py:1)"


# --- 6. module paths print as written ---------------------------------------------------------------

ODD_KEYS = ("[/x]", "[click]", "tick`s|pipe")


@pytest.fixture(scope="module")
def bracketed(tmp_path_factory, fast_config_module) -> tuple[Path, str, str]:
    import torch
    from torch import nn

    from cbsite.collector import profile

    class Net(nn.Module):
        """ModuleDict keys that rich would read as markup and Markdown as code fences or table cells."""

        def __init__(self, hidden: int, extra: bool) -> None:
            super().__init__()
            keys = ODD_KEYS + (("[new]",) if extra else ())
            self.blocks = nn.ModuleDict({k: nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 8)) for k in keys})
            self.head = nn.Linear(8, 2)

        def forward(self, x):
            for block in self.blocks.values():
                x = block(x)
            return self.head(x)

    root = tmp_path_factory.mktemp("bracketed") / "runs"
    base = profile(Net(8, False), torch.randn(4, 8), model_name="odd", version="v1", config=fast_config_module)
    head = profile(Net(32, True), torch.randn(4, 8), model_name="odd", version="v2", config=fast_config_module)
    base.save(root)
    head.save(root)
    return root, base.run_id, head.run_id


@pytest.fixture(scope="module")
def fast_config_module():
    import dataclasses

    from cbsite.collector import CollectConfig

    options = dict(min_run_time=0.005, warmup=1, calibrate=False, peak_flops=1e11, peak_bandwidth=1e10,
                   progress=False, phases=("forward",), step=False)  # no whole-model step: not what is tested here
    known = {f.name for f in dataclasses.fields(CollectConfig)}
    return CollectConfig(**{k: v for k, v in options.items() if k in known})


def test_show_prints_bracketed_module_paths_as_written(bracketed, capsys):
    from cbsite import cli

    root, _, head = bracketed
    assert cli.main(["show", head, "--runs", str(root), "--top", "50"]) == 0
    out = capsys.readouterr().out
    for key in ODD_KEYS + ("[new]",):
        assert f"blocks.{key}" in out, (key, out)


def test_markdown_and_terminal_diffs_show_paths_as_written(bracketed):
    import io

    from markdown_it import MarkdownIt
    from rich.console import Console

    from cbsite import review
    from cbsite.diff.rundiff import diff_runs

    root, base, head = bracketed
    rd = diff_runs(archive.read_run(archive.resolve_run(base, root).path), archive.read_run(archive.resolve_run(head, root).path))
    text = review.markdown(rd)
    html = MarkdownIt("commonmark").enable("table").render(text)  # GitHub's reading: CommonMark + tables
    for key in ODD_KEYS + ("[new]",):
        assert f"<code>blocks.{key}</code>" in html, (key, text)
    console = Console(file=io.StringIO(), width=250)
    review.print_table(rd, None, console)
    printed = console.file.getvalue()
    assert "blocks.[new]" in printed and "blocks.tick`s|pipe" in printed, printed
