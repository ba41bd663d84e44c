"""The plugin's hooks for users, from a user's conftest: a metric measured its own way and judged, the final results."""

from __future__ import annotations

import http.server
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

# In-process pytester runs restore sys.modules afterwards; importing torch here keeps it
# loaded across runs (re-importing its C extension in one process crashes).
import torch  # noqa: F401
import triton  # noqa: F401

# The results hook sits in the root conftest: under xdist the controller collects nothing, so
# it loads only the conftests of the rootdir and of the paths given on the command line.
ROOT_CONFTEST = """
import json

import pytest

class Cache:
    '''A lookup cache the tests use; counts its lookups and misses.'''

    def __init__(self):
        self.store, self.lookups, self.misses = {}, 0, 0

    def get(self, key):
        self.lookups += 1
        if key not in self.store:
            self.misses += 1
            self.store[key] = 2 * key
        return self.store[key]

@pytest.fixture
def cache():
    return Cache()

def pytest_perfbudget_results(config, results, path):
    posted = {"path": str(path), "on_worker": hasattr(config, "workerinput"),
              "records": sorted([r.nodeid, r.metric, r.outcome] for r in results.records)}
    with open(config.rootpath / "posted.jsonl", "a") as fh:
        fh.write(json.dumps(posted) + "\\n")
"""

# The per-test hook lives below perf/: it applies to the tests there only.
HOOKS_CONFTEST = """
def pytest_perfbudget_measured(item, perf):
    cache = item.funcargs.get("cache")
    if cache is None:
        return
    # A metric measured the user's own way, judged against the budgets like any other.
    perf.record("ratio[cache_miss_rate]", cache.misses / cache.lookups, extra={"lookups": cache.lookups})
    # Changing what was recorded: a failing check says where to look.
    perf.verdicts[:] = [v.with_(attribution=(*v.attribution, f"dashboard: https://dash.example/{perf.key}"))
                        if v.outcome == "fail" else v for v in perf.verdicts]
"""

CACHE_TESTS = """
import pytest

KEYS = {keys}

@pytest.mark.budget("cache")
def test_cache(perf, cache):
    for k in KEYS:
        cache.get(k)

def test_broken(perf, cache):
    cache.get(1)
    perf.record("flops", 1)
    assert False, "the test itself fails"
"""

OTHER_TESTS = """
def test_other(perf, cache):
    cache.get(1)
    perf.record("flops", 10)
"""


def _cache_tests(keys: list[int]) -> str:
    return CACHE_TESTS.format(keys=keys)


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(ROOT_CONFTEST)
    (pytester.path / "perf").mkdir()
    (pytester.path / "perf" / "conftest.py").write_text(HOOKS_CONFTEST)
    (pytester.path / "perf" / "test_cache.py").write_text(_cache_tests([1, 2, 1, 2]))
    (pytester.path / "other").mkdir()
    (pytester.path / "other" / "test_other.py").write_text(OTHER_TESTS)
    return pytester


def run(p: pytest.Pytester, *args: str) -> pytest.RunResult:
    return p.runpytest_inprocess("-p", "no:cacheprovider", "-o", "perfbudget_max_load=1e9",
                                 "-o", "perfbudget_html=false", *args)


def posted(p: pytest.Pytester) -> list[dict]:
    return [json.loads(line) for line in (p.path / "posted.jsonl").read_text().splitlines()]


def written(p: pytest.Pytester) -> list[list[str]]:
    data = json.loads((p.path / ".perfbudget" / "results.json").read_text())
    return sorted([r["nodeid"], r["metric"], r["outcome"]] for r in data["records"])


