"""pytest glue for perfbudget: options, markers, hook specifications and the plugin object; logic lives elsewhere."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest

from . import benchmark, hookspec, lease, xdist
from .artifacts import artifact_dir, describe_artifacts, write_failure_artifacts
from .device import DeviceType
from .metrics import lookup
from .preflight import check as preflight_check
from .recorder import CountedSteps, PerfRecorder
from .results import Record, is_unrecorded_budget
from .session import PerfSession, add_options, settle_allocator
from .settings import STABLE_MACHINE_ENV
from .verdict.judge import Judge, JudgeConfig, VerdictPolicy
from .verdict.text import decision_text
from .vocabulary import Outcome, TestOutcome, count_outcomes, tally_text

__all__ = ["PLUGIN_NAME", "BudgetSpec", "PerfPlugin"]

#: Name the run's :class:`PerfPlugin` is registered under:
#: ``config.pluginmanager.get_plugin(PLUGIN_NAME).session`` is the run's state.
PLUGIN_NAME = "perfbudget-session"
_XDIST_NAME = "perfbudget-xdist"

_SPEC = pytest.StashKey["BudgetSpec"]()
_RECORDER = pytest.StashKey[PerfRecorder]()
#: pytest's own outcome exceptions (skip, fail, xfail, exit): not faults of the measurement.
_OUTCOMES = (pytest.skip.Exception, pytest.fail.Exception, pytest.xfail.Exception, pytest.exit.Exception)


#: Set on the skip and fail exceptions perfbudget raises for a test, so that its report names
#: the test's location: raised in this module's hooks, their tracebacks end here.
_AT_TEST = "_perfbudget_at_test"


def _skip(reason: str) -> NoReturn:
    exc = pytest.skip.Exception(reason)
    setattr(exc, _AT_TEST, True)
    raise exc


def _fail(reason: str) -> NoReturn:
    exc = pytest.fail.Exception(reason, pytrace=False)
    setattr(exc, _AT_TEST, True)
    raise exc


@dataclass(frozen=True, kw_only=True)
class BudgetSpec:
    """A perf test's budget marker, evaluated once at set-up."""

    key: str
    """Workload key its measurements are judged under."""
    device: DeviceType
    """``cuda`` for tests marked ``gpu``, else ``cpu``."""
    uses_perf: bool
    """Whether the test requests the ``perf`` fixture."""
    counted: CountedSteps | None = None
    """The ``instructions`` marker's steps: ``perf.step`` is counted, not timed, under callgrind."""

    @classmethod
    def of(cls, item: pytest.Item) -> BudgetSpec:
        mark = item.get_closest_marker("budget")
        uses_perf = "perf" in getattr(item, "fixturenames", ())
        device: DeviceType = "cuda" if item.get_closest_marker("gpu") is not None else "cpu"
        counted = _counted_steps(item)
        if mark is None:
            name = getattr(item, "originalname", item.name)
            key = name.removeprefix("test_").replace("_", "-")
            if benchmark.benchmarked(item):  # one key per benchmark: its parameters too (``sort-list[1000]``)
                key += item.name[len(name):]
            return cls(key=key, device=device, uses_perf=uses_perf, counted=counted)
        if len(mark.args) != 1 or not isinstance(mark.args[0], str) or mark.kwargs:
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.budget takes one key string, got {mark.args!r}")
        params = getattr(getattr(item, "callspec", None), "params", {})
        try:
            key = mark.args[0].format(**{k: getattr(v, "__name__", v) for k, v in params.items()})
        except (KeyError, IndexError) as exc:
            raise pytest.UsageError(f"{item.nodeid}: budget key {mark.args[0]!r} names unknown parameter {exc}") from None
        return cls(key=key, device=device, uses_perf=uses_perf, counted=counted)


