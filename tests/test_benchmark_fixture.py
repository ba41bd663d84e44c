"""pytest-benchmark's ``benchmark`` fixture and the benchmark markers under perfbudget, on constructed timings.

The bench (the seam every ``perf.time`` measures through) is replaced by one that calls the benchmark
as the real one does and returns literal times, so what is checked is what the fixture and the plugin
decide. Runs with pytest-benchmark installed (scripts/test-benchmark-compat.sh) and without it.
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

# In-process pytester runs restore sys.modules afterwards; importing torch here keeps it
# loaded across runs (re-importing its C extension in one process crashes).
import torch  # noqa: F401
import triton  # noqa: F401

from perfbudget.benchmark import (
    BENCHMARK_METRIC,
    BenchmarkError,
    BenchmarkFixture,
    BenchmarkOptions,
)
from perfbudget.budgets import load_dir
from perfbudget.device import DeviceInfo
from perfbudget.measure import timing
from perfbudget.measure.timing import MIN_SAMPLES, Samples, bench, calls_per_sample
from perfbudget.recorder import CountedSteps, PerfRecorder, core
from perfbudget.verdict.judge import Judge, JudgeConfig

PYTEST_BENCHMARK = importlib.util.find_spec("pytest_benchmark") is not None
ME = DeviceInfo(type="cpu", model="Test CPU", count=1, threads=1, cpuid="6/207/2", isa="avx2", isa_class="avx2")


class FakeBench:
    """Stands in for :func:`perfbudget.measure.timing.bench`: calls the benchmark (after its setup) three
    times, as a warm-up and timed rounds would, and returns ``per_call_ms`` as the samples."""

    def __init__(self, per_call_ms: float = 0.5) -> None:
        self.per_call_ms = per_call_ms
        self.calls: list[dict[str, Any]] = []

    def __call__(self, fn: Callable[[], Any], **kw: Any) -> Samples:
        self.calls.append(kw)
        for _ in range(3):
            if kw.get("setup") is not None:
                kw["setup"]()
            fn()
        return Samples(samples_ms=(self.per_call_ms,) * 30, warmup_calls=1, threads=1)


@pytest.fixture
def fake_bench(monkeypatch: pytest.MonkeyPatch) -> FakeBench:
    fake = FakeBench()
    monkeypatch.setattr(core, "bench", fake)
    return fake


def fixture(tmp_path: Path, options: BenchmarkOptions | None = None, counted: CountedSteps | None = None,
            ) -> BenchmarkFixture:
    rec = PerfRecorder(Judge("sort[10]", ME, load_dir(tmp_path), JudgeConfig()), nodeid="b.py::test_sort[10]",
                       counted_steps=counted)
    return BenchmarkFixture(rec, name="test_sort[10]", fullname="b.py::test_sort[10]", options=options)


# ------------------------------------------------------------------ the fixture's conventions


def test_a_call_returns_the_functions_result_and_records_one_timing_check(tmp_path: Path,
                                                                         fake_bench: FakeBench) -> None:
    seen = []
    b = fixture(tmp_path, BenchmarkOptions(min_rounds=7, max_time=0.25, min_time=0.002))
    assert b(lambda x, *, y: seen.append((x, y)) or x + y, 2, y=3) == 5
    assert set(seen) == {(2, 3)}
    (kw,) = fake_bench.calls
    # Rounds of at least 1 ms (here the marker's min_time, 2 ms), min_rounds and max_time as the bench's.
    assert kw == {"min_sample_ms": 2.0, "min_samples": 7, "max_ms": 250.0, "device": "cpu", "threads": 1}
    (v,) = b._perf.verdicts
    assert (v.metric, v.value, b.metric) == (BENCHMARK_METRIC, 0.5, BENCHMARK_METRIC)


def test_pedantic_gives_every_call_fresh_inputs_untimed(tmp_path: Path, fake_bench: FakeBench) -> None:
    made, torn = [], []

    def setup() -> tuple[tuple[list[int]], dict[str, Any]]:
        made.append([3, 1, 2])
        return (made[-1],), {}

    b = fixture(tmp_path)
    assert b.pedantic(sorted, setup=setup, teardown=lambda xs: torn.append(xs), rounds=20, warmup_rounds=5) == [1, 2, 3]
    (kw,) = fake_bench.calls
    # rounds=20 is a floor under the bench's own 30 timed calls, not a replacement of it.
    assert kw["min_samples"] == MIN_SAMPLES and kw["min_warmup_calls"] == 5 and "min_sample_ms" not in kw
    assert kw["setup"] is not None
    assert len(made) == len(torn) == 4  # the first call, then each of the bench's; each torn down


@pytest.mark.parametrize(("rounds", "min_rounds", "want"), [(1, None, MIN_SAMPLES), (50, None, 50), (3, 40, 40),
                                                            (60, 40, 60)])
def test_pedantic_rounds_and_the_markers_min_rounds_are_floors(tmp_path: Path, fake_bench: FakeBench, rounds: int,
                                                               min_rounds: int | None, want: int) -> None:
    fixture(tmp_path, BenchmarkOptions(min_rounds=min_rounds)).pedantic(sorted, args=([2, 1],), rounds=rounds)
    (kw,) = fake_bench.calls
    assert kw["min_samples"] == want


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"iterations": 2, "setup": lambda: None}, "Can't use more than 1 `iterations` with a `setup` function."),
    ({"rounds": 0}, "Must have positive int for `rounds`."),
    ({"args": (1,), "setup": lambda: ((2,), {})}, "Can't use `args` or `kwargs` if `setup` returns the arguments."),
])
def test_pedantic_refuses_what_pytest_benchmark_refuses(tmp_path: Path, fake_bench: FakeBench,
                                                        kwargs: dict[str, Any], error: str) -> None:
    with pytest.raises((ValueError, BenchmarkError), match=error.replace("(", r"\(").replace(")", r"\)")):
        fixture(tmp_path).pedantic(lambda *a: None, **kwargs)


def test_used_twice_or_raising_is_an_error_naming_the_test(tmp_path: Path, fake_bench: FakeBench) -> None:
    b = fixture(tmp_path)
    b(sum, [1])
    with pytest.raises(BenchmarkError, match=r"^b\.py::test_sort\[10\]: the benchmark fixture measures one benchmark "
                                             r"per test; it was already used as benchmark\(\.\.\.\)"):
        b.pedantic(sum, args=([1],))
    with pytest.raises(BenchmarkError, match=r"^b\.py::test_sort\[10\]: benchmark\(\.\.\.\) raised "
                                             "ZeroDivisionError: division by zero") as raised:
        fixture(tmp_path)(lambda: 1 / 0)
    assert isinstance(raised.value.__cause__, ZeroDivisionError)


def test_a_non_finite_time_is_an_error_record(tmp_path: Path, fake_bench: FakeBench) -> None:
    fake_bench.per_call_ms = math.nan
    b = fixture(tmp_path)
    b(sum, [1])
    (v,) = b._perf.verdicts
    assert v.outcome == "error" and "non-finite measurement" in v.reason


def test_a_marked_benchmark_is_counted_under_callgrind_instead(tmp_path: Path, fake_bench: FakeBench,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    counted: list[dict[str, Any]] = []

    def instructions(self: PerfRecorder, step: Callable[[], Any], **kw: Any) -> Any:
        counted.append(kw)
        return SimpleNamespace(metric="instructions[callgrind]")

    monkeypatch.setattr(PerfRecorder, "instructions", instructions)
    b = fixture(tmp_path, counted=CountedSteps(steps=5, warmup=2))
    assert b(sum, [1, 2]) == 3
    assert counted == [{"steps": 5, "warmup": 2, "counter": "callgrind"}] and not fake_bench.calls
    assert b.metric == "instructions[callgrind]"
    fresh = fixture(tmp_path, counted=CountedSteps())
    fresh.pedantic(sorted, setup=lambda: (([2, 1],), {}))
    (v,) = fresh._perf.verdicts
    assert v.outcome == "unmeasurable" and "setup or teardown" in v.reason


def test_a_marker_option_pytest_benchmark_lacks_names_the_test() -> None:
    mark = pytest.mark.benchmark(group="g", rounds=3).mark
    item: Any = SimpleNamespace(nodeid="b.py::test_x", get_closest_marker=lambda name: mark)
    with pytest.raises(BenchmarkError, match=r"test_x: @pytest.mark.benchmark takes only the options .*\['rounds'\]"):
        BenchmarkOptions.of(item)


# ------------------------------------------------------------------ batching, on a constructed clock


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def work(self, seconds: float) -> Callable[[], None]:
        def run() -> None:
            self.now += seconds
        return run


def test_calls_per_sample_grows_a_batch_until_it_lasts_long_enough() -> None:
    clock = Clock()
    assert calls_per_sample(clock.work(2e-6), 1.0, clock=clock) == 500
    assert calls_per_sample(clock.work(3e-3), 1.0, clock=clock) == 1
    assert calls_per_sample(lambda: None, 1.0, clock=clock, max_calls=1000) == 1000  # a clock that never moves


def test_bench_times_batches_per_call_and_setup_untimed(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=clock))
    batched = bench(clock.work(2e-6), warmup_ms=0, min_samples=5, max_ms=0, threads=None, min_sample_ms=1.0)
    assert batched.calls_per_sample == 500 and batched.samples_ms == pytest.approx([2e-3] * 5)
    fresh = bench(clock.work(1e-3), warmup_ms=0, min_samples=5, max_ms=0, threads=None, setup=clock.work(5.0))
    assert fresh.samples_ms == pytest.approx([1.0] * 5)
    with pytest.raises(ValueError, match="calls cannot be batched"):
        bench(clock.work(1e-3), min_sample_ms=1.0, setup=clock.work(1.0))


# ------------------------------------------------------------------ the plugin: who owns `benchmark`

SUITE = """
import pytest

