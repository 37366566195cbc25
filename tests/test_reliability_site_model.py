"""Sites written atomically and only where cbsite may, the caller's
model left as it was found, no backward for no_grad calls, refused inputs and budgets, gates that cannot be
turned off by a typo, honest failure counts, one-line errors for the user's code.

Every test here failed on the code before the fix. Kill and concurrency tests run real `cbsite build`
processes and send real signals; nothing asserts a wall-clock time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import cbsite
from cbsite import gate as cgate
from cbsite.cli import main
from cbsite.diff.rundiff import diff_runs
from cbsite.errors import CbsiteError
from cbsite.generator import build_site, publish_site
from cbsite.generator.sitedir import MARKER, locked
from tests.helpers.modules import FailsWhenAlone
from tests.helpers.runfactory import make_run, write_archive
from tests.helpers.site_archives import synthetic_run

REPO = Path(__file__).resolve().parent.parent


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _archive(root: Path, model: str, runs: int, n: int = 200) -> Path:
    for i in range(runs):
        synthetic_run(root, model, f"v{i}", n=n, seed=i, minutes=i)
    return root


def _cbsite(*args: str, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "CBSITE_BUILD_JOBS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "cbsite", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _staging(out: Path) -> list[Path]:
    return [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.cbsite-build-")]


# --- 2. a killed build, concurrent builds --------------------------------------------------------------


def test_sigkill_mid_build_leaves_the_old_site_whole(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./mkdocs.yml: the same configuration as the subprocesses
    old_runs = _archive(tmp_path / "old-runs", "old", 2, n=20)
    site = build_site(old_runs, tmp_path / "site", quiet=True)
    before = _digest(site)
    new_runs = _archive(tmp_path / "runs", "big", 30)

    proc = _cbsite("build", "--runs", "runs", "--out", "site", cwd=tmp_path)
    deadline = time.monotonic() + 300
    seen_at = None
    while time.monotonic() < deadline and proc.poll() is None:
        # The stage folder proper, not the early-artifacts folder named after it (which holds nothing here).
        stage = [p for p in _staging(site) if "-artifacts-" not in p.name]
        if stage and seen_at is None:
            seen_at = time.monotonic()
        # Kill once the new site is being written, or half a second into rendering it (a fast machine renders
        # 30 runs in a few seconds: CI once finished the build inside the 3 s this used to wait); or, before the
        # fix, once the old site was emptied.
        try:
            writing = bool(stage) and any(stage[0].iterdir())
        except FileNotFoundError:  # swapped in between the two calls: the build is over, the assert below says so
            break
        if writing or (seen_at is not None and time.monotonic() - seen_at > 0.5) \
                or not (site / "index.html").exists():
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL, "the build ended before it was killed: make the archive bigger"
    assert _digest(site) == before  # the old site, every file of it, and nothing else

    # The next build removes what the killed one left beside the site and swaps in the new site.
    assert main(["build", "--runs", str(new_runs), "--out", "site"]) == 0
    assert not _staging(site)
    assert not [p.name for p in tmp_path.iterdir() if "artifacts" in p.name]  # the early-published artifacts too
    assert (site / "models" / "big" / "index.html").is_file() and not (site / "models" / "old").exists()


def test_two_concurrent_builds_into_one_folder_never_mix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a, b = _archive(tmp_path / "runs-a", "alpha", 12), _archive(tmp_path / "runs-b", "beta", 12)
    refs = {"a": _digest(build_site(a, tmp_path / "ref-a", quiet=True)),
            "b": _digest(build_site(b, tmp_path / "ref-b", quiet=True))}
    procs = [_cbsite("build", "--runs", str(r), "--out", "site", cwd=tmp_path) for r in (a, b)]
    results = [(p.wait(timeout=600), p.communicate()[1]) for p in procs]
    for code, err in results:
        assert code == 0 or (code == 2 and "another cbsite build or publish" in err and err.count("\n") == 1), err
    assert any(code == 0 for code, _ in results)
    final = _digest(tmp_path / "site")
    assert final in (refs["a"], refs["b"])  # one archive's site, whole: never a mix of the two


def test_a_held_lock_refuses_a_second_build(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = _archive(tmp_path / "runs", "m", 1, n=10)
    with locked(tmp_path / "site"):
        with pytest.raises(CbsiteError, match="another cbsite build or publish .* is writing"):
            build_site(runs, tmp_path / "site", quiet=True)
    assert build_site(runs, tmp_path / "site", quiet=True) == tmp_path / "site"


# --- 3. which folders a build may replace ----------------------------------------------------------------


def test_a_folder_cbsite_did_not_write_is_never_replaced(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    runs = _archive(tmp_path / "runs", "m", 1, n=10)
    mine = tmp_path / "thesis"
    (mine / "src").mkdir(parents=True)
    (mine / "index.html").write_text("<h1>my thesis</h1>")
    (mine / "src" / "main.tex").write_text("\\documentclass{article}")
    before = _digest(mine)
    assert main(["build", "--runs", "runs", "--out", "thesis"]) == 2
    err = capsys.readouterr().err
    assert MARKER in err and "choose an empty or new folder" in err and err.count("\n") == 1
    assert main(["publish", "--runs", "runs", "--out", "thesis", "--site-version", "1.0"]) == 2
    assert _digest(mine) == before

    site = build_site(runs, tmp_path / "site", quiet=True)  # a site cbsite built carries the marker...
    assert (site / MARKER).is_file()
    assert build_site(runs, site, quiet=True) == site  # ...and is replaced


def test_out_equal_to_containing_or_inside_the_archive_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    runs = _archive(tmp_path / "runs", "dlrm", 2, n=10)
    (tmp_path / "index.html").write_text("hi")  # a stray index.html in the repository
    before = _digest(runs)
    for argv in (["build", "--runs", "runs", "--out", "."],
                 ["build", "--runs", "runs", "--out", "runs"],
                 ["build", "--runs", "runs", "--out", "runs/dlrm"],
                 ["publish", "--runs", "runs", "--out", "runs", "--site-version", "dlrm"],
                 ["publish", "--runs", "runs", "--out", ".", "--site-version", "1.0"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "archive" in err or "working directory" in err, (argv, err)
    assert _digest(runs) == before and (tmp_path / "index.html").read_text() == "hi"


def test_demo_refuses_its_out_before_collecting(tmp_path, monkeypatch):
    import cbsite.collector.collect as collect_module

    def collect(*_a, **_k):
        raise AssertionError("collected before the site folder was checked")

    monkeypatch.setattr(collect_module, "collect", collect)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert main(["demo", "--runs", "runs", "--out", "runs", "--no-progress"]) == 2


def test_an_empty_archive_does_not_replace_a_site_silently(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    runs = _archive(tmp_path / "runs", "m", 2, n=10)
    site = build_site(runs, tmp_path / "site", quiet=True)
    before = _digest(site)
    assert main(["build", "--runs", "rnus", "--out", "site"]) == 2  # a mistyped --runs
    err = capsys.readouterr().err
    assert "does not exist" in err and "--allow-empty" in err
    assert _digest(site) == before
    assert main(["build", "--runs", "rnus", "--out", "site", "--allow-empty"]) == 0
    assert "cbsite collect dlrm --version v1" in (site / "index.html").read_text()

    published = tmp_path / "published"
    publish_site(runs, published, "1.0", aliases=["latest"], quiet=True)
    latest = _digest(published / "latest")
    with pytest.raises(CbsiteError, match="allow-empty"):
        publish_site(tmp_path / "empty", published, "2.0", aliases=["latest"], quiet=True)
    assert _digest(published / "latest") == latest and not (published / "2.0").exists()


# --- 7. no_grad calls, generator inputs -------------------------------------------------------------------


class FrozenBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trained = nn.Linear(16, 16)
        self.frozen = nn.Linear(16, 16)
        self.twice = nn.Linear(16, 16)

    def forward(self, x):
        with torch.no_grad():
            f = self.frozen(x)
            a = self.twice(x)
        return self.trained(x) + f + self.twice(a)


def test_a_call_under_no_grad_gets_no_backward(fast_config):
    x = torch.randn(4, 16)
    run = cbsite.profile(FrozenBranch(), x, config=fast_config)
    fwd = {r["path"]: r for r in run.table("forward").to_dicts()}
    bwd = {r["path"]: r for r in run.table("backward").to_dicts()}
    assert fwd["frozen"]["flops"] == 2 * 4 * 16 * 16
    assert bwd["frozen"]["status"] == "skipped" and "grad disabled" in bwd["frozen"]["error"]
    assert bwd["frozen"]["flops"] is None
    # Called twice, once under no_grad: only the other call is differentiated (dW: its input came from a
    # no_grad call), per call over both.
    assert bwd["twice"]["status"] == "measured" and bwd["twice"]["flops"] == (2 * 4 * 16 * 16) // 2
    assert any("1 of 2 calls" in n for n in bwd["twice"]["notes"])
    # The whole model's backward is what the model really differentiates: `trained` (dW) and `twice` (dW).
    assert bwd[""]["flops"] == 2 * (2 * 4 * 16 * 16)


def test_generator_and_iterator_inputs_are_refused(fast_config):
    model = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(CbsiteError, match="generator, an iterator.*list or tuple"):
        cbsite.profile(model, (t for t in [torch.randn(2, 4)]), config=fast_config)
    with pytest.raises(CbsiteError, match="keyword argument 'xs'.*list_iterator"):
        cbsite.profile(model, xs=iter([torch.randn(2, 4)]), config=fast_config)


# --- 8. the caller's model left alone ---------------------------------------------------------------------


class Norms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Sequential(nn.Linear(8, 4), nn.BatchNorm1d(4))

    def forward(self, x):
        return self.head(self.drop(torch.relu(self.bn(self.lin(x)))))


def _state(model: nn.Module) -> dict[str, tuple]:
    out = {}
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        out[name] = (t, t.detach().clone(), t.dtype, t.device, t.requires_grad,
                     None if t.grad is None else t.grad.clone())
    return out


def _assert_same(model: nn.Module, before: dict[str, tuple]) -> None:
    after = dict(list(model.named_parameters()) + list(model.named_buffers()))
    assert set(after) == set(before)
    for name, (obj, values, dtype, device, req, grad) in before.items():
        t = after[name]
        assert t is obj, name  # the same tensor objects (an optimizer holds them)
        assert t.dtype == dtype and t.device == device and t.requires_grad == req, name
        assert torch.equal(t.detach().view(-1).view(torch.uint8), values.view(-1).view(torch.uint8)), name  # bit for bit
        assert (t.grad is None) == (grad is None) and (grad is None or torch.equal(t.grad, grad)), name


def test_profiling_leaves_batchnorm_state_flags_grads_and_rng_as_found(fast_config):
    torch.manual_seed(0)
    model = Norms().train()
    model.head.eval()  # mixed training flags
    model.lin.bias.requires_grad_(False)
    model.lin.weight.grad = torch.full_like(model.lin.weight, 0.25)
    before = _state(model)
    assert int(model.bn.num_batches_tracked) == 0
    flags = [m.training for m in model.modules()]
    x = torch.randn(16, 8)
    torch_state, py_state, np_state = torch.get_rng_state(), random.getstate(), np.random.get_state()
    expected = (torch.rand(5), random.random(), np.random.rand(3))
    torch.set_rng_state(torch_state), random.setstate(py_state), np.random.set_state(np_state)

    run = cbsite.profile(model, x, config=fast_config)
    assert {r["status"] for r in run.table("forward").to_dicts()} <= {"measured", "estimated"}
    # The whole-model step ran (it changes modes and leaves gradients; the collection puts both back).
    assert run.meta["step"]["train"]["status"] == "measured" and run.meta["config"]["training"] is True

    _assert_same(model, before)
    assert int(model.bn.num_batches_tracked) == 0
    assert [m.training for m in model.modules()] == flags
    got = (torch.rand(5), random.random(), np.random.rand(3))
    assert torch.equal(got[0], expected[0]) and got[1] == expected[1] and np.array_equal(got[2], expected[2])


def test_a_bf16_collection_leaves_the_model_float32(fast_config):
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    before = _state(model)
    run = cbsite.profile(model, torch.randn(4, 8), config=dataclasses.replace(fast_config, dtype="bfloat16"))
    assert run.meta["dtype"] == "bfloat16"
    _assert_same(model, before)
    assert model(torch.randn(4, 8)).dtype == torch.float32


def test_a_model_is_left_alone_when_profiling_fails(fast_config):
    class Breaks(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bn = nn.BatchNorm1d(4)

        def forward(self, x):
            self.bn(x)
            raise ValueError("the user's bug")

    model = Breaks()
    before = _state(model)
    with pytest.raises(CbsiteError, match="forward on example batch 0 raised ValueError: the user's bug"):
        cbsite.profile(model, torch.randn(4, 4), config=dataclasses.replace(fast_config, dtype="bfloat16"))
    _assert_same(model, before)


@pytest.mark.gpu
def test_a_cuda_collection_leaves_the_model_on_the_cpu(fast_config):
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))
    before = _state(model)
    cbsite.profile(model, torch.randn(4, 8), config=dataclasses.replace(fast_config, device="cuda"))
    _assert_same(model, before)


# --- 9. budgets -----------------------------------------------------------------------------------------------


def test_budget_nan_inf_and_absurd_are_refused_up_front(capsys):
    from cbsite.cli import build_parser
    from cbsite.cli.collect import collect_config as _collect_config

    for budget in ("nan", "inf", "-inf", "0", "-1", "1e9"):
        args = build_parser().parse_args(["collect", "dlrm", f"--budget={budget}"])
        with pytest.raises(CbsiteError, match="time budget"):
            _collect_config(args)
    with pytest.raises(CbsiteError) as err:  # every problem in one message
        cbsite.collector.CollectConfig(min_run_time=float("nan"), warmup=-1, max_depth=-1, dtype="fp8")
    for part in ("time budget", "warmup", "--max-depth", "dtype"):
        assert part in str(err.value), part
    assert main(["collect", "dlrm", "--budget", "nan", "--no-progress"]) == 2
    err_text = capsys.readouterr().err
    assert err_text.startswith("cbsite: error:") and err_text.count("\n") == 1


# --- 10. gate typos, failure counts, one-line errors ----------------------------------------------------------


def test_a_gate_rule_that_matches_nothing_is_an_error(tmp_path, capsys):
    spec = {"": {"over_arch": {"over_arch.0": None, "over_arch.1": None}, "bottom": None}}
    base = make_run(spec, model="m", version="v1", metrics={"over_arch.0": {"flops": 100}})
    head = make_run(spec, model="m", version="v2", metrics={"over_arch.0": {"flops": 200}})
    rd = diff_runs(base, head)
    with pytest.raises(CbsiteError, match=r"'overarch\.\*' matches no component \(did you mean 'over_arch'"):
        cgate.check(rd, cgate.parse_rules(["overarch.*:flops>+5%", "flops>+500%"]))
    assert not cgate.check(rd, cgate.parse_rules(["over_arch.*:flops>+5%"])).passed  # the right glob still bites

    write_archive(tmp_path / "runs", [base, head])
    code = main(["diff", "m@v1", "m@v2", "--runs", str(tmp_path / "runs"), "--fail-on", "overarch.*:flops>+5%"])
    out = capsys.readouterr()
    assert code == 2 and "matches no component" in out.err and "gate passed" not in out.out


class _NoBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("no backward here")


class _BadBackward(nn.Module):
    def forward(self, x):
        return _NoBackward.apply(x)


def test_failed_counts_count_failed_parents_and_backwards(fast_config):
    model = nn.Sequential(FailsWhenAlone(), nn.Linear(8, 8), _BadBackward())
    run = cbsite.profile(model, torch.randn(4, 8), config=fast_config)
    rows = {(r["path"], r["phase"]): r for r in run.table().to_dicts()}
    assert rows[("0", "forward")]["status"] == "estimated"  # failed, estimated from its child
    assert rows[("", "forward")]["status"] == "estimated"  # the root replays 0, so it fails too
    assert rows[("2", "backward")]["status"] == "failed" and rows[("2", "forward")]["status"] == "measured"
    # Failed measurements: the root and 0 in both phases (their rows say estimated), 2's backward; the counts
    # follow the forward rows, where nothing is left failed.
    assert run.meta["failed_measurements"] == 5
    assert run.meta["counts"]["failed"] == 0 and run.meta["counts"]["estimated"] == 2
    assert run.meta["components"] == 5


def test_provider_and_forward_errors_are_one_line_with_the_traceback_in_a_file(tmp_path, monkeypatch, capsys):
    (tmp_path / "userpkg_rel.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn

        def raises():
            raise ValueError("cannot load the weights\\nsecond line")

        class Bad(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(4, 4)

            def forward(self, x):
                return self.lin(x) @ torch.ones(3, 3)

        def bad_forward():
            return Bad(), (torch.randn(2, 4),)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    for provider, expected, label in (("userpkg_rel:raises", "ValueError: cannot load the weights second line", "provider"),
                                      ("userpkg_rel:bad_forward", "RuntimeError", "forward")):
        code = main(["collect", provider, "--runs", str(tmp_path / "runs"), "--no-progress", "--budget", "0.001",
                     "--peak-flops", "1e11", "--peak-bandwidth", "1e10", "--no-calibrate"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and expected in err, err
        log = Path(err.rsplit("full traceback in ", 1)[1].rstrip(")\n"))
        assert log.name.startswith(f"cbsite-{label}-") and "Traceback (most recent call last)" in log.read_text()
        log.unlink()
    assert not (tmp_path / "runs").exists()