def _counted_steps(item: pytest.Item) -> CountedSteps | None:
    """The test's ``instructions`` marker as the steps ``perf.step`` counts under callgrind."""
    mark = item.get_closest_marker("instructions")
    if mark is None:
        return None
    if mark.args or set(mark.kwargs) - {"steps", "warmup"}:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.instructions takes only steps= and warmup=, got "
                                f"{mark.args!r} {mark.kwargs!r}")
    try:
        return CountedSteps(**mark.kwargs)
    except ValueError as exc:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.instructions: {exc}") from None


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    # Before any conftest imports torch: torch reads its alignment setting at its first allocation.
    settle_allocator(early_config)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped with the reason on machines without one")
    config.addinivalue_line("markers", "cpu: measures on the CPU")
    config.addinivalue_line(
        "markers",
        "budget(key): the budget key the test's `perf` measurements are judged under; "
        "'{param}' placeholders take parametrize values",
    )
    config.addinivalue_line(
        "markers", "compiles: the test (or its fixtures) runs torch.compile; such tests run after every other "
        "perf test, because compiling leaves the process changed",
    )
    config.addinivalue_line(
        "markers", "instructions(steps=20, warmup=10): under callgrind (`perfbudget instructions -- <tests> -m "
        "instructions`) the test's `perf.step` records instructions[callgrind], `steps` counted calls after "
        "`warmup` uncounted ones, instead of timing; elsewhere it is timed as usual",
    )
    from .measure import placement, turns

    session = PerfSession.from_config(config)  # reads the settings: a bad run spec is a usage error here
    if turns.active():  # a side of a lockstep A/B run: its own draw of memory placement, before any set-up
        placement.shift()
    gpu = getattr(config, "workerinput", {}).get(xdist.GPU_KEY)
    if gpu is not None:
        xdist.pin_worker(session, gpu)
    config.pluginmanager.register(PerfPlugin(session), PLUGIN_NAME)
    benchmark.configure(config, session)
    if config.pluginmanager.hasplugin("xdist") and not session.is_worker:
        config.pluginmanager.register(xdist.ControllerHooks(session), _XDIST_NAME)


def pytest_unconfigure(config: pytest.Config) -> None:
    for name in (benchmark.PLUGIN_NAME, _XDIST_NAME, PLUGIN_NAME):
        plugin = config.pluginmanager.get_plugin(name)
        if plugin is not None:
            config.pluginmanager.unregister(plugin, name)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    # Called before pytest_configure (xdist sizes the pool in pytest_cmdline_main): a module hook.
    return xdist.auto_num_workers(config)