def work(n):
    return sum(range(n))

def test_call(benchmark):
    assert benchmark(work, 10) == 45
    benchmark.extra_info["n"] = 10  # after the call, as suites do

@pytest.mark.benchmark(group="sums", min_rounds=9)
@pytest.mark.parametrize("n", [100])
def test_pedantic(benchmark, n):
    assert benchmark.pedantic(work, args=(n,), rounds=3) == 4950

@pytest.mark.codspeed_benchmark
def test_whole():
    assert work(3) == 3

def test_plain():
    pass
"""


def run(p: pytest.Pytester, *args: str) -> pytest.RunResult:
    # hypothesis's plugin would import hypothesis again in every in-process run (seconds each).
    return p.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "--strict-markers",
                                 "-o", "perfbudget_max_load=1e9", *args)


def records(p: pytest.Pytester) -> dict[str, dict[str, Any]]:
    path = p.path / ".perfbudget" / "results.json"
    return {r["nodeid"]: r for r in json.loads(path.read_text())["records"]} if path.exists() else {}


def test_asked_to_measure_every_benchmark_is_a_check_named_after_its_test(pytester: pytest.Pytester,
                                                                         fake_bench: FakeBench) -> None:
    pytester.makepyfile(test_suite=SUITE)
    r = run(pytester, "-o", "perfbudget_benchmark=true")
    r.assert_outcomes(passed=4)
    got = {nodeid: (r["key"], r["metric"], r["value"], r["extra"]["benchmark"]) for nodeid, r in records(pytester).items()}
    assert got == {
        "test_suite.py::test_call": ("call", BENCHMARK_METRIC, 0.5, {"group": None, "extra_info": {"n": 10}}),
        "test_suite.py::test_pedantic[100]": ("pedantic[100]", BENCHMARK_METRIC, 0.5,
                                              {"group": "sums", "extra_info": {}}),
        "test_suite.py::test_whole": ("whole", BENCHMARK_METRIC, 0.5, {"group": None, "extra_info": {}}),
    }
    assert "benchmark: " not in r.stdout.str()  # pytest-benchmark, where installed, stood aside: no table of its own


def test_not_asked_the_suite_is_pytest_benchmarks_and_perfbudget_records_nothing(pytester: pytest.Pytester,
                                                                                 fake_bench: FakeBench) -> None:
    pytester.makepyfile(test_suite=SUITE)
    r = run(pytester, *(["--benchmark-disable"] if PYTEST_BENCHMARK else []))
    if PYTEST_BENCHMARK:
        r.assert_outcomes(passed=4)
    else:  # the markers are perfbudget's too: --strict-markers passes; the fixture is nobody's
        r.assert_outcomes(passed=2, errors=2)
        r.stdout.fnmatch_lines(["*fixture 'benchmark' not found*"])
    assert not fake_bench.calls and records(pytester) == {}


def test_errors_name_the_test_and_the_other_benchmarks_are_kept(pytester: pytest.Pytester,
                                                                fake_bench: FakeBench) -> None:
    pytester.makepyfile(test_suite=SUITE + """
