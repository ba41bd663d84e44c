"""pytest-benchmark suites as perfbudget checks: the ``benchmark`` fixture and markers, timed by ``perf.time``."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .recorder import PerfRecorder
    from .session import PerfSession

__all__ = ["BENCHMARK_INFO", "BENCHMARK_METRIC", "BenchmarkError", "BenchmarkFixture", "BenchmarkOptions",
           "BenchmarkPlugin", "benchmarked", "configure"]

#: The metric every benchmark records, under the key named after its test (:func:`benchmarked`).
BENCHMARK_METRIC = "latency_ms[benchmark]"
#: Key of the benchmark's group and ``extra_info`` in its record's ``extra``.
BENCHMARK_INFO = "benchmark"
#: Markers that make a test a benchmark: pytest-benchmark's (options of its fixture) and pytest-codspeed's.
MARKERS = ("benchmark", "codspeed_benchmark")
#: The name :class:`BenchmarkPlugin` is registered under.
PLUGIN_NAME = "perfbudget-benchmark"
#: pytest-benchmark's plugin (its entry point's name) and the session object it registers.
_PYTEST_BENCHMARK = ("benchmark", "pytest-benchmark")
#: ``@pytest.mark.benchmark`` options perfbudget's own measuring rules replace: the clock is
#: ``perf_counter``, garbage is collected after warm-up, every benchmark warms up, rounds are calibrated to
#: at least 1 ms, no profile is taken. Accepted so that a suite runs unchanged.
_REPLACED = ("timer", "disable_gc", "warmup", "warmup_iterations", "calibration_precision", "cprofile")
#: Least length of one timed round (a batch of calls), as :func:`perfbudget.measure.timing.bench`'s
#: ``min_sample_ms``: a microsecond call timed alone would be mostly the clock's overhead.
MIN_ROUND_MS = 1.0
_FIXTURE = pytest.StashKey["BenchmarkFixture"]()


class BenchmarkError(Exception):
    """A benchmark that cannot be measured: the message names the test."""


def benchmarked(item: pytest.Item) -> bool:
    """Whether ``item`` is a benchmark: it uses the ``benchmark`` fixture or carries one of :data:`MARKERS`."""
    return "benchmark" in getattr(item, "fixturenames", ()) or any(item.get_closest_marker(m) for m in MARKERS)


def _whole_test(item: pytest.Item) -> bool:
    """A test marked as a benchmark that does not use the fixture: its body is the benchmark (pytest-codspeed's meaning)."""
    return "benchmark" not in getattr(item, "fixturenames", ()) and any(item.get_closest_marker(m) for m in MARKERS)


@dataclass(frozen=True, kw_only=True)
class BenchmarkOptions:
    """What a test's ``@pytest.mark.benchmark(...)`` asks of its benchmark, within perfbudget's measuring rules."""

    group: str | None = None
    """pytest-benchmark's group, kept in the record (``extra["benchmark"]["group"]``)."""
    min_rounds: int | None = None
    """Least number of timed rounds (``None``: :func:`~perfbudget.measure.timing.bench`'s)."""
    max_time: float | None = None
    """Seconds of timed rounds, beyond which no round starts once ``min_rounds`` are taken (``None``: the bench's)."""
    min_time: float | None = None
    """Least seconds of one round, when longer than :data:`MIN_ROUND_MS`."""

    @classmethod
    def of(cls, item: pytest.Item) -> BenchmarkOptions:
        """The options of ``item``'s closest ``benchmark`` marker.

        Raises:
            BenchmarkError: the marker has positional arguments or an option pytest-benchmark does not know.
        """
        mark = item.get_closest_marker("benchmark")
        if mark is None:
            return cls()
        known = {"group", "min_rounds", "max_time", "min_time"}
        unknown = sorted(set(mark.kwargs) - known - set(_REPLACED))
        if mark.args or unknown:
            raise BenchmarkError(f"{item.nodeid}: @pytest.mark.benchmark takes only the options "
                                 f"{', '.join(sorted(known | set(_REPLACED)))}; got {mark.args!r} {unknown}")
        options = cls(**{k: v for k, v in mark.kwargs.items() if k in known})
        for name in ("min_rounds", "max_time", "min_time"):
            value = getattr(options, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                raise BenchmarkError(f"{item.nodeid}: @pytest.mark.benchmark({name}=...) expects a positive number, "
                                     f"got {value!r}")
        return options


class _Inputs:
    """A pedantic benchmark's call on fresh inputs: ``setup()`` before every call, ``teardown`` after it."""

    def __init__(self, target: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                 setup: Callable[[], Any] | None, teardown: Callable[..., Any] | None) -> None:
        self.target, self.setup_fn, self.teardown = target, setup, teardown
        self.given = bool(args or kwargs)
        self.args, self.kwargs = args, kwargs
        self.called = False

    def setup(self) -> None:
        # The previous call's teardown runs here, untimed, before the next call's setup.
        self.finish()
        if self.setup_fn is not None:
            got = self.setup_fn()
            if got:
                if self.given:
                    raise TypeError("Can't use `args` or `kwargs` if `setup` returns the arguments.")
                self.args, self.kwargs = got
        self.called = False

    def __call__(self) -> Any:
        self.called = True
        return self.target(*self.args, **self.kwargs)

    def first(self) -> Any:
        self.setup()
        return self()

    def finish(self) -> None:
        if self.called and self.teardown is not None:
            self.called = False
            self.teardown(*self.args, **self.kwargs)


class BenchmarkFixture:
    """pytest-benchmark's ``benchmark`` fixture over a test's :class:`~perfbudget.PerfRecorder`: one
    benchmark per test, recorded as :data:`BENCHMARK_METRIC` through ``perf.time`` as any timing check
    (under callgrind, in a test marked ``instructions``, counted by ``perf.instructions``).

    Args:
        perf: the test's recorder (the ``perf`` fixture's value).
        name, fullname: the test's name (parameters included) and node id, as pytest-benchmark names them.
        param, params: the test's parameter id and values (``None`` when not parametrized).
        options: the test's ``@pytest.mark.benchmark`` options.
    """

    def __init__(self, perf: PerfRecorder, *, name: str, fullname: str, param: str | None = None,
                 params: Mapping[str, Any] | None = None, options: BenchmarkOptions | None = None) -> None:
        self.name, self.fullname, self.param, self.params = name, fullname, param, params
        self.options = options or BenchmarkOptions()
        self.group = self.options.group
        self.extra_info: dict[str, Any] = {}
        self.metric = ""
        """The metric the benchmark recorded (empty until it ran)."""
        self._perf = perf
        self._used = ""

    @classmethod
    def of(cls, item: pytest.Item, perf: PerfRecorder) -> BenchmarkFixture:
        """The fixture of test ``item``, kept in its stash for :meth:`BenchmarkPlugin.pytest_perfbudget_measured`."""
        spec = getattr(item, "callspec", None)
        fixture = cls(perf, name=item.name, fullname=item.nodeid, param=spec.id if spec else None,
                      params=spec.params if spec else None, options=BenchmarkOptions.of(item))
        item.stash[_FIXTURE] = fixture
        return fixture

    def __call__(self, function_to_benchmark: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Benchmark ``function_to_benchmark(*args, **kwargs)``; returns its result."""
        self._claim("benchmark(...)")
        call = functools.partial(function_to_benchmark, *args, **kwargs)
        result = self._run(call)
        self._run(lambda: self._measure(call))
        return result

    def pedantic(self, target: Callable[..., Any], args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None,
                 setup: Callable[[], Any] | None = None, teardown: Callable[..., Any] | None = None, rounds: int = 1,
                 warmup_rounds: int = 0, iterations: int = 1) -> Any:
        """pytest-benchmark's pedantic mode (``docs/benchmark-suites.md``); returns ``target``'s result.
        ``iterations`` is checked, not used: calls are batched by timing, one by one with a ``setup``."""
        self._claim("benchmark.pedantic(...)")
        for name, value, least in (("iterations", iterations, 1), ("rounds", rounds, 1), ("warmup_rounds", warmup_rounds, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"Must have positive int for `{name}`.")
        if iterations > 1 and setup is not None:
            raise ValueError("Can't use more than 1 `iterations` with a `setup` function.")
        inputs = _Inputs(target, args, dict(kwargs or {}), setup, teardown)
        fresh = setup is not None or teardown is not None
        result = self._run(inputs.first)
        self._run(lambda: self._measure(inputs, setup=inputs.setup if fresh else None, min_samples=rounds,
                                        min_warmup_calls=max(2, warmup_rounds)))
        inputs.finish()
        return result

    def _claim(self, how: str) -> None:
        if self._used:
            raise BenchmarkError(f"{self.fullname}: the benchmark fixture measures one benchmark per test; it was "
                                 f"already used as {self._used} (split the test, or parametrize it)")
        self._used = how

    def _run(self, fn: Callable[[], Any]) -> Any:
        """``fn()``; an exception it raises becomes a :class:`BenchmarkError` naming the test (chained to it)."""
        try:
            return fn()
        except BenchmarkError:
            raise
        except Exception as exc:
            raise BenchmarkError(f"{self.fullname}: {self._used} raised {type(exc).__name__}: {exc}") from exc

    def _measure(self, call: Callable[[], Any], *, setup: Callable[[], Any] | None = None, min_samples: int | None = None,
                 min_warmup_calls: int | None = None) -> None:
        perf, options = self._perf, self.options
        counted = perf.counted_steps
        if counted is not None:
            if setup is not None:
                self.metric = perf.unmeasurable("instructions[callgrind]", "a pedantic benchmark with setup or "
                                                "teardown: they would be counted with the call").metric
                return
            self.metric = perf.instructions(call, steps=counted.steps, warmup=counted.warmup, counter="callgrind").metric
            return
        from .measure.timing import MIN_SAMPLES

        kw: dict[str, Any] = {}
        if min_samples is not None:  # pedantic's rounds: a floor under the marker's min_rounds and the bench's own
            kw["min_samples"] = max(min_samples, options.min_rounds or 0, MIN_SAMPLES)
        elif options.min_rounds is not None:
            kw["min_samples"] = options.min_rounds
        if options.max_time is not None:
            kw["max_ms"] = options.max_time * 1e3
        if min_warmup_calls is not None:
            kw["min_warmup_calls"] = min_warmup_calls
        if setup is not None and perf.device.type != "cpu":
            self.metric = perf.unmeasurable(BENCHMARK_METRIC, "a pedantic benchmark with setup or teardown is "
                                            "timed on the CPU only (CUDA events time calls back to back)").metric
            return
        if setup is not None:
            kw["setup"] = setup
        elif perf.device.type == "cpu":  # CUDA events time each call on the device
            kw["min_sample_ms"] = max(MIN_ROUND_MS, (options.min_time or 0) * 1e3)
        self.metric = perf.time(BENCHMARK_METRIC, call, **kw).metric

    def info(self) -> dict[str, Any]:
        """The group and ``extra_info`` kept in the record (``extra[BENCHMARK_INFO]``), as JSON data."""
        return json.loads(json.dumps({"group": self.group, "extra_info": self.extra_info}, default=repr))


class BenchmarkPlugin:
    """The ``benchmark`` fixture and markers when perfbudget measures them (:func:`configure`)."""

    @pytest.fixture
    def benchmark(self, request: pytest.FixtureRequest, perf: PerfRecorder) -> BenchmarkFixture:
        """pytest-benchmark's fixture, recorded as a perfbudget timing check (:class:`BenchmarkFixture`)."""
        return BenchmarkFixture.of(request.node, perf)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        # Before perfbudget's own hook orders, locks and threads the tests that use `perf`.
        for item in items:
            if _whole_test(item) and "perf" not in item.fixturenames:  # type: ignore[attr-defined]
                item.fixturenames.append("perf")  # type: ignore[attr-defined]

    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> bool | None:
        """Time the whole body of a test marked as a benchmark that does not use the fixture."""
        if not _whole_test(pyfuncitem):
            return None
        funcargs = pyfuncitem.funcargs
        fixture = BenchmarkFixture.of(pyfuncitem, funcargs["perf"])  # type: ignore[arg-type]
        fixture(pyfuncitem.obj, **{arg: funcargs[arg] for arg in pyfuncitem._fixtureinfo.argnames})
        return True

    def pytest_perfbudget_measured(self, item: pytest.Item, perf: PerfRecorder) -> None:
        fixture = item.stash.get(_FIXTURE, None)
        if fixture is not None and fixture.metric:
            perf.extras.setdefault(fixture.metric, {})[BENCHMARK_INFO] = fixture.info()


def configure(config: pytest.Config, session: PerfSession) -> None:
    """Register the markers; where perfbudget measures benchmarks (``perfbudget_benchmark``, ``perfbudget
    ab``, callgrind), take them over from pytest-benchmark.

    Its plugin is blocked, not out-ranked: its hooks refuse a ``benchmark`` of another type. Its fixture
    is shadowed: pytest uses the one registered last, and :class:`BenchmarkPlugin` registers after every
    installed plugin (a conftest's fixture still wins).
    """
    config.addinivalue_line("markers", "benchmark(group=None, min_rounds=None, max_time=None, ...): pytest-benchmark's "
                            "options of the `benchmark` fixture; on a test without the fixture, the whole test is the "
                            "benchmark (pytest-codspeed's meaning)")
    config.addinivalue_line("markers", "codspeed_benchmark: the whole test is the benchmark (pytest-codspeed's meaning)")
    if not (session.settings.benchmark or session.judging.takes_turns or session.counts_instructions):
        return
    for name in _PYTEST_BENCHMARK:
        config.pluginmanager.set_blocked(name)
    config.pluginmanager.register(BenchmarkPlugin(), PLUGIN_NAME)
