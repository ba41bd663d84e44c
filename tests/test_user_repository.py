"""A user's own repository: its model package and perf tests that import only perfbudget.

Budgets are written by ``--update-budgets``, then pass, then a planted change in the
model (a wider hidden layer) fails the checks it should, each naming its budget file:line.
A ``perf.step`` test marked ``instructions`` is timed in a plain session and counted under
``perfbudget instructions``, where a planted few % more work per step fails its count.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from perfbudget.metrics import lookup

MODEL = '''
"""The user's model: a small MLP classifier with a configurable hidden width."""
import torch
from torch import nn

HIDDEN = {hidden}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, 10))

    def forward(self, x):
        return self.body(x)


class Trainer:
    def __init__(self, compiled=False):
        torch.manual_seed(0)
        self.model = Net()
        self.forward = torch.compile(self.model, backend="eager", dynamic=True) if compiled else self.model
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-2)
        self.x = torch.randn(32, 64)
        self.y = torch.randint(0, 10, (32,))

    def loss(self, x=None):
        x = self.x if x is None else x
        return nn.functional.cross_entropy(self.forward(x), self.y[: x.shape[0]])

    def step(self, x=None):
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss(x)
        loss.backward()
        self.opt.step()
        return loss.detach()
'''

CONFTEST = '''
import pytest
from mymodel import Trainer


@pytest.fixture
def trainer():
    t = Trainer()
    for _ in range(3):
        t.step()
    return t
'''

TESTS = '''
import pytest
import torch
from perfbudget.measure import compile_health
from mymodel import Trainer

pytestmark = pytest.mark.budget("mlp-train")


def test_step(perf, trainer):
    perf.step(trainer.step, samples_per_step=32, min_samples=20, max_ms=150, warmup_ms=20)


def test_operators(perf, trainer):
    perf.operators(trainer.step, rounds=4, steps=1)
    perf.flops(trainer.step)


def test_memory(perf, trainer):
    perf.memory(trainer.loss, optimizer=trainer.opt)


def test_numerics(perf, trainer):
    perf.grads(trainer.step, trainer.model, steps=3)
    other = Trainer()
    perf.loss_drift(trainer.step, other.step, steps=3)


@pytest.mark.compiles
@pytest.mark.budget("mlp-compiled")
def test_compile(perf):
    t = Trainer(compiled=True)
    shapes = [(torch.randn(n, 64),) for n in (8, 16, 32)]
    perf.compile_health(compile_health.warm_until_stable(t.step, shapes))
    with perf.no_recompiles():
        for (x,) in shapes:
            t.step(x)
