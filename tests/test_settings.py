"""Settings read once: command line > environment > ini file > default, for the plugin and every command;
the run spec an A/B side is handed, and its errors."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from perfbudget.cli import main
from perfbudget.session import settings_of
from perfbudget.settings import (
    SPEC_ENV,
    STABLE_MACHINE_ENV,
    RunSpec,
    Settings,
    find_ini,
    for_folder,
    pytest_cli,
    run_spec,
)

DATA = Path(__file__).parent / "data" / "results"
REGRESSION = str(DATA / "regression.json")
INI = {"perfbudget_stable_machine": "from-ini"}
ENV = {STABLE_MACHINE_ENV: "from-env"}
CLI = {"stable_machine": "from-cli"}


@pytest.mark.parametrize(("cli", "env", "ini", "want"), [
    (CLI, ENV, INI, "from-cli"),
    ({}, ENV, INI, "from-env"),
    ({"stable_machine": None}, {STABLE_MACHINE_ENV: "  "}, INI, "from-ini"),  # not given, empty: not set
    ({}, {}, INI, "from-ini"),
    ({}, {}, {}, ""),
])
def test_one_rule_command_line_then_environment_then_ini_then_default(
        cli: dict[str, str], env: dict[str, str], ini: dict[str, str], want: str) -> None:
    assert Settings.resolve(cli=cli, env=env, ini=ini).stable_machine == want


def test_values_are_typed_and_folders_relative_to_where_they_were_given(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "repo"
    ini = {"perfbudget_budgets_dir": "perf/budgets", "perfbudget_threads": "2", "perfbudget_max_load": "-1",
           "perfbudget_html": "false", "perfbudget_pin_gpus": True, "perfbudget_inductor_dir": ""}
    s = Settings.resolve(ini=ini, root=root, env={"PERFBUDGET_TURNS_BURST_MS": "25", "PERFBUDGET_KEEP_TMPDIR": "1"})
    assert s.budgets_dir == root / "perf" / "budgets"  # the ini's: relative to the rootdir
    assert (s.threads, s.max_load, s.html, s.pin_gpus, s.burst_ms, s.keep_tmpdir) == (2, -1.0, False, True, 25.0, True)
    assert s.inductor_dir == ""  # an empty ini value is a value ("leave inductor's folders"), not the default
    assert Settings.resolve(cli={"budgets_dir": "mine"}, ini=ini, root=root).budgets_dir == tmp_path / "mine"
    default = Settings.resolve(root=root, env={})
    assert default.budgets_dir == root / "budgets" and default.helper_cache_dir == Path.home() / ".cache" / "perfbudget"
    assert (default.threads, default.burst_ms, default.wait_s, default.inductor_dir) == (1, 100.0, 1800.0, ".perfbudget")


@pytest.mark.parametrize(("kw", "message"), [
    ({"ini": {"perfbudget_threads": "two"}, "ini_file": "tox.ini"},
     "tox.ini: perfbudget_threads: expected an integer, got 'two'"),
    ({"ini": {"perfbudget_html": "maybe"}}, "ini: perfbudget_html: expected true or false, got 'maybe'"),
    ({"env": {"PERFBUDGET_TURNS_BURST_MS": "fast"}}, "PERFBUDGET_TURNS_BURST_MS: expected a positive number, got 'fast'"),
    ({"env": {"PERFBUDGET_TURNS_WAIT_S": "0"}}, "PERFBUDGET_TURNS_WAIT_S: expected a positive number, got '0'"),
    ({"cli": {"burst_ms": -5.0}}, "--burst-ms: expected a positive number, got -5.0"),
])
def test_a_bad_value_names_where_it_came_from(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        Settings.resolve(**kw)  # type: ignore[arg-type]
    assert str(caught.value) == message


@pytest.mark.parametrize(("name", "text"), [
    ("pytest.ini", "[pytest]\nperfbudget_budgets_dir = b\n"),
    ("pyproject.toml", "[tool.pytest.ini_options]\nperfbudget_budgets_dir = \"b\"\n"),
    ("tox.ini", "[tox]\n[pytest]\nperfbudget_budgets_dir = b\n"),
    ("setup.cfg", "[metadata]\nname = x\n[tool:pytest]\nperfbudget_budgets_dir = b\n"),
])
def test_a_command_finds_the_ini_file_pytest_would(tmp_path: Path, name: str, text: str) -> None:
    (tmp_path / name).write_text(text)
    (tmp_path / "sub" / "dir").mkdir(parents=True)
    assert find_ini(tmp_path / "sub" / "dir") == (tmp_path, tmp_path / name, {"perfbudget_budgets_dir": "b"})
    assert for_folder(tmp_path / "sub" / "dir").budgets_dir == tmp_path / "b"


def test_files_without_pytest_options_are_passed_over_as_pytest_does(tmp_path: Path) -> None:
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "tox.ini").write_text("[tox]\nenvlist = py\n")
    (inner / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert find_ini(inner) == (inner, inner / "pyproject.toml", {})  # a bare pyproject.toml: the rootdir
    (tmp_path / "pytest.ini").write_text("")  # a pytest.ini always counts, even empty
    assert find_ini(inner) == (tmp_path, tmp_path / "pytest.ini", {})
    (inner / "setup.cfg").write_text("[tool:pytest]\nperfbudget_threads = 3\n")
    assert find_ini(inner) == (inner, inner / "setup.cfg", {"perfbudget_threads": "3"})
    (inner / "pytest.ini").write_text("[pytest]\nperfbudget_threads = 4\n")  # first in pytest's order
    assert find_ini(inner)[1:] == (inner / "pytest.ini", {"perfbudget_threads": "4"})
    (inner / "pytest.ini").write_text("[pytest\n")
    with pytest.raises(ValueError, match=r"pytest\.ini: cannot be read"):
        find_ini(inner)


def test_the_plugin_reads_the_same_rule_from_pytest_config(pytester: pytest.Pytester,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeini("[pytest]\nperfbudget_budgets_dir = perf/budgets\nperfbudget_stable_machine = from-ini\n"
                     "perfbudget_threads = 2\n")
    monkeypatch.setenv(STABLE_MACHINE_ENV, "from-env")
    s = settings_of(pytester.parseconfig())
    assert (s.budgets_dir, s.stable_machine, s.threads) == (pytester.path / "perf" / "budgets", "from-env", 2)
    monkeypatch.delenv(STABLE_MACHINE_ENV)
    s = settings_of(pytester.parseconfig("--budgets-dir", "cli", "-o", "perfbudget_threads=3"))
    assert (s.budgets_dir, s.stable_machine, s.threads) == (Path.cwd() / "cli", "from-ini", 3)
    with pytest.raises(pytest.UsageError, match=r"perfbudget_threads: expected an integer, got 'x'"):
        settings_of(pytester.parseconfig("-o", "perfbudget_threads=x"))


def _run(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(args), out=out), out.getvalue()


def test_show_and_update_use_the_ini_budgets_folder_of_the_pytest_run_here(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(STABLE_MACHINE_ENV, raising=False)
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\nperfbudget_budgets_dir = "perf/budgets"\n'
                                            'perfbudget_stable_machine = "cpu-not-this-one-1-1-1-avx2"\n')
    (tmp_path / "perf" / "budgets").mkdir(parents=True)
    (tmp_path / "perf" / "budgets" / "cpu.yaml").write_text(
        "schema: 1\ndevice: {type: cpu}\nbudgets:\n  encoder-train:\n    flops: 1000\n")
    code, text = _run("show", "--from-results", REGRESSION)
    assert code == 0 and "does not exist" not in text and "cpu.yaml" in text
    code, text = _run("update", REGRESSION, "--dry-run")
    assert text.startswith("dry run: nothing written to perf/budgets")
    assert _run("show", "--budgets-dir", "elsewhere", "--from-results", REGRESSION)[1].startswith(
        "note: elsewhere does not exist")  # the option wins
    # The ini's stable-machine declaration reaches `show` too: it names another machine here.
    assert _run("show", "--key", "encoder-train")[0] == 2
    assert "declares a stable machine, but this cpu device is" in capsys.readouterr().err


# --------------------------------------------------------------------------- the run spec


def test_a_run_spec_goes_through_its_file_unchanged(tmp_path: Path) -> None:
    spec = RunSpec(side="base", socket="/s", report="r.turns", burst_ms=15, wait_s=60, precision=0.01,
                   operators_file="ops.json")
    path = tmp_path / "base.spec.json"
    path.write_text(spec.to_json())
    assert RunSpec.read(path) == spec
    assert run_spec({SPEC_ENV: str(path)}) == spec and run_spec({}) is None
    # A side measures (and records, meta.measured) the driver's burst length, whatever its environment says.
    side = Settings.resolve(env={SPEC_ENV: str(path), "PERFBUDGET_TURNS_BURST_MS": "400"})
    assert side.burst_ms == 15


@pytest.mark.parametrize(("text", "message"), [
    (None, "cannot be read: [Errno 2] No such file"),
    ("{side: head", "cannot be read: Expecting property name"),
    ('["head"]', "expected an object with side and some of ['allocator', 'burst_ms', 'lease', 'operators_file', 'precision', 'report', "
                 "'socket', 'wait_s'], got ['head']"),
    ('{"socket": "/s"}', "expected an object with side and some of"),
    ('{"side": "head", "burst": 5}', "got unknown keys ['burst']"),
    ('{"side": "left"}', "side: expected one of ('base', 'head'), got 'left'"),
    ('{"side": "head", "burst_ms": "fast"}', "burst_ms: expected a positive number, got 'fast'"),
    ('{"side": "head", "wait_s": -1}', "wait_s: expected a positive number, got -1"),
    ('{"side": "head", "precision": 1.5}', "precision: expected a fraction in (0, 1) such as 0.01, or null for one "
                                           "fixed sample set, got 1.5"),
    ('{"side": "head", "report": 3}', "report: expected a path, got 3"),
])
def test_a_bad_run_spec_names_the_file_the_key_and_the_value(tmp_path: Path, text: str | None, message: str) -> None:
    path = tmp_path / "head.spec.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ValueError) as caught:
        run_spec({SPEC_ENV: str(path)})
    text = str(caught.value)
    assert text.startswith(f"{SPEC_ENV}={path} (the run spec of `perfbudget ab`): ") and message in text


def test_a_side_with_a_bad_run_spec_is_a_usage_error(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"side": "head", "precision": 2}))
    monkeypatch.setenv(SPEC_ENV, str(spec))
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest_inprocess("-p", "no:randomly", "--perf-collect")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{SPEC_ENV}={spec}*precision: expected a fraction in (0, 1)*got 2"])


def test_a_command_reads_the_settings_among_pytest_args_as_pytest_does(tmp_path: Path) -> None:
    # `perfbudget ab -- perf_tests --perf-strict` is strict, as the pytest run would be; so is an ini
    # file that says so, and the command's own flag.
    assert pytest_cli(["perf_tests", "-k", "x", "--perf-strict", "--budgets-dir=b", "--perf-json", "o.json"]) == {
        "strict": True, "budgets_dir": "b"}
    assert pytest_cli(["perf_tests", "-k", "--perf-strictly"]) == {}
    (tmp_path / "pytest.ini").write_text("[pytest]\nperfbudget_strict = true\n")
    assert for_folder(tmp_path, cli=pytest_cli(["perf_tests"]), env={}).strict
    (tmp_path / "pytest.ini").write_text("[pytest]\nperfbudget_strict = maybe\n")
    with pytest.raises(ValueError, match=r"pytest\.ini: perfbudget_strict: expected true or false, got 'maybe'"):
        for_folder(tmp_path, env={})
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    assert not for_folder(tmp_path, env={}).strict
    assert for_folder(tmp_path, cli=pytest_cli(["--perf-strict"]), env={}).strict


def test_the_lease_is_one_ini_key_off_by_default_and_a_bad_value_names_it() -> None:
    assert Settings.resolve(ini={}).lease is False
    assert Settings.resolve(ini={"perfbudget_lease": "true"}).lease is True
    with pytest.raises(ValueError, match=r"pytest\.ini: perfbudget_lease: expected true or false, got 'half'"):
        Settings.resolve(ini={"perfbudget_lease": "half"}, ini_file="pytest.ini")
