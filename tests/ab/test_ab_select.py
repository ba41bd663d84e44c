"""Later pairs re-run only the undecided tests: the user's pytest args with their test selection replaced."""

from __future__ import annotations

import sys
from pathlib import Path

from perfbudget.ab.pairs import SideSetup, pytest_command, select_tests

NOISY = "perf/test_a.py::test_noisy[big batch-1]"
QUIET = "perf/test_a.py::test_quiet"


def test_positional_selections_are_replaced_and_options_kept(tmp_path: Path) -> None:
    (tmp_path / "perf").mkdir()
    (tmp_path / "perf" / "test_a.py").write_text("")
    args = ["perf", "-k", "perf", "--perf-strict", "-m", "not slow", "perf/test_a.py::test_quiet",
            "--ignore", "perf/other.py", "--deselect=perf/test_a.py::test_x", "-q", "--timeout", "30",
            "elsewhere/test_b.py", "-p", "no:randomly"]
    assert select_tests(args, [NOISY, QUIET], tree=tmp_path) == [
        "-k", "perf", "--perf-strict", "-m", "not slow", "--ignore", "perf/other.py",
        "--deselect=perf/test_a.py::test_x", "-q", "--timeout", "30", "-p", "no:randomly", NOISY, QUIET,
    ]
    # The value of an option this does not know stays, unless it names a path here.
    assert select_tests(["--my-plugin-level", "high"], [QUIET], tree=tmp_path) == ["--my-plugin-level", "high", QUIET]


def test_the_pytest_command_runs_the_given_nodeids_in_order_on_both_sides(tmp_path: Path) -> None:
    (tmp_path / "perf").mkdir()
    command = pytest_command(["perf", "-q"], python="py")
    whole = command(SideSetup(side="head", tree=tmp_path, results=tmp_path / "h.json"))
    assert whole[-2:] == ["perf", "-q"] and whole[:3] == ["py", "-m", "pytest"]
    for side in ("base", "head"):
        argv = command(SideSetup(side=side, tree=tmp_path, results=tmp_path / f"{side}.json", tests=(NOISY, QUIET)))
        assert argv[-3:] == ["-q", NOISY, QUIET] and "perf" not in argv
    assert pytest_command([], python=sys.executable)(
        SideSetup(side="base", tree=tmp_path, results=tmp_path / "b.json", tests=(QUIET,)))[-1] == QUIET