class PerfPlugin:
    """The run's perfbudget hooks and the ``perf`` fixture, over the run's :class:`PerfSession`."""

    def __init__(self, session: PerfSession) -> None:
        self.session = session
        self._threads_before: int | None = None
        """torch's thread count before the run set it, restored at the end."""
        self._deselected: list[pytest.Item] = []

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """Perf tests: compiling ones last, under the lease in the plan's order; the run's torch threads.

        Compiling leaves the process changed (allocator, threads, a slower eager step), which would
        shift every later eager timing; compiling at the timing thread count keeps inductor's kernels
        and dynamo's guards those of the measured runs. trylast: after pytest's own reordering.
        """
        perf_items = [i for i in items if "perf" in getattr(i, "fixturenames", ())]
        self._know_keys(config, perf_items)
        if not perf_items:
            return
        ps = self.session
        items.sort(key=lambda i: (i.get_closest_marker("compiles") is not None,
                                  lease.position(i.nodeid) if ps.settings.lease else 0))
        import torch

        self._threads_before = torch.get_num_threads()
        torch.set_num_threads(ps.settings.threads)
        if ps.settings.inductor_dir and any(i.get_closest_marker("compiles") is not None for i in perf_items):
            from .measure.compile_health import inductor_dirs

            inductor_dirs(Path(ps.rootdir) / ps.settings.inductor_dir, keep_tmpdir=ps.settings.keep_tmpdir)

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        # A deselected test's key is a key of the suite: its budgets are not without a test.
        self._deselected.extend(i for i in items if "perf" in getattr(i, "fixturenames", ()))

    def _know_keys(self, config: pytest.Config, perf_items: list[pytest.Item]) -> None:
        """The collected perf tests' keys, when the run collected whole folders (else all budgets lack a test)."""
        if not all(Path(config.invocation_params.dir, a.split("::")[0]).is_dir() for a in config.args):
            return
        keys: set[str] = set()
        for item in (*perf_items, *self._deselected):
            try:
                keys.add(BudgetSpec.of(item).key)
            except pytest.UsageError:  # reported at the test's set-up
                continue
        self.session.known_keys = keys

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        spec = BudgetSpec.of(item)
        if item.get_closest_marker("budget") is not None and not spec.uses_perf:
            _fail(f"{item.nodeid}: @pytest.mark.budget({spec.key!r}) on a test that does not use the `perf` "
                  "fixture: nothing would be judged; request `perf` or drop the marker")
        item.stash[_SPEC] = spec
        if spec.uses_perf:
            broken = self.session.budgets.file_errors
            if broken:
                # A file that cannot be loaded would otherwise judge nothing it holds, on any device.
                lines = "\n".join(f"  {e}" for e in broken)
                _fail(f"budget files that cannot be loaded (every perf test fails until they are fixed):\n{lines}")
        if spec.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                _skip("needs a CUDA GPU: torch.cuda.is_available() is False on this machine")

    @pytest.fixture
    def perf(self, request: pytest.FixtureRequest) -> PerfRecorder:
        """Measure under the test's budget key: ``perf.step(...)``, ``perf.memory(...)``, ... (:class:`PerfRecorder`)."""
        ps = self.session
        item = request.node
        spec = item.stash.get(_SPEC, None) or BudgetSpec.of(item)
        try:
            stable = ps.stable_identity(spec.device)
        except ValueError as exc:
            _fail(str(exc))
        config = JudgeConfig(
            strict=ps.settings.strict, judging=ps.judging, policy=VerdictPolicy(),
            preflight=preflight_check(spec.device, max_load_per_core=ps.settings.max_load).problems,
            stable_identity=stable,
        )
        rec = PerfRecorder(Judge(spec.key, ps.device(spec.device), ps.budgets, config), nodeid=item.nodeid,
                           update_command=ps.update_command(item.nodeid), threads=ps.settings.threads,
                           counted_steps=spec.counted if ps.counts_instructions else None, lease=ps.settings.lease)
        item.stash[_RECORDER] = rec
        return rec

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, Any, Any]:
        if "perf" not in getattr(item, "fixturenames", ()):
            return (yield)
        gpu = self.session.pinned_gpu if item.get_closest_marker("gpu") is not None else None
        with self.session.exclusive(gpu):
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        raised: BaseException | None = None
        ps = self.session
        if ps.judging.takes_turns:
            # After the first set-up: the sides' starts overlap, but nothing is measured before both
            # have joined (GPM, energy and occupancy read the whole device without taking a turn).
            from .measure import turns

            turns.join()
        records: list[Record] = []
        try:
            result = yield
            rec = item.stash.get(_RECORDER, None)
            if rec is not None:
                item.ihook.pytest_perfbudget_measured(item=item, perf=rec)
        except BaseException as exc:
            raised = exc
            raise
        finally:
            rec = item.stash.get(_RECORDER, None)
            if rec is not None and raised is not None and not isinstance(raised, _OUTCOMES):
                # A fault mid-measurement (profiler, NVML, out of memory): the test fails with its
                # own traceback; the results file still lists it with what it measured before.
                first = str(raised).strip().splitlines()[0] if str(raised).strip() else ""
                ps.errors.append({"nodeid": item.nodeid, "key": rec.key,
                                  "error": f"{type(raised).__name__}: {first}"[:500]})
            if rec is not None:
                records = rec.records()
                ps.records.extend(records)
                from .report import junit_properties

                item.user_properties.extend(junit_properties(records))
        if rec is not None:
            self._decide(item, rec, records)
        return result

    def _decide(self, item: pytest.Item, rec: PerfRecorder, records: list[Record]) -> None:
        """Apply the recorder's decision to the test: pass, skip or fail with the text."""
        decision = rec.decision()
        text = decision_text(decision, records, key=rec.key, device_label=rec.device.label,
                             update_command=rec.update_command)
        if decision.outcome != TestOutcome.PASS or text:
            item.user_properties.append(("perf.outcome", text or str(decision.outcome)))
        if decision.outcome == TestOutcome.FAIL:
            note = self._failure_artifacts(item, rec, records)
            _fail(text + (f"\n\n{note}" if note else ""))
        if decision.outcome == TestOutcome.SKIP:
            _skip(text)

    def _failure_artifacts(self, item: pytest.Item, rec: PerfRecorder, records: list[Record]) -> str:
        """Re-run the failing step for its artifacts; returns the lines naming them."""
        ps = self.session
        failed = [r for r in records if r.outcome == Outcome.FAIL]
        if not failed or not ps.artifacts.kinds:
            return ""
        if rec.failure_step is None:
            return "failure artifacts: none (call perf.on_failure(step) to get a chrome trace and a flame graph)"
        written = write_failure_artifacts(
            rec.failure_step,
            artifact_dir(ps.artifacts_dir, item.nodeid),
            device=rec.device.type,
            memory_failure=any(r.metric.startswith("peak_allocated_mib") for r in failed),
            config=ps.artifacts,
        )
        paths = {a.label: str(a.path) for a in written if a.path is not None}
        for r in failed:
            r.extra["artifacts"] = paths
        item.user_properties.extend((f"perf.artifact.{a.kind}", str(a.path)) for a in written if a.path is not None)
        return describe_artifacts(written)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
        report = yield
        if call.excinfo is not None and getattr(call.excinfo.value, _AT_TEST, False):
            _at_test_location(report, item)
        return report

    def pytest_runtest_logfinish(self) -> None:
        # After teardown, so failure artifacts named in a record are in the file too.
        self.session.checkpoint()

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        ps = self.session
        if self._threads_before is not None:
            import torch

            torch.set_num_threads(self._threads_before)
        if ps.judging.takes_turns:
            from .measure import turns

            turns.leave()
        if ps.is_worker:
            session.config.workeroutput[xdist.WORKER_KEY] = xdist.worker_output(ps)  # type: ignore[attr-defined]
            return
        if not ps.records and not ps.errors and not ps.judging.writes_budgets:
            return
        results = ps.finish()
        if ps.update_report is not None and ps.update_report.errors:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if ps.settings.strict and any(is_unrecorded_budget(r) for r in results.records):
            # A budget no test of the run recorded fails a strict run (a test's own do, at the test).
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        session.config.hook.pytest_perfbudget_results(config=session.config, results=results, path=ps.json_path)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        ps = self.session
        if ps.is_worker or not (ps.records or ps.errors):
            return
        from .report import records_table
        from .report.terminal import gpu_steps

        tr = terminalreporter
        tr.write_sep("=", "perf budgets")
        for e in ps.errors:
            tr.write_line(f"ERROR {e['nodeid']} ({e['key']}): {e['error']}")
        tr.write_line(records_table(ps.records, with_key=True))
        counts = count_outcomes(r.outcome for r in ps.records)
        tr.write_line(tally_text(counts))
        for step in gpu_steps(ps.records):  # a launch-bound GPU step is named, with why
            tr.write_line(step.line())
        if counts.get("stale"):
            tr.write_line("stale budgets: the code got faster or leaner; ratchet them with --update-budgets")
        advisory = [r for r in ps.records if r.outcome == Outcome.ADVISORY]
        if advisory:
            would_fail = [f"{r.key}.{r.metric}" for r in advisory if r.advice == Outcome.FAIL]
            wall = sum(1 for r in advisory if r.device is not None and r.device.type in lookup(r.metric).advisory_on)
            if wall:
                tr.write_line(f"advisory: {wall} wall-clock check(s) of a GPU step, never gating there: the host sets "
                              "them, the step's device time (step_device_ms) gates instead")
            if len(advisory) > wall:
                tr.write_line(f"advisory: {len(advisory) - wall} timing check(s) against stored budgets, not gating "
                              f"(gating needs a machine declared stable with {STABLE_MACHINE_ENV} and budgets keyed by "
                              "its identity); judge timing with `perfbudget ab --base <ref>`")
            if would_fail:
                tr.write_line(f"advisory, beyond the budget here: {', '.join(would_fail)}")
        tr.write_line(f"results: {ps.json_path}")
        if ps.update_report is not None:
            tr.write_sep("-", "budget update")
            tr.write_line(ps.update_report.render())


def _at_test_location(report: pytest.TestReport, item: pytest.Item) -> None:
    """Point a skip or failure raised in this module's hooks at the test's definition, as ``skipif`` does."""
    path, lineno = item.reportinfo()[:2]
    if lineno is None:
        return
    where = os.fspath(path), lineno + 1
    longrepr: Any = report.longrepr
    if report.skipped and isinstance(longrepr, tuple):
        report.longrepr = (*where, longrepr[2])
    elif report.failed and getattr(longrepr, "chain", None):
        # The crash line (``--tb=line``, the short summary, xdist's copy of the report) is the
        # last link of the chain; the message itself is unchanged.
        *rest, (traceback, crash, description) = longrepr.chain
        if crash is not None:
            crash = dataclasses.replace(crash, path=where[0], lineno=where[1])
        report.longrepr = type(longrepr)([*rest, (traceback, crash, description)])