'''


@pytest.fixture
def repo(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    # The planted change keeps the file's size and may keep its mtime second: no stale .pyc.
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    pytester.mkpydir("mymodel").joinpath("__init__.py").write_text(MODEL.format(hidden=128))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_perf=TESTS)
    return pytester


def run(p: pytest.Pytester, *args: str) -> pytest.RunResult:
    # A subprocess per run: torch.compile's registrations do not survive pytester's in-process
    # module restore. The machine's load must not set the real samples aside here.
    return p.runpytest_subprocess("-p", "no:cacheprovider", "-o", "perfbudget_max_load=1e9",
                                 "-o", "perfbudget_html=false", "-o", "perfbudget_artifacts=none", *args)


def outcomes(p: pytest.Pytester) -> dict[str, str]:
    records = json.loads((p.path / ".perfbudget" / "results.json").read_text())["records"]
    return {f"{r['key']}.{r['metric']}": r["outcome"] for r in records}


@pytest.mark.integration  # three whole sessions with torch.compile: a minute
def test_update_then_pass_then_wider_model_fails_the_right_checks(repo: pytest.Pytester, stable_machine: str) -> None:
    run(repo, "--update-budgets").assert_outcomes(passed=5)
    written = outcomes(repo)
    for metric in ("step_ms", "throughput_samples_per_s", "flops", "op_count[aten::addmm]",
                   "peak_allocated_mib[forward]", "peak_allocated_mib[backward]", "nonfinite_grads",
                   "loss_drift"):
        assert f"mlp-train.{metric}" in written, (metric, sorted(written))
    for metric in ("graph_breaks", "unique_graphs", "recompiles"):
        assert f"mlp-compiled.{metric}" in written, (metric, sorted(written))

    # Timing on a shared machine: +100 % on the timing budgets the updater wrote, so this test
    # judges the loop, not the machine's noise.
    for path in (repo.path / "budgets").glob("cpu-*.yaml"):
        doc = yaml.safe_load(path.read_text())
        for entry in doc["budgets"].values():
            for metric, budget in entry.items():
                if lookup(metric).statistical:
                    budget["tolerance"] = 1.0
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = run(repo)
    assert r.ret == 0, r.stdout.str()[-3000:]
    got = outcomes(repo)
    exact = {k: v for k, v in got.items() if not re.search(r"(_ms|_per_s|op_share)", k)}
    # On a loaded machine another operator can cross the share threshold and be recorded
    # (unbudgeted, with its count); every budgeted exact check passes.
    new_ops = {k for k, v in exact.items() if v == "unbudgeted" and "op_count[" in k}
    assert {v for k, v in exact.items() if k not in new_ops} == {"pass"}, exact

    # The planted change: the hidden layer twice as wide.
    (repo.path / "mymodel" / "__init__.py").write_text(MODEL.format(hidden=256))
    r = run(repo)
    got = outcomes(repo)
    assert got["mlp-train.flops"] == "fail"
    assert got["mlp-train.peak_allocated_mib[forward]"] == "fail", r.stdout.str()[-6000:]
    assert got["mlp-train.nonfinite_grads"] == "pass"
    assert got["mlp-compiled.recompiles"] == "pass"
    r.stdout.fnmatch_lines(["*flops: fail: * is worse than the limit *[[]budgets/cpu*.yaml:*[]]*"])
    r.stdout.fnmatch_lines(["*peak_allocated_mib[[]forward[]]: fail: *[[]budgets/cpu*.yaml:*[]]*"])


def test_a_recompile_while_measuring_fails_the_recompiles_check(repo: pytest.Pytester) -> None:
    repo.makepyfile(test_recompile='''
import pytest
import torch
from mymodel import Trainer


@pytest.mark.compiles
@pytest.mark.budget("mlp-recompile")
def test_new_shape_while_measuring(perf):
    t = Trainer(compiled=True)
    t.forward = torch.compile(t.model, backend="eager", dynamic=False)
    t.step(torch.randn(8, 64))
    with perf.no_recompiles():
        t.step(torch.randn(16, 64))  # a shape class that was never warmed
''')
    (repo.path / "budgets").mkdir()
    (repo.path / "budgets" / "cpu.yaml").write_text(
        "schema: 1\ndevice: {type: cpu}\nbudgets:\n  mlp-recompile:\n    recompiles: {value: 0}\n")
    r = run(repo, "test_recompile.py")
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines(["*recompiles: fail: 1 is worse than the limit 0 [[]budgets/cpu.yaml:5[]]*",
                            "*recompiled while measuring*"])


def test_budget_marker_on_a_test_without_perf_is_an_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile('''
import pytest

@pytest.mark.budget("forgotten")
def test_measures_nothing():
    assert True
''')
    r = run(pytester)
    r.assert_outcomes(errors=1)
    r.stdout.fnmatch_lines(["*budget('forgotten') on a test that does not use the `perf` fixture*"])


# --------------------------------------------------------------------------- one step test, two channels

COUNTED = '''
import pytest


@pytest.mark.budget("mlp-step")
@pytest.mark.instructions
def test_step(perf, trainer):
    perf.step(trainer.step, samples_per_step=32, min_samples=20, max_ms=150, warmup_ms=20)
