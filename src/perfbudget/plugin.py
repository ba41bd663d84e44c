"""pytest glue for perfbudget: options, markers, the ``perf`` fixture, hooks. Logic lives elsewhere."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import sys
import warnings
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from . import pinning
from .artifacts import (
    ArtifactConfig,
    artifact_dir,
    describe_artifacts,
    parse_kinds,
    write_failure_artifacts,
)
from .budgets.loader import BudgetSet, load_dir
from .budgets.update import UpdateReport, apply_updates, git_commit
from .device import DeviceInfo, DeviceType, describe
from .preflight import DEFAULT_MAX_LOAD_PER_CORE
from .preflight import check as preflight_check
from .recorder import PerfRecorder
from .report import junit_properties, markdown_report, records_table
from .results import Record, Results

__all__ = ["PerfSession"]

_SESSION = pytest.StashKey["PerfSession"]()
_RECORDER = pytest.StashKey[PerfRecorder]()
_WORKER_KEY = "perfbudget_records"
#: pytest's own outcome exceptions (skip, fail, xfail, exit): not faults of the measurement.
_OUTCOMES = (pytest.skip.Exception, pytest.fail.Exception, pytest.xfail.Exception, pytest.exit.Exception)
_GPU_KEY = "perfbudget_cuda_visible_devices"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("perfbudget", "performance budgets")
    group.addoption("--budgets-dir", default=None, metavar="DIR",
                    help="folder of budget YAML files (default: ini perfbudget_budgets_dir, 'budgets').")
    group.addoption("--perf-strict", action="store_true", default=False,
                    help="fail on stale budgets (improved beyond tolerance) and on unbudgeted metrics.")
    group.addoption("--update-budgets", action="store_true", default=False,
                    help="write measured values into the budget files (tighten only) and print the diff.")
    group.addoption("--allow-loosen", action="store_true", default=False,
                    help="with --update-budgets, also write values worse than the current budget.")
    group.addoption("--perf-json", default=None, metavar="PATH",
                    help="write results JSON here (default: .perfbudget/results.json under the rootdir).")
    parser.addini("perfbudget_budgets_dir", "budget folder, relative to the rootdir", default="budgets")
    parser.addini("perfbudget_threads", "torch threads for CPU timing", default="1")
    parser.addini("perfbudget_max_load", "1-minute load average per core above which CPU timing checks "
                  "are not judged (skip; a failure under --perf-strict)", default=str(DEFAULT_MAX_LOAD_PER_CORE))
    parser.addini("perfbudget_artifacts", "failure artifacts: all, none, or some of trace, flamegraph, memory",
                  default="all")
    parser.addini("perfbudget_html", "write the HTML report (with plots) beside the results JSON",
                  type="bool", default=True)
    parser.addini("perfbudget_pin_gpus", "under xdist, pin each worker to one GPU (CUDA_VISIBLE_DEVICES)",
                  type="bool", default=True)


@dataclass
class PerfSession:
    """Per-session state: options, budgets (loaded once), devices, collected records."""

    rootdir: Path
    budgets_dir: Path
    strict: bool
    update: bool
    allow_loosen: bool
    json_path: Path
    threads: int
    max_load: float
    is_worker: bool
    budgets_dir_arg: str | None = None
    artifacts: ArtifactConfig = field(default_factory=ArtifactConfig)
    html: bool = True
    pin_gpus: bool = True
    pinned_gpu: str | None = None
    records: list[Record] = field(default_factory=list)
    errors: list[dict[str, str]] = field(default_factory=list)
    update_report: UpdateReport | None = None
    _budgets: BudgetSet | None = None
    _devices: dict[str, DeviceInfo] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: pytest.Config) -> PerfSession:
        """The only place that reads ``pytest.Config``."""
        root = Path(str(config.rootpath))
        arg = config.getoption("--budgets-dir")
        budgets_dir = Path(arg) if arg else root / str(config.getini("perfbudget_budgets_dir"))
        if not budgets_dir.is_absolute():
            budgets_dir = Path.cwd() / budgets_dir
        json_arg = config.getoption("--perf-json")
        json_path = Path(json_arg) if json_arg else root / ".perfbudget" / "results.json"
        try:
            threads = int(str(config.getini("perfbudget_threads")))
            max_load = float(str(config.getini("perfbudget_max_load")))
        except ValueError:
            raise pytest.UsageError(
                f"ini perfbudget_threads / perfbudget_max_load: expected an integer / a number, got "
                f"{config.getini('perfbudget_threads')!r} / {config.getini('perfbudget_max_load')!r}"
            ) from None
        try:
            kinds = parse_kinds(str(config.getini("perfbudget_artifacts")))
        except ValueError as exc:
            raise pytest.UsageError(f"ini perfbudget_artifacts: {exc}") from None
        return cls(
            rootdir=root,
            budgets_dir=budgets_dir,
            strict=bool(config.getoption("--perf-strict")),
            update=bool(config.getoption("--update-budgets")),
            allow_loosen=bool(config.getoption("--allow-loosen")),
            json_path=json_path,
            threads=threads,
            max_load=max_load,
            is_worker=hasattr(config, "workerinput"),
            budgets_dir_arg=arg,
            artifacts=ArtifactConfig(kinds=kinds, threads=threads),
            html=bool(config.getini("perfbudget_html")),
            pin_gpus=bool(config.getini("perfbudget_pin_gpus")),
        )

    @property
    def budgets(self) -> BudgetSet:
        if self._budgets is None:
            self._budgets = load_dir(self.budgets_dir)
        return self._budgets

    def device(self, type: DeviceType) -> DeviceInfo:
        if type not in self._devices:
            self._devices[type] = describe(type, threads=self.threads if type == "cpu" else None)
        return self._devices[type]

    def update_command(self, nodeid: str) -> str:
        cmd = ["pytest", nodeid, "--update-budgets"]
        if self.budgets_dir_arg:
            cmd += ["--budgets-dir", self.budgets_dir_arg]
        return shlex.join(cmd)

    @contextlib.contextmanager
    def exclusive(self, gpu: str | None = None) -> Iterator[None]:
        """Hold the run-wide timing lock: perf tests never overlap, even across xdist workers.

        A GPU test on a worker pinned to ``gpu`` holds the run-wide lock shared and that
        GPU's lock exclusively, so tests on different GPUs run side by side while CPU
        timing still runs alone.
        """
        lock_dir = self.rootdir / ".perfbudget"
        lock_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as stack:
            stack.enter_context(_flock(lock_dir / "timing.lock", fcntl.LOCK_SH if gpu else fcntl.LOCK_EX))
            if gpu:
                safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in gpu)
                stack.enter_context(_flock(lock_dir / f"timing-gpu-{safe}.lock", fcntl.LOCK_EX))
            yield

    @property
    def artifacts_dir(self) -> Path:
        """Failure artifacts go beside the results JSON: ``<json folder>/artifacts/<test>/``."""
        return self.json_path.parent / "artifacts"

    def finish(self) -> None:
        """Controller only: write results, then apply updates from the same records."""
        results = Results(records=self.records, meta={"budgets_dir": str(self.budgets_dir), "errors": self.errors})
        self.json_path.parent.mkdir(parents=True, exist_ok=True)
        results.write(self.json_path)  # first: a broken report must not lose measurements
        # Reports beside the JSON: results.md (CI step summary), results.html (plots).
        try:
            self.json_path.with_suffix(".md").write_text(markdown_report(results), encoding="utf-8")
            if self.html:
                from .html_report import write_html

                write_html(results, self.json_path.with_suffix(".html"))
        except Exception as exc:
            warnings.warn(f"perfbudget: reports beside {self.json_path} not written: {exc!r}", stacklevel=1)
        if self.update:
            self.update_report = apply_updates(
                results.measured(), self.budgets, allow_loosen=self.allow_loosen, commit=git_commit(self.rootdir)
            )


@contextlib.contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


class _XdistHooks:
    """Controller side of xdist: pin workers to GPUs, collect each worker's records once it finishes."""

    def __init__(self, session: PerfSession) -> None:
        self.session = session
        self._gpus: list[str] | None = None

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        if not self.session.pin_gpus:
            return
        if self._gpus is None:
            self._gpus = pinning.visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), pinning.nvml_gpu_count())
        gpu = pinning.gpu_for_worker(node.workerinput["workerid"], self._gpus)
        if gpu is not None:
            node.workerinput[_GPU_KEY] = gpu

    @pytest.hookimpl
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        data = getattr(node, "workeroutput", {}).get(_WORKER_KEY)
        if data:
            got = json.loads(data)
            self.session.records.extend(Record(**r) for r in got["records"])
            self.session.errors.extend(got["errors"])


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped with the reason on machines without one")
    config.addinivalue_line("markers", "cpu: measures on the CPU")
    config.addinivalue_line(
        "markers",
        "budget(key): the budget key the test's `perf` measurements are judged under; "
        "'{param}' placeholders take parametrize values",
    )
    session = PerfSession.from_config(config)
    config.stash[_SESSION] = session
    gpu = getattr(config, "workerinput", {}).get(_GPU_KEY)
    if gpu is not None:
        _pin_worker(session, gpu)
    if config.pluginmanager.hasplugin("xdist") and not session.is_worker:
        config.pluginmanager.register(_XdistHooks(session), "perfbudget-xdist")


