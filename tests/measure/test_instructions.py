"""Instruction counts: callgrind dumps parsed, steps counted under valgrind, and the unmeasurable paths."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from perfbudget import cli
from perfbudget.instructions_run import callgrind_command, run_instructions
from perfbudget.measure import instructions as ins
from perfbudget.measure.unmeasurable import Unmeasurable

PROBE = Path(__file__).resolve().parent.parent / "data" / "measure" / "instructions_probe.py"

# A dump as callgrind writes one (name compression, relative positions, a call and a recursive call).
DUMP = """\
# callgrind format
version: 1
creator: callgrind-3.19.0
pid: 4242
cmd:  python probe.py
part: 2

desc: Timerange: Basic block 10 - 20
desc: Trigger: Client Request: perfbudget: step

positions: line
events: Ir
summary: 18446744073709551000

ob=(1) /usr/lib/libtorch_cpu.so
fl=(1) mm.cpp
fn=(1) at::mm
10 100
+2 50
cfn=(2) gemm
calls=3 +5
* 700
fn=(2)
15 700
cfn=(2)
calls=1 0
* 40
ob=(2) /usr/lib/libc.so.6
fl=(2) memcpy.S
fn=(3) memcpy
1 30
fn=(4) eval
1 10
cfn=(5) eval'2
calls=1 0
* 25
fn=(5)
1 25
cfn=(3)
calls=1 0
* 18446744073709551606