def test_a_conftest_adds_a_metric_that_is_judged_and_reads_the_final_results(project: pytest.Pytester) -> None:
    run(project, "--update-budgets").assert_outcomes(passed=2, failed=1)
    cpu = (project.path / "budgets" / "cpu.yaml").read_text()
    assert "ratio[cache_miss_rate]" in cpu and "value: 0.5" in cpu  # the hook's record wrote its budget

    r = run(project)
    r.assert_outcomes(passed=2, failed=1)
    assert ["perf/test_cache.py::test_cache", "ratio[cache_miss_rate]", "pass"] in written(project)
    data = json.loads((project.path / ".perfbudget" / "results.json").read_text())
    rec = next(x for x in data["records"] if x["metric"] == "ratio[cache_miss_rate]")
    assert rec["extra"] == {"lookups": 4} and rec["key"] == "cache"

    # Every lookup a miss: the user's metric fails its budget, with the user's explanation.
    (project.path / "perf" / "test_cache.py").write_text(_cache_tests([1, 2, 3, 4, 5, 6]))
    r = run(project)
    r.assert_outcomes(passed=1, failed=2)
    r.stdout.fnmatch_lines([
        "*perf budget check failed: cache on cpu*",
        "ratio[[]cache_miss_rate[]]: fail: *",
        "    dashboard: https://dash.example/cache",
    ])
    assert ["perf/test_cache.py::test_cache", "ratio[cache_miss_rate]", "fail"] in written(project)

    # A test that raised is not handed to the hook; a test outside perf/ is not either.
    metrics = {(nodeid, metric) for nodeid, metric, _ in written(project)}
    assert ("perf/test_cache.py::test_broken", "flops") in metrics
    assert ("perf/test_cache.py::test_broken", "ratio[cache_miss_rate]") not in metrics
    assert ("other/test_other.py::test_other", "ratio[cache_miss_rate]") not in metrics

    # The results hook ran once per run, with what was written and where.
    runs = posted(project)
    assert len(runs) == 3
    assert runs[-1]["path"] == str(project.path / ".perfbudget" / "results.json")
    assert runs[-1]["records"] == written(project)
    # The update run posts what it measured, before the budgets it then wrote.
    assert [next(o for n, m, o in x["records"] if m == "ratio[cache_miss_rate]") for x in runs] == [
        "unbudgeted", "pass", "fail"]


def test_under_xdist_the_workers_measure_and_the_controller_posts_once(project: pytest.Pytester) -> None:
    run(project, "--update-budgets").assert_outcomes(passed=2, failed=1)
    run(project, "-n", "2").assert_outcomes(passed=2, failed=1)
    runs = posted(project)[1:]
    assert len(runs) == 1 and runs[0]["on_worker"] is False
    assert ["perf/test_cache.py::test_cache", "ratio[cache_miss_rate]", "pass"] in runs[0]["records"]
    assert runs[0]["records"] == written(project)


def test_no_results_hook_without_perf_tests(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(ROOT_CONFTEST)
    pytester.makepyfile(test_plain="def test_plain():\n    assert True\n")
    run(pytester).assert_outcomes(passed=1)
    assert not Path(pytester.path / "posted.jsonl").exists()


HOOKS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "hooks.md"

LOADER_TESTS = """
import pytest

class Loader:
    '''Batches of token ids padded to the longest; counts tokens and padding.'''

    def __init__(self):
        self.tokens = self.padded = self.batches = 0

    def batch(self, lengths):
        width = max(lengths)
        self.tokens += width * len(lengths)
        self.padded += sum(width - n for n in lengths)
        self.batches += 1

@pytest.fixture
def loader():
    return Loader()

def test_batches(perf, loader):
    loader.batch([1, 4])
    loader.batch([2, 2])
"""


class _Dashboard(http.server.BaseHTTPRequestHandler):
    posted: ClassVar[list[bytes]]
    """Bodies received; each server's handler class has its own list."""

    def do_POST(self) -> None:
        self.posted.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def dashboard() -> Iterator[tuple[str, list[bytes]]]:
    """A local HTTP server keeping each body posted to it: (url, bodies)."""
    posted: list[bytes] = []
    handler = type("Handler", (_Dashboard,), {"posted": posted})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/runs", posted
    finally:
        server.shutdown()
        server.server_close()


def test_the_documented_conftest_records_padding_and_posts_the_results(
    pytester: pytest.Pytester, dashboard: tuple[str, list[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = re.findall(r"```python\n(.*?)```", HOOKS_PAGE.read_text(encoding="utf-8"), flags=re.S)
    found = [b for b in blocks if b.startswith("# conftest.py")]
    assert len(found) == 1, "docs/hooks.md holds one conftest example (starting '# conftest.py')"
    pytester.makeconftest(found[0])
    pytester.makepyfile(test_readme_loader=LOADER_TESTS)  # a basename no other test module has
    url, posted = dashboard
    monkeypatch.setenv("PERF_DASHBOARD_URL", url)
    run(pytester, "--update-budgets").assert_outcomes(passed=1)
    assert "padding_rate:\n      value: 0.25\n" in (pytester.path / "budgets" / "cpu.yaml").read_text()
    run(pytester).assert_outcomes(passed=1)
    results = (pytester.path / ".perfbudget" / "results.json").read_bytes()
    assert len(posted) == 2 and posted[-1] == results
    rec = json.loads(results)["records"][0]
    assert (rec["metric"], rec["outcome"], rec["extra"]) == ("padding_rate", "pass", {"batches": 2})