def _pin_worker(session: PerfSession, gpu: str) -> None:
    """Give this xdist worker its one GPU, before torch initialises CUDA."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        warnings.warn(f"perfbudget: CUDA was initialised before this worker could be pinned to GPU {gpu}; "
                      "it sees every GPU", stacklevel=1)
        return
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    session.pinned_gpu = gpu


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` with ``-m gpu`` on a GPU machine: one worker per visible GPU."""
    if not pinning.wants_gpu_workers(str(config.getoption("markexpr", "") or "")):
        return None
    if not config.getini("perfbudget_pin_gpus"):
        return None
    gpus = pinning.visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), pinning.nvml_gpu_count())
    return len(gpus) or None


def _device_type(item: pytest.Item) -> DeviceType:
    return "cuda" if item.get_closest_marker("gpu") is not None else "cpu"


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None:
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA GPU: torch.cuda.is_available() is False on this machine")


def _budget_key(item: pytest.Item) -> str:
    mark = item.get_closest_marker("budget")
    if mark is None:
        name = getattr(item, "originalname", item.name)
        return name.removeprefix("test_").replace("_", "-")
    if len(mark.args) != 1 or not isinstance(mark.args[0], str):
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.budget takes one key string, got {mark.args!r}")
    params = getattr(getattr(item, "callspec", None), "params", {})
    try:
        return mark.args[0].format(**{k: getattr(v, "__name__", v) for k, v in params.items()})
    except (KeyError, IndexError) as exc:
        raise pytest.UsageError(f"{item.nodeid}: budget key {mark.args[0]!r} names unknown parameter {exc}") from None