totals: 915
"""


def test_read_dump_totals_self_and_inclusive(tmp_path: Path) -> None:
    path = tmp_path / "callgrind.out.4242.2"
    path.write_text(DUMP, encoding="utf-8")
    dump = ins.read_dump(path)
    assert dump.total_ir == 915  # `totals:`, not the wrapped-around summary
    assert dump.trigger == "Client Request: perfbudget: step"
    mm, gemm, memcpy = (dump.functions[k] for k in ("at::mm [libtorch_cpu.so]", "gemm [libtorch_cpu.so]",
                                                     "memcpy [libc.so.6]"))
    assert (mm.self_ir, mm.inclusive_ir) == (150, 850)
    assert (gemm.self_ir, gemm.inclusive_ir) == (700, 700)  # its call to itself is not counted twice
    assert (memcpy.self_ir, memcpy.inclusive_ir) == (30, 30)
    # Recursion levels merged: self adds up; the outer level's inclusive holds the inner one.
    # The inner level's call carries a negative remainder (printed unsigned by callgrind).
    evaluate = dump.functions["eval [libc.so.6]"]
    assert (evaluate.self_ir, evaluate.inclusive_ir) == (35, 35)
    assert ins.read_dump(path, functions=False).functions == {}


def test_history_dependent_functions_are_the_allocators_and_lookups_of_their_own_libraries() -> None:
    left_out = ["_int_malloc [libc.so.6]", "unlink_chunk.constprop.0 [libc.so.6]", "free [libc.so.6]",
                "posix_memalign [libc-2.31.so]", "_PyObject_Free [libpython3.11.so.1.0]",
                "unicodekeys_lookup_unicode [libpython3.11.so.1.0]", "_PyType_Lookup [python3.12]",
                "assign_version_tag.isra.0 [libpython3.11.so.1.0]", "je_malloc_default [libjemalloc.so.2]",
                "tc_malloc [libtcmalloc_minimal.so.4]"]
    kept = ["memcpy [libc.so.6]", "_PyEval_EvalFrameDefault [libpython3.11.so.1.0]",
            "malloc [libmyalloc.so]",  # a user's function of the same name, in the user's library
            "at::native::mm [libtorch_cpu.so]", "c10::alloc_cpu(unsigned long) [libc10.so]",
            "dict_subscript [libpython3.11.so.1.0]", "malloc", "0x000000003c32e000 [???]"]
    assert [f for f in left_out if not ins.history_dependent(f)] == []
    assert [f for f in kept if ins.history_dependent(f)] == []


def test_a_count_keeps_its_dump_as_read_so_attribution_does_not_read_it_again(tmp_path: Path) -> None:
    files = [tmp_path / "a", tmp_path / "b"]
    files[0].write_text(DUMP, encoding="utf-8")
    files[1].write_text(DUMP.replace("1 30", "1 40").replace("totals: 915", "totals: 925"), encoding="utf-8")
    counts = [ins.InstructionCount(per_step=0.0, total=0, steps=1, counter=ins.CALLGRIND_IR, dump=f,
                                   parsed=ins.read_dump(f)) for f in files]
    for f in files:
        f.unlink()  # only the parsed copies remain
    (moved,) = ins.moved_functions(*counts, k=1)
    assert moved.function == "memcpy [libc.so.6]" and moved.self_delta_per_step == 10


def test_moved_functions_ranks_by_inclusive_change(tmp_path: Path) -> None:
    before = tmp_path / "a"
    after = tmp_path / "b"
    before.write_text(DUMP, encoding="utf-8")
    after.write_text(DUMP.replace("* 700", "* 900").replace("15 700", "15 900").replace("1 30", "1 31")
                     .replace("totals: 915", "totals: 1116"), encoding="utf-8")
    moved = ins.moved_functions(before, after, k=2)
    # Both moved by 200 inclusive; the tie goes to the one whose own code moved.
    assert [m.function for m in moved] == ["gemm [libtorch_cpu.so]", "at::mm [libtorch_cpu.so]"]
    assert [(m.delta_per_step, m.self_delta_per_step) for m in moved] == [(200, 200), (200, 0)]
    assert ins.moved_functions(before, after, k=3)[2].delta_per_step == 1
    assert {m.function for m in ins.moved_functions(before, after)} == {
        "gemm [libtorch_cpu.so]", "at::mm [libtorch_cpu.so]", "memcpy [libc.so.6]"}
    assert ins.moved_functions(before, before) == []
    # A function whose inclusive count exceeds its dump's total straddled the collection switch.
    assert ins.read_dump(tmp_path / "a").functions["eval [libc.so.6]"].straddles is False
    straddling = tmp_path / "c"
    straddling.write_text(DUMP.replace("* 25\n", "* 2000\n"), encoding="utf-8")
    assert ins.read_dump(straddling).functions["eval [libc.so.6]"].straddles is True
    assert "eval [libc.so.6]" not in {m.function for m in ins.moved_functions(before, straddling)}


def test_not_under_valgrind_is_unmeasurable_with_the_run_hint() -> None:
    got = ins.instructions(lambda: None, counter="callgrind")
    assert isinstance(got, Unmeasurable) and not got
    assert "not running under valgrind" in got.reason
    expected = ins.RUN_HINT if shutil.which("valgrind") else ins.INSTALL_HINT
    assert expected in got.reason


def test_missing_valgrind_gives_the_install_hint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without valgrind
    got = ins.instructions(lambda: None, counter="callgrind")
    assert isinstance(got, Unmeasurable) and ins.INSTALL_HINT in got.reason
    assert cli.main(["instructions", "--out", str(tmp_path / "out"), "--", "tests"]) == 2
    assert "apt-get install valgrind" in capsys.readouterr().err


def test_hardware_counter_counts_or_says_why() -> None:
    counter = ins.open_hardware_counter()
    if isinstance(counter, Unmeasurable):  # VMs without a virtual PMU (ENOENT), paranoid kernels (EACCES)
        assert "perf_event_open(PERF_COUNT_HW_INSTRUCTIONS) failed with E" in counter.reason
        got = ins.instructions(lambda: None)  # auto: neither callgrind nor a counter
        assert isinstance(got, Unmeasurable)
        assert "not running under valgrind, and perf_event_open" in got.reason
        assert ins.callgrind_hint() in got.reason
        return
    counter.close()
    short = ins.instructions(lambda: sum(range(100)), steps=50, counter="hardware")
    long = ins.instructions(lambda: sum(range(10_000)), steps=50, counter="hardware")
    assert isinstance(short, ins.InstructionCount) and isinstance(long, ins.InstructionCount)
    assert short.counter == long.counter == ins.HARDWARE_INSTRUCTIONS and short.dump is None
    assert long.per_step > 20 * short.per_step


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="steps must be >= 1"):
        ins.instructions(lambda: None, steps=0)
    with pytest.raises(ValueError, match="got 'cachegrind'"):
        ins.instructions(lambda: None, counter="cachegrind")  # type: ignore[arg-type]


def test_callgrind_command_keeps_the_results_and_starts_uninstrumented(tmp_path: Path) -> None:
    cmd = callgrind_command(["perf_tests", "-k", "tiny"], tmp_path, python="py")
    assert cmd[:2] == ["valgrind", "--tool=callgrind"]
    assert {"--collect-atstart=no", "--instr-atstart=no", f"--callgrind-out-file={tmp_path}/callgrind.out.%p"} <= set(cmd)
    assert cmd[-8:] == ["py", "-m", "pytest", "perf_tests", "-k", "tiny", "--perf-json", str(tmp_path / "results.json")]
    assert "--instr-atstart=yes" in callgrind_command([], tmp_path, fast_start=False)
    assert callgrind_command(["--perf-json=r.json"], tmp_path)[-1] == "--perf-json=r.json"
    assert callgrind_command(["-p", "no:perfbudget"], tmp_path)[-1] == "no:perfbudget"


def test_a_results_file_an_earlier_run_left_is_not_this_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A stand-in valgrind that writes the results file only when asked: a file left by an earlier
    run is not reported as this one's."""
    import perfbudget.instructions_run as instructions_run

    monkeypatch.setattr(instructions_run, "build_helper", lambda: Unmeasurable(reason="no helper in this test"))
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "valgrind").write_text('#!/bin/sh\n[ -n "$WRITE_RESULTS" ] && echo "{}" > "$WRITE_RESULTS"\nexit 0\n')
    (tools / "valgrind").chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    results = out / "results.json"
    results.write_text('{"an": "earlier run"}\n')
    run = run_instructions(["tests"], out, env={"PATH": str(tools)})
    assert run.exit_code == 0 and run.results_json is None
    assert f"no results written ({results} is an earlier run's)" in capsys.readouterr().err
    run = run_instructions(["tests"], out, env={"PATH": str(tools), "WRITE_RESULTS": str(results)})
    assert run.results_json == results and f"; results in {results}" in capsys.readouterr().err