'''

#: The `perfbudget` command, run by the interpreter running these tests.
PERFBUDGET = (sys.executable, "-c", "import sys; from perfbudget.cli import main; sys.exit(main())")


def records(path: Path) -> dict[str, dict[str, Any]]:
    """metric -> record of the key ``mlp-step`` in a results file (the run's not-measured reports too)."""
    data = json.loads(path.read_text())["records"]
    return {r["metric"]: r for r in data if r["key"] == "mlp-step"}


def counted_run(p: pytest.Pytester, out: str, *args: str) -> pytest.RunResult:
    """``perfbudget instructions -- test_counted.py -m instructions ...``: one pytest session under callgrind."""
    return p.run(*PERFBUDGET, "instructions", "--out", out, "--", "test_counted.py", "-m", "instructions",
                 "-p", "no:cacheprovider", "-o", "perfbudget_html=false", "-o", "perfbudget_artifacts=none", *args,
                 timeout=900)


@pytest.mark.integration
@pytest.mark.valgrind
def test_a_marked_step_is_timed_in_a_plain_session_and_counted_under_callgrind(repo: pytest.Pytester) -> None:
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not installed")
    repo.makepyfile(test_counted=COUNTED)
    # A timing budget of the key in the file every CPU reads: it applies under callgrind too.
    (repo.path / "budgets").mkdir()
    (repo.path / "budgets" / "cpu.yaml").write_text(
        "schema: 1\ndevice: {type: cpu}\nbudgets:\n  mlp-step:\n    step_ms: {value: 1000.0, tolerance: 1.0}\n")

    # (1) A plain session times the step: no instruction count.
    r = run(repo, "test_counted.py", "-m", "instructions")
    assert r.ret == 0, r.stdout.str()[-3000:]
    timed = records(repo.path / ".perfbudget" / "results.json")
    assert set(timed) == {"step_ms", "throughput_samples_per_s"}, timed

    # (2) Under callgrind the same test counts it, and records no timing; the key's timing budget
    # is not reported as not measured (a time under valgrind would mean nothing).
    r = counted_run(repo, "out-update", "--update-budgets")
    assert r.ret == 0, r.stdout.str()[-3000:] + r.stderr.str()[-3000:]
    counted = records(repo.path / "out-update" / "results.json")
    assert set(counted) == {"instructions[callgrind]"}, counted
    base = counted["instructions[callgrind]"]["value"]
    assert base > 1e5, counted
    written = [path for path in (repo.path / "budgets").glob("cpu-*.yaml")
               if "mlp-step" in (yaml.safe_load(path.read_text())["budgets"] or {})]
    assert len(written) == 1, sorted((repo.path / "budgets").iterdir())
    budget = yaml.safe_load(written[0].read_text())["budgets"]["mlp-step"]
    assert set(budget) == {"instructions[callgrind]"} and budget["instructions[callgrind]"]["value"] == base

    # (3) The planted change: gradients zeroed in place instead of dropped, a few % more work per
    # step. Counted under callgrind, it fails the count written above, and nothing else.
    model = repo.path / "mymodel" / "__init__.py"
    model.write_text(model.read_text().replace("set_to_none=True", "set_to_none=False"))
    r = counted_run(repo, "out-planted", "--perf-strict")
    assert r.ret == 1, r.stdout.str()[-3000:] + r.stderr.str()[-3000:]
    planted = records(repo.path / "out-planted" / "results.json")
    assert {m: v["outcome"] for m, v in planted.items()} == {"instructions[callgrind]": "fail"}, planted
    grown = planted["instructions[callgrind]"]["value"] / base - 1
    assert grown > 0.01, grown  # well beyond the 0.5 % tolerance
    r.stdout.fnmatch_lines([f"*instructions[[]callgrind[]]: fail: *[[]budgets/{written[0].name}:*[]]*"])
    r.assert_outcomes(failed=1)
    print(f"mlp-step: {base:,.0f} instructions per step; planted {grown:+.1%}")