@pytest.fixture
def perf(request: pytest.FixtureRequest) -> PerfRecorder:
    """Record measurements under the test's budget key: ``perf.record("step_ms", samples, more=...)``."""
    session = request.config.stash[_SESSION]
    item = request.node
    rec = PerfRecorder(
        key=_budget_key(item),
        device=session.device(_device_type(item)),
        budgets=session.budgets,
        nodeid=item.nodeid,
        strict=session.strict,
        update=session.update,
        update_command=session.update_command(item.nodeid),
        preflight=preflight_check(_device_type(item), max_load_per_core=session.max_load).problems,
    )
    item.stash[_RECORDER] = rec
    return rec


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
    if "perf" not in getattr(item, "fixturenames", ()):
        return (yield)
    ps = item.config.stash[_SESSION]
    gpu = ps.pinned_gpu if item.get_closest_marker("gpu") is not None else None
    with ps.exclusive(gpu):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    raised: BaseException | None = None
    try:
        result = yield
    except BaseException as exc:
        raised = exc
        raise
    finally:
        rec = item.stash.get(_RECORDER, None)
        if rec is not None and raised is not None and not isinstance(raised, _OUTCOMES):
            # A fault mid-measurement (profiler, NVML, out of memory): the test fails with its
            # own traceback; the results file still lists it with what it measured before.
            first = str(raised).strip().splitlines()[0] if str(raised).strip() else ""
            item.config.stash[_SESSION].errors.append(
                {"nodeid": item.nodeid, "key": rec.key, "error": f"{type(raised).__name__}: {first}"[:500]}
            )
        if rec is not None:
            records = rec.records()
            item.config.stash[_SESSION].records.extend(records)
            item.user_properties.extend(junit_properties(records))
    if rec is not None:
        decision = rec.decision()
        if decision.outcome == "fail":
            note = _failure_artifacts(item, rec, records)
            pytest.fail(decision.message + (f"\n\n{note}" if note else ""), pytrace=False)
        if decision.outcome == "skip":
            pytest.skip(decision.message)
    return result