# --------------------------------------------------------------------------- under valgrind (one process)


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One pytest session under ``perfbudget instructions`` running the probe: torch imported once."""
    if shutil.which("valgrind") is None:
        pytest.skip(ins.INSTALL_HINT)
    work = tmp_path_factory.mktemp("instructions")
    test_file = work / "test_probe.py"
    shutil.copy(PROBE, test_file)
    env = {**os.environ, "PROBE_OUT": str(work / "probe.json")}
    start = time.monotonic()
    run = run_instructions([str(test_file), "-q", "-p", "no:cacheprovider"], work / "out", env=env)
    assert run.exit_code == 0, f"probe session failed; see {work / 'out'}"
    data: dict[str, Any] = json.loads((work / "probe.json").read_text(encoding="utf-8"))
    data["_run"] = run
    data["_wall_s"] = time.monotonic() - start
    return data


@pytest.mark.integration
@pytest.mark.valgrind
def test_same_step_counts_the_same_and_a_plant_adds_its_cost(probe: dict[str, Any]) -> None:
    assert probe["under_valgrind"] is True
    base, again, planted, alone = (probe[k] for k in ("base", "again", "planted", "plant_alone"))
    for got in (base, again, planted, alone):
        assert got.get("counter") == ins.CALLGRIND_IR, got
        assert got["steps"] == 100 and got["per_step"] == (got["total"] - got["history_dependent"]) / 100
        assert 0 < got["history_dependent"] < 0.5 * got["total"]
    # The same process, a later heap: glibc's malloc takes other paths (0.09-0.73 % of all counted
    # instructions on this small, allocation-heavy step). The value leaves the allocators out,
    # so the same step counts the same, and what moved was in the part left out.
    assert abs(again["per_step"] / base["per_step"] - 1) < 0.001
    added = planted["per_step"] - base["per_step"]
    assert added > 0.1 * base["per_step"]
    assert abs(added / alone["per_step"] - 1) < 0.15  # the plant adds about what it costs alone


@pytest.mark.integration
@pytest.mark.valgrind
def test_each_count_has_its_own_dump_and_the_plant_names_what_moved(probe: dict[str, Any]) -> None:
    run = probe["_run"]
    dumps = [Path(probe[k]["dump"]) for k in ("base", "again", "planted", "plant_alone")]
    assert list(run.dumps[:4]) == dumps and run.results_json is not None and run.results_json.exists()
    base = ins.InstructionCount(**{**probe["base"], "dump": dumps[0]})
    planted = ins.InstructionCount(**{**probe["planted"], "dump": dumps[2]})
    assert ins.read_dump(dumps[2]).trigger == "Client Request: perfbudget: planted"
    moved = ins.moved_functions(base, planted, k=10)
    names = [m.function for m in moved]
    assert all(m.delta_per_step > 0 for m in moved), moved  # the plant only adds
    assert any("THPVariable_matmul" in n for n in names) and any("at::native::matmul" in n for n in names), names
    assert not any(f.straddles for f in ins.read_dump(dumps[0]).functions.values() if "matmul" in f.function)


@pytest.mark.integration
@pytest.mark.valgrind
def test_torch_toggles_without_instrumentation_are_unmeasurable(probe: dict[str, Any]) -> None:
    reason = probe["without_helper"]["unmeasurable"]
    assert "counted no instructions" in reason and "no-such-compiler" in reason
    assert "valgrind's own work" in probe["hardware_under_valgrind"]["unmeasurable"]
    print(f"valgrind probe session: {probe['_wall_s']:.0f} s wall")


def test_a_helper_build_that_hangs_or_fails_is_unmeasurable_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compiler stuck on a lock must not hang the session, and a build that failed is not retried on every ask."""
    calls = tmp_path / "calls"
    for name, body, says in (("slow-cc", "sleep 30", "took over 1 s"), ("bad-cc", "echo 'no callgrind.h' >&2; exit 1",
                                                                        "cannot build the callgrind helper (no callgrind.h)")):
        cc = tmp_path / name
        cc.write_text(f"#!/bin/sh\necho x >> {calls}\n{body}\n")
        cc.chmod(0o755)
        monkeypatch.setenv("CC", str(cc))
        monkeypatch.setattr(ins, "BUILD_TIMEOUT_S", 1)
        monkeypatch.setattr(ins, "_helper_cache", {})
        folder = tmp_path / name.replace("-cc", "")
        first = ins.build_helper(folder)
        assert isinstance(first, Unmeasurable) and says in first.reason
        assert ins.build_helper(folder) is first
    assert calls.read_text().count("x") == 2  # one build each