def test_raises(benchmark):
    benchmark(lambda: 1 / 0)

def test_twice(benchmark):
    benchmark(work, 1)
    benchmark(work, 2)
""")
    r = run(pytester, "-o", "perfbudget_benchmark=true")
    r.assert_outcomes(passed=4, failed=2)
    r.stdout.fnmatch_lines(["*BenchmarkError: test_suite.py::test_raises: benchmark(...) raised ZeroDivisionError*",
                            "*BenchmarkError: test_suite.py::test_twice: the benchmark fixture measures one benchmark "
                            "per test*"])
    assert {"test_suite.py::test_call", "test_suite.py::test_pedantic[100]", "test_suite.py::test_whole"} <= set(
        records(pytester))
    errors = json.loads((pytester.path / ".perfbudget" / "results.json").read_text())["meta"]["errors"]
    assert [e["nodeid"] for e in errors] == ["test_suite.py::test_raises", "test_suite.py::test_twice"]


def test_the_docs_show_the_example_suite_as_it_is() -> None:
    root = Path(__file__).resolve().parents[1]
    block = (root / "docs" / "benchmark-suites.md").read_text().split("```python\n", 1)[1].split("```", 1)[0]
    suite = "".join(p.read_text() for p in (root / "examples" / "pytest-benchmark-suite" / "benchmarks").glob("*.py"))
    assert [line for line in block.splitlines() if line.strip() and not line.startswith("#") and line not in suite] == []


def test_a_pedantic_setup_on_cuda_is_unmeasurable_not_an_error(tmp_path: Path, fake_bench: FakeBench) -> None:
    gpu = DeviceInfo(type="cuda", model="Test GPU", count=1)
    rec = PerfRecorder(Judge("sort[10]", gpu, load_dir(tmp_path), JudgeConfig()), nodeid="b.py::test_sort[10]")
    b = BenchmarkFixture(rec, name="test_sort[10]", fullname="b.py::test_sort[10]")
    assert b.pedantic(sorted, setup=lambda: (([2, 1],), {})) == [1, 2]
    (v,) = rec.verdicts
    assert v.outcome == "unmeasurable" and "CPU only" in v.reason and fake_bench.calls == []
