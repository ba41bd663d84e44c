"""Failure artifacts: folder names, chrome trace, py-spy flame graph (real and failing), CUDA snapshot (fake)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from perfbudget.artifacts import (
    ALL_KINDS,
    Artifact,
    ArtifactConfig,
    artifact_dir,
    chrome_trace,
    cuda_memory_snapshot,
    describe_artifacts,
    find_py_spy,
    flame_graph,
    parse_kinds,
    write_failure_artifacts,
)


def tiny_step() -> None:
    a = torch.ones(32, 32)
    (a @ a).relu_()


# --------------------------------------------------------------------------- names and settings


def test_artifact_dir_is_readable_and_safe(tmp_path: Path) -> None:
    assert artifact_dir(tmp_path, "perf_tests/test_x.py::test_step") == tmp_path / "test_x.py__test_step"
    assert artifact_dir(tmp_path, "perf_tests/test_x.py::test_s[cuda-bf16]").name == "test_x.py__test_s[cuda-bf16]"
    odd = artifact_dir(tmp_path, "t.py::test[a b/c]")
    assert odd.parent == tmp_path and " " not in odd.name and "/" not in odd.name
    assert odd != artifact_dir(tmp_path, "t.py::test[a_b/c]")  # sanitising never merges two tests
    long = artifact_dir(tmp_path, "t.py::test[" + "x" * 300 + "]")
    assert len(long.name) <= 100


def test_parse_kinds_and_config_validation() -> None:
    assert parse_kinds("all") == ALL_KINDS and parse_kinds("") == ALL_KINDS
    assert parse_kinds("none") == ()
    assert parse_kinds("flamegraph, trace") == ("trace", "flamegraph")
    with pytest.raises(ValueError, match=r"unknown artifact kind.*flame.*expected all, none"):
        parse_kinds("trace,flame")
    with pytest.raises(ValueError, match="flame_seconds must be in"):
        ArtifactConfig(flame_seconds=0)
    with pytest.raises(ValueError, match="kinds: unknown"):
        ArtifactConfig(kinds=("perfetto",))  # type: ignore[arg-type]


def test_describe_names_every_artifact_or_why_not() -> None:
    text = describe_artifacts([
        Artifact(kind="trace", path=Path("/a/trace.json"), note="open in ui.perfetto.dev"),
        Artifact(kind="flamegraph", path=None, note="py-spy is not installed"),
    ])
    assert text.splitlines() == [
        "failure artifacts:",
        "    chrome trace: /a/trace.json  (open in ui.perfetto.dev)",
        "    flame graph: not written: py-spy is not installed",
    ]
    assert describe_artifacts([]) == ""


# --------------------------------------------------------------------------- chrome trace


def test_chrome_trace_is_a_perfetto_readable_json_with_the_steps_operators(tmp_path: Path) -> None:
    art = chrome_trace(tiny_step, tmp_path / "t" / "trace.json", steps=2)
    assert art.path is not None and art.kind == "trace", art.note
    data = json.loads(art.path.read_text())
    names = {e.get("name") for e in data["traceEvents"]}
    assert "aten::mm" in names and "aten::relu_" in names
    assert sum(1 for n in names if str(n).startswith("ProfilerStep#")) == 2


def test_chrome_trace_reruns_the_step_with_the_timers_thread_pinning(tmp_path: Path) -> None:
    seen: list[int] = []
    before = torch.get_num_threads()
    art = chrome_trace(lambda: seen.append(torch.get_num_threads()), tmp_path / "trace.json", steps=2, threads=1)
    assert art.path is not None and seen == [1, 1, 1] and torch.get_num_threads() == before
    # The timers' own checks apply: a thread count they refuse, or a device they do not know.
    assert "threads must be >= 1" in chrome_trace(tiny_step, tmp_path / "z.json", threads=0).note
    bad = chrome_trace(tiny_step, tmp_path / "d.json", device="tpu")  # type: ignore[arg-type]
    assert bad.path is None and "device must be 'cpu' or 'cuda', got 'tpu'" in bad.note


def test_chrome_trace_of_a_raising_step_is_a_note_not_an_exception(tmp_path: Path) -> None:
    def boom() -> None:
        raise RuntimeError("shape mismatch")

    art = chrome_trace(boom, tmp_path / "trace.json")
    assert art.path is None and "RuntimeError: shape mismatch" in art.note


# --------------------------------------------------------------------------- flame graph


def _py_spy_works() -> bool:
    exe = find_py_spy()
    if exe is None:
        return False
    probe = subprocess.run([exe, "dump", "--pid", str(os.getpid())], capture_output=True, text=True, timeout=30)
    return probe.returncode == 0


@pytest.mark.skipif(not _py_spy_works(), reason="py-spy missing or not permitted to attach here (needs ptrace)")
def test_flame_graph_samples_the_rerun_step_with_real_py_spy(tmp_path: Path) -> None:
    calls = []

    def step() -> None:
        calls.append(1)
        tiny_step()

    art = flame_graph(step, tmp_path / "flame.svg", seconds=1, rate_hz=200)
    assert art.path is not None, art.note
    svg = art.path.read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert "tiny_step" in svg and "step" in svg  # the re-run step's frames were sampled
    assert len(calls) > 10 and "re-runs sampled" in art.note


class FakeProc:
    """A py-spy process that exits with ``rc`` after ``polls`` polls, writing ``out`` when rc is 0."""

    def __init__(self, cmd: list[str], rc: int, output: str, polls: int, write: bool) -> None:
        self.cmd, self.returncode, self._rc, self._output, self._polls = cmd, None, rc, output, polls
        self._out = Path(cmd[cmd.index("-o") + 1])
        self._write = write
        self.killed = False

    def poll(self) -> int | None:
        self._polls -= 1
        if self._polls <= 0 and self.returncode is None:
            self.returncode = self._rc
            if self._write:
                self._out.write_text("<svg/>")
        return self.returncode

    def kill(self) -> None:
        self.killed = True
        self.returncode = -9

    def communicate(self, timeout: float | None = None) -> tuple[str, None]:
        return self._output, None


def fake_popen(rc: int = 0, output: str = "", polls: int = 3, write: bool = True) -> Any:
    made: list[FakeProc] = []

    def popen(cmd: list[str], **kwargs: Any) -> FakeProc:
        made.append(FakeProc(cmd, rc, output, polls, write))
        return made[-1]

    popen.made = made  # type: ignore[attr-defined]
    return popen


def test_flame_graph_command_line_and_rerun_loop(tmp_path: Path) -> None:
    popen = fake_popen(polls=4)
    calls = []
    art = flame_graph(lambda: calls.append(1), tmp_path / "f.svg", seconds=2, rate_hz=100, py_spy="/x/py-spy",
                      popen=popen, threads=None)
    cmd = popen.made[0].cmd
    assert cmd == ["/x/py-spy", "record", "-o", str(tmp_path / "f.svg"), "-r", "100", "--pid", str(os.getpid()),
                   "-d", "2"]
    assert art.path == tmp_path / "f.svg" and len(calls) == 3  # the step re-runs until py-spy exits


def test_flame_graph_without_py_spy_or_permission_is_a_clear_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import perfbudget.artifacts as artifacts

    monkeypatch.setattr(artifacts, "find_py_spy", lambda: None)
    art = flame_graph(tiny_step, tmp_path / "f.svg")
    assert art.path is None and "py-spy is not installed" in art.note and "pip install py-spy" in art.note

    denied = fake_popen(rc=1, write=False, output="Error: Permission denied (os error 13)\n")
    art = flame_graph(tiny_step, tmp_path / "f.svg", py_spy="py-spy", popen=denied, threads=None)
    assert art.path is None and "may not attach" in art.note and "SYS_PTRACE" in art.note

    def missing(cmd: list[str], **kw: Any) -> Any:
        raise FileNotFoundError(2, "No such file or directory")

    art = flame_graph(tiny_step, tmp_path / "f.svg", py_spy="/gone/py-spy", popen=missing, threads=None)
    assert art.path is None and "cannot start py-spy (/gone/py-spy)" in art.note


def test_flame_graph_stops_when_the_step_raises_or_time_is_up(tmp_path: Path) -> None:
    def boom() -> None:
        raise ValueError("bad batch")

    art = flame_graph(boom, tmp_path / "f.svg", py_spy="py-spy", popen=fake_popen(polls=100), threads=None)
    assert art.path is None and "the step raised ValueError: bad batch" in art.note

    ticks = iter(range(1000))
    hung = fake_popen(polls=10**9, write=False)
    art = flame_graph(lambda: None, tmp_path / "f.svg", seconds=1, grace_s=2, py_spy="py-spy", popen=hung,
                      clock=lambda: float(next(ticks)), threads=None)
    assert hung.made[0].killed and art.path is None


# --------------------------------------------------------------------------- CUDA memory snapshot (fake)


class FakeCudaMemory:
    def __init__(self, fail_dump: bool = False) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail_dump = fail_dump

    def _record_memory_history(self, enabled: Any = "all", max_entries: int = 0) -> None:
        self.calls.append(("record", enabled if enabled is None else max_entries))

    def _dump_snapshot(self, path: str) -> None:
        if self.fail_dump:
            raise RuntimeError("allocator busy")
        self.calls.append(("dump", path))
        Path(path).write_bytes(b"snapshot")


def test_cuda_memory_snapshot_records_runs_dumps_and_always_stops_recording(tmp_path: Path) -> None:
    mem, order = FakeCudaMemory(), []
    art = cuda_memory_snapshot(lambda: order.append("step"), tmp_path / "m.pickle", memory=mem,
                               synchronize=lambda: order.append("sync"), max_entries=123)
    assert art.path == tmp_path / "m.pickle" and art.path.read_bytes() == b"snapshot"
    assert mem.calls == [("record", 123), ("dump", str(tmp_path / "m.pickle")), ("record", None)]
    assert order == ["step", "sync"] and "memory_viz" in art.note

    broken = FakeCudaMemory(fail_dump=True)
    art = cuda_memory_snapshot(lambda: None, tmp_path / "n.pickle", memory=broken, synchronize=lambda: None)
    assert art.path is None and "allocator busy" in art.note and broken.calls[-1] == ("record", None)


def test_cuda_memory_snapshot_without_cuda_says_so(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    art = cuda_memory_snapshot(tiny_step, tmp_path / "m.pickle")
    assert art.path is None and art.note == "no CUDA device"


# --------------------------------------------------------------------------- all together


def test_write_failure_artifacts_picks_kinds_by_device_and_failure(tmp_path: Path) -> None:
    seen: list[tuple[str, str]] = []

    def writer(kind: str) -> Any:
        def write(step: Any, path: Path, **kw: Any) -> Artifact:
            seen.append((kind, path.name))
            path.write_text(kind)
            return Artifact(kind=kind, path=path)  # type: ignore[arg-type]
        return write

    folder = tmp_path / "test_x"
    folder.mkdir()
    (folder / "stale.svg").write_text("old run")
    fakes = {"flame": writer("flamegraph"), "trace": writer("trace"), "snapshot": writer("memory")}
    out = write_failure_artifacts(tiny_step, folder, device="cuda", memory_failure=True, **fakes)
    assert seen == [("memory", "cuda-memory.pickle"), ("trace", "trace.json"), ("flamegraph", "flamegraph.svg")]
    assert [a.kind for a in out] == ["memory", "trace", "flamegraph"]
    assert not (folder / "stale.svg").exists()  # a previous run's artifacts never linger

    seen.clear()
    write_failure_artifacts(tiny_step, folder, device="cpu", memory_failure=True, **fakes)
    assert [k for k, _ in seen] == ["trace", "flamegraph"]  # no CUDA snapshot on CPU
    seen.clear()
    write_failure_artifacts(tiny_step, folder, device="cuda", memory_failure=False,
                            config=ArtifactConfig(kinds=("trace",)), **fakes)
    assert [k for k, _ in seen] == ["trace"]