def _failure_artifacts(item: pytest.Item, rec: PerfRecorder, records: list[Record]) -> str:
    """Re-run the failing step for its artifacts; returns the lines naming them."""
    ps = item.config.stash[_SESSION]
    failed = [r for r in records if r.outcome == "fail"]
    if not failed or not ps.artifacts.kinds:
        return ""
    if rec.failure_step is None:
        return "failure artifacts: none (call perf.on_failure(step) to get a chrome trace and a flame graph)"
    device = _device_type(item)
    written = write_failure_artifacts(
        rec.failure_step,
        artifact_dir(ps.artifacts_dir, item.nodeid),
        device=device,
        memory_failure=any(r.metric.startswith("peak_allocated_mib") for r in failed),
        config=ps.artifacts,
    )
    paths = {a.label: str(a.path) for a in written if a.path is not None}
    for r in failed:
        r.extra["artifacts"] = paths
    item.user_properties.extend((f"perf.artifact.{a.kind}", str(a.path)) for a in written if a.path is not None)
    return describe_artifacts(written)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    ps = session.config.stash.get(_SESSION, None)
    if ps is None:
        return
    if ps.is_worker:
        session.config.workeroutput[_WORKER_KEY] = json.dumps(  # type: ignore[attr-defined]
            {"records": [r.as_dict() for r in ps.records], "errors": ps.errors}
        )
        return
    if not ps.records and not ps.errors and not ps.update:
        return
    ps.finish()
    if ps.update_report is not None and ps.update_report.errors:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    ps = config.stash.get(_SESSION, None)
    if ps is None or ps.is_worker or not (ps.records or ps.errors):
        return
    tr = terminalreporter
    tr.write_sep("=", "perf budgets")
    for e in ps.errors:
        tr.write_line(f"ERROR {e['nodeid']} ({e['key']}): {e['error']}")
    tr.write_line(records_table(ps.records, with_key=True))
    counts: dict[str, int] = {}
    for r in ps.records:
        counts[r.outcome] = counts.get(r.outcome, 0) + 1
    tr.write_line(", ".join(f"{n} {o}" for o, n in sorted(counts.items())))
    if counts.get("stale"):
        tr.write_line("stale budgets: the code got faster or leaner; ratchet them with --update-budgets")
    tr.write_line(f"results: {ps.json_path}")
    if ps.update_report is not None:
        tr.write_sep("-", "budget update")
        tr.write_line(ps.update_report.render())
