"""The ratchet updater: targets, tighten-only, provenance, atomic writes, readable diffs."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from perfbudget.budgets import Measured, apply_updates, load_dir
from perfbudget.device import DeviceInfo

CPU = DeviceInfo(type="cpu", model="AMD EPYC 7763 64-Core Processor", count=2, torch="2.13.0+cpu", threads=1)


def m(metric: str, value: float, key: str = "enc", device: DeviceInfo = CPU) -> Measured:
    return Measured(key=key, metric=metric, value=value, samples=30, cv=0.02, device=device)


def test_new_values_go_to_broad_and_device_files(tmp_path: Path) -> None:
    rep = apply_updates([m("flops", 1000), m("step_ms", 38.21234)], load_dir(tmp_path), commit="abc123", date="2026-01-02")
    assert not rep.errors
    assert sorted(p.name for p in tmp_path.glob("*.yaml")) == ["cpu-amd-epyc-7763-64-core-processor.yaml", "cpu.yaml"]
    bs = load_dir(tmp_path)
    assert all(not f.errors for f in bs.files)
    step = bs.resolve("enc", "step_ms", CPU)
    assert step is not None and step.value == 38.21 and step.tolerance == 0.05
    assert step.provenance is not None and step.provenance.commit == "abc123" and step.provenance.samples == 30
    assert step.provenance.cv == 0.02 and step.provenance.date == "2026-01-02"
    flops = bs.resolve("enc", "flops", CPU)
    assert flops is not None and flops.source.endswith("/cpu.yaml")
    assert "+    step_ms:" in rep.diffs[tmp_path / "cpu-amd-epyc-7763-64-core-processor.yaml"]


def test_ratchet_tightens_only_unless_allowed(tmp_path: Path) -> None:
    apply_updates([m("step_ms", 40.0), m("flops", 1000)], load_dir(tmp_path))
    rep = apply_updates([m("step_ms", 44.0), m("flops", 1001)], load_dir(tmp_path))
    assert {c.metric: c.action for c in rep.changes} == {"step_ms": "refused", "flops": "refused"}
    assert rep.diffs == {} and "--allow-loosen" in rep.render()
    rep = apply_updates([m("step_ms", 39.9)], load_dir(tmp_path))  # within a third of 5 %: noise
    assert rep.changes[0].action == "kept" and rep.diffs == {}
    rep = apply_updates([m("step_ms", 36.0), m("flops", 999)], load_dir(tmp_path))
    assert {c.metric: c.action for c in rep.changes} == {"step_ms": "tightened", "flops": "tightened"}
    rep = apply_updates([m("step_ms", 44.0)], load_dir(tmp_path), allow_loosen=True)
    assert rep.changes[0].action == "loosened"
    assert "-      value: 36.0\n+      value: 44.0" in rep.diffs[rep.changes[0].path]


def test_existing_entry_updated_in_place_keeping_tolerance_and_note(tmp_path: Path) -> None:
    (tmp_path / "cpu.yaml").write_text(
        "schema: 1\ndevice: {type: cpu}\nbudgets:\n  enc:\n    step_ms: {value: 50, tolerance: 0.2, note: reviewed}\n"
    )
    apply_updates([m("step_ms", 30.0)], load_dir(tmp_path))
    b = load_dir(tmp_path).resolve("enc", "step_ms", CPU)
    assert b is not None and (b.value, b.tolerance, b.note) == (30.0, 0.2, "reviewed")
    assert [p.name for p in tmp_path.glob("*.yaml")] == ["cpu.yaml"]


def test_a_file_with_errors_is_never_rewritten(tmp_path: Path) -> None:
    bad = "schema: 1\ndevice: {type: cpu}\nbudgets:\n  enc:\n    flops: many\n    step_ms: 10\n"
    (tmp_path / "cpu.yaml").write_text(bad)
    rep = apply_updates([m("step_ms", 5.0)], load_dir(tmp_path))
    assert rep.errors and "cpu.yaml: not updated" in str(rep.errors[0]) and "budgets.enc.flops" in str(rep.errors[0])
    assert (tmp_path / "cpu.yaml").read_text() == bad


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_unwritable_folder_is_a_clear_error(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        rep = apply_updates([m("step_ms", 5.0)], load_dir(tmp_path))
    finally:
        tmp_path.chmod(0o700)
    assert rep.errors and str(tmp_path) in str(rep.errors[0])


def test_unwritable_budgets_path_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    rep = apply_updates([m("step_ms", 5.0)], load_dir(blocker / "budgets"))
    assert rep.errors and "cannot create the budgets folder" in str(rep.errors[0])
    assert str(blocker / "budgets") in str(rep.errors[0])


def test_failed_write_leaves_the_old_file_and_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    apply_updates([m("step_ms", 40.0)], load_dir(tmp_path))
    path = next(tmp_path.glob("*.yaml"))
    before = path.read_text()

    def boom(*a: object, **k: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    rep = apply_updates([m("step_ms", 30.0)], load_dir(tmp_path))
    assert rep.errors and "No space left" in str(rep.errors[0])
    assert rep.changes == [] and "tightened" not in rep.render()  # not written: not reported as done
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_new_tolerance_covers_three_times_the_noise_and_warns_when_an_old_one_does_not(tmp_path: Path) -> None:
    noisy = Measured(key="enc", metric="step_ms", value=40.0, samples=30, cv=0.1, device=CPU, noise=0.041)
    apply_updates([noisy], load_dir(tmp_path))
    b = load_dir(tmp_path).resolve("enc", "step_ms", CPU)
    assert b is not None and b.tolerance == 0.13 and b.provenance is not None and b.provenance.noise == 0.041
    quiet = Measured(key="enc", metric="step_ms", value=40.0, samples=30, cv=0.01, device=CPU, noise=0.005)
    apply_updates([Measured(key="k2", metric="step_ms", value=1.0, samples=30, cv=0.01, device=CPU, noise=0.005)],
                  load_dir(tmp_path))
    assert load_dir(tmp_path).resolve("k2", "step_ms", CPU).tolerance == 0.05  # type: ignore[union-attr]
    (tmp_path / "cpu-x.yaml").unlink(missing_ok=True)
    rep = apply_updates([quiet], load_dir(tmp_path))
    assert rep.warnings == []
    louder = Measured(key="k2", metric="step_ms", value=1.0, samples=30, cv=0.1, device=CPU, noise=0.03)
    rep = apply_updates([louder], load_dir(tmp_path))
    assert "tolerance 5.0% is below 3x the measured noise (3.0%)" in rep.warnings[0]


def test_widen_tolerances_only_raises_and_notes_why(tmp_path: Path) -> None:
    from perfbudget.budgets.update import widen_tolerances

    apply_updates([m("step_ms", 40.0), m("ttft_ms", 3.0)], load_dir(tmp_path))
    rep = widen_tolerances({("enc", "step_ms"): 0.12, ("enc", "ttft_ms"): 0.01, ("nope", "step_ms"): 0.5},
                           load_dir(tmp_path), CPU, why="tolerance floor from 25 A/A runs")
    bs = load_dir(tmp_path)
    step, ttft = bs.resolve("enc", "step_ms", CPU), bs.resolve("enc", "ttft_ms", CPU)
    assert step is not None and step.tolerance == 0.12 and step.note == "tolerance floor from 25 A/A runs"
    assert step.value == 40.0  # the budget itself is untouched
    assert ttft is not None and ttft.tolerance == 0.05  # never narrowed
    assert [c.metric for c in rep.changes] == ["step_ms"] and len(rep.diffs) == 1


DEVICE_FILE = "cpu-amd-epyc-7763-64-core-processor.yaml"


def test_a_crash_in_one_file_leaves_the_files_already_written_reported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from perfbudget.budgets import update

    write = update.atomic_write

    def crash_on_cpu_yaml(path: Path, text: str) -> Path:
        if path.name == "cpu.yaml":
            raise RuntimeError("disk on fire")
        return write(path, text)

    monkeypatch.setattr(update, "atomic_write", crash_on_cpu_yaml)
    rep = apply_updates([m("step_ms", 40.0), m("flops", 1000)], load_dir(tmp_path))
    assert list(rep.diffs) == [tmp_path / DEVICE_FILE] and "+    step_ms:" in rep.render()
    assert [str(e) for e in rep.errors] == [f"{tmp_path}/cpu.yaml: not updated: RuntimeError: disk on fire"]
    assert [(c.metric, c.action) for c in rep.changes] == [("step_ms", "added")]  # flops was never written
    assert not (tmp_path / "cpu.yaml").exists()


def test_a_key_yaml_reads_as_a_number_stops_the_update_with_a_hint(tmp_path: Path) -> None:
    # The loader used to read key 1 as "1" and the updater as 1: sorting them crashed mid-update. Now the
    # file does not read, and a folder with a file that does not read is not updated at all (it might hold
    # the entry, or a more specific file).
    bad = "schema: 1\ndevice: {type: cpu}\nbudgets:\n  1:\n    flops: 10\n"
    (tmp_path / "cpu.yaml").write_text(bad)
    rep = apply_updates([m("step_ms", 40.0), m("flops", 5, key="1")], load_dir(tmp_path))
    assert rep.diffs == {} and not (tmp_path / DEVICE_FILE).exists()
    assert [str(e) for e in rep.errors] == [
        f"{tmp_path}/cpu.yaml:4: budgets: a mapping key must be a string; quote it ('1'), got 1"]
    assert (tmp_path / "cpu.yaml").read_text() == bad


def test_a_budget_file_that_is_a_link_is_neither_read_nor_replaced(tmp_path: Path) -> None:
    (tmp_path / "other.txt").write_text("schema: 1\ndevice: {type: cpu}\nbudgets: {}\n")
    (tmp_path / "cpu.yaml").symlink_to("other.txt")
    rep = apply_updates([m("flops", 1000)], load_dir(tmp_path))
    assert [str(e) for e in rep.errors] == [
        f"{tmp_path}/cpu.yaml: cannot read: a symbolic link (to other.txt); budgets must be plain files"]
    assert (tmp_path / "cpu.yaml").is_symlink() and rep.diffs == {}


def test_one_bad_measured_value_is_refused_alone_and_the_rest_of_its_file_written(tmp_path: Path) -> None:
    def bad(key: str, *, value: float = 1.0, samples: int = 30, cv: float = 0.02, **k: float) -> Measured:
        return Measured(key=key, metric="step_ms", value=value, samples=samples, cv=cv, device=CPU, **k)

    rep = apply_updates([m("step_ms", 38.0), bad("k1", cv=math.inf), bad("k2", value=-1.0), bad("k3", samples=-1),
                         bad("k4", ref_ms=math.nan), bad("k5", noise=math.inf), bad("k6", value=math.inf)],
                        load_dir(tmp_path))
    assert not rep.errors and list(rep.diffs) == [tmp_path / DEVICE_FILE]
    assert [(c.key, c.action, c.why) for c in rep.changes] == [
        ("enc", "added", ""),
        ("k1", "refused", "measured cv inf: expected a finite non-negative number"),
        ("k2", "refused", "measured value -1.0: expected a finite non-negative number"),
        ("k3", "refused", "measured samples -1: expected a non-negative integer"),
        ("k4", "refused", "measured ref_ms nan: expected a finite non-negative number"),
        ("k5", "refused", "measured noise inf: expected a finite non-negative number"),
        ("k6", "refused", "measured value inf: expected a finite non-negative number"),
    ]
    assert f"  refused  {DEVICE_FILE}  k1.step_ms: measured cv inf" in rep.render()
    assert "added" not in rep.render().replace("    added  " + DEVICE_FILE + "  enc.step_ms", "")
    bs = load_dir(tmp_path)
    assert bs.resolve("enc", "step_ms", CPU).value == 38.0  # type: ignore[union-attr]
    assert all(bs.resolve(f"k{i}", "step_ms", CPU) is None for i in range(1, 7))


def test_a_noise_that_is_not_finite_gives_no_tolerance(tmp_path: Path) -> None:
    from perfbudget.budgets.update import measured_value, noise_tolerance

    wide = measured_value(key="enc", metric="step_ms", value=1.0, n=30, cv=0.02, device=CPU, ci=(-1e308, 1e308))
    tiny = measured_value(key="dec", metric="step_ms", value=5e-324, n=30, cv=0.02, device=CPU, ci=(0.0, 1.0))
    assert wide is not None and wide.noise is None and tiny is not None and tiny.noise is None
    assert noise_tolerance(0.05, math.inf) == 0.05 and noise_tolerance(0.05, math.nan) == 0.05
    assert noise_tolerance(0.05, 1e308) == 1.0  # finite, but 3x of it overflows
    rep = apply_updates([wide, tiny], load_dir(tmp_path))
    assert not rep.errors and [c.action for c in rep.changes] == ["added", "added"]
    assert load_dir(tmp_path).resolve("enc", "step_ms", CPU).tolerance == 0.05  # type: ignore[union-attr]


CI_VARIABLES = ("GITHUB_ACTIONS", "GITHUB_SHA", "GITLAB_CI", "CI_COMMIT_SHA")
SHA = "0590f5d3c1a8e7b2f4d6a9c0b1e2f3a4b5c6d7e8"


def test_without_a_known_commit_provenance_says_unknown_and_the_report_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from perfbudget.budgets.update import provenance_commit

    for name in CI_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    tree = tmp_path / "copy"  # a working tree copied without .git
    tree.mkdir()
    commit = provenance_commit(tree)
    assert commit is None
    rep = apply_updates([m("flops", 1000)], load_dir(tree / "budgets"), commit=commit)
    flops = load_dir(tree / "budgets").resolve("enc", "flops", CPU)
    assert flops is not None and flops.provenance is not None and flops.provenance.commit == "unknown"
    assert "commit: unknown" in rep.diffs[tree / "budgets" / "cpu.yaml"]
    assert "--perf-commit" in rep.render()


def test_the_commit_comes_from_the_value_passed_then_git_then_the_ci_never_a_guess(tmp_path: Path) -> None:
    import subprocess

    from perfbudget.budgets.update import check_commit, provenance_commit

    github = {"GITHUB_ACTIONS": "true", "GITHUB_SHA": SHA}
    gitlab = {"GITLAB_CI": "true", "CI_COMMIT_SHA": SHA}
    assert provenance_commit(tmp_path, environ={}) is None
    # A CI's variable counts only inside that CI: exported elsewhere it is a claim, not a checkout.
    assert provenance_commit(tmp_path, environ={"GITHUB_SHA": SHA, "CI_COMMIT_SHA": SHA}) is None
    assert provenance_commit(tmp_path, environ=github) == SHA
    assert provenance_commit(tmp_path, environ=gitlab) == SHA
    assert provenance_commit(tmp_path, given="1f262dc", environ=github) == "1f262dc"
    assert provenance_commit(tmp_path, given="", environ={}) is None  # empty: not given
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@localhost"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "f.txt").write_text("x")
    subprocess.run([*git, "add", "f.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    assert provenance_commit(tmp_path, environ=github) == head  # the tree's own git before the CI's claim
    (tmp_path / "f.txt").write_text("y")
    assert provenance_commit(tmp_path, environ={}) == f"{head}-dirty"
    # A commit passed on purpose wins: a copy's .git may be a local snapshot, no commit of the project.
    assert provenance_commit(tmp_path, given="1f262dc", environ={}) == "1f262dc"
    assert check_commit("1F262DC") == "1F262DC" and check_commit(f"{SHA}-dirty") == f"{SHA}-dirty"
    for bad in ("main", "HEAD~1", "abc", "unknown", SHA + "0"):
        with pytest.raises(ValueError, match=f"got {bad!r}"):
            check_commit(bad)


# --------------------------------------------------------------------------- accepting a change

RUNNER = DeviceInfo(type="cpu", model="Test CPU", count=2, torch="2.13.0+cpu", threads=1,
                    cpuid="6/207/2", isa_class="avx2")
HOSTED = DeviceInfo(type="cpu", model="Test CPU", count=2, torch="2.13.0+cpu", threads=1,
                    cpuid="6/85/7", isa_class="avx512")


def test_accept_writes_reviewed_values_with_reason_and_commit_and_timing_only_on_its_own_machine(
        tmp_path: Path) -> None:
    from perfbudget.budgets import accept_results

    assert RUNNER.identity == "cpu-test-cpu-6-207-2-avx2"
    (tmp_path / "cpu.yaml").write_text("schema: 1\ndevice: {type: cpu}\nbudgets:\n  enc:\n"
                                       "    flops: 1000\n")
    (tmp_path / f"{RUNNER.identity}.yaml").write_text(
        f"schema: 1\ndevice: {{type: cpu, identity: {RUNNER.identity}, threads: 1}}\nbudgets:\n"
        "  enc:\n    step_ms: {value: 10.0, tolerance: 0.05}\n    latency_ms[load]: 2.0\n")
    measured = [m("flops", 1100, device=HOSTED), m("step_ms", 12.0, device=RUNNER),
                # within a third of the tolerance: noise, kept
                m("latency_ms[load]", 2.02, device=RUNNER),
                # no budget yet, measured on the machine its file is keyed by: added
                m("step_ms", 30.0, key="dec", device=RUNNER),
                m("step_ms", 50.0, device=HOSTED), m("ttft_ms", 5.0, key="dec", device=HOSTED)]
    rep = accept_results(measured, load_dir(tmp_path), reason="larger vocabulary, reviewed",
                         commit=SHA, date="2026-12-03")
    assert not rep.errors
    actions = {(c.key, c.metric, "-" if c.action == "skipped" else c.path.name): c.action
               for c in rep.changes}
    assert actions == {
        ("enc", "flops", "cpu.yaml"): "loosened",  # worse, accepted: the reason is the licence
        ("enc", "step_ms", f"{RUNNER.identity}.yaml"): "loosened",
        ("enc", "latency_ms[load]", f"{RUNNER.identity}.yaml"): "kept",
        ("dec", "step_ms", f"{RUNNER.identity}.yaml"): "added",
        ("enc", "step_ms", "-"): "skipped", ("dec", "ttft_ms", "-"): "skipped",
    }
    bs = load_dir(tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.yaml")) == [f"{RUNNER.identity}.yaml", "cpu.yaml"]
    for key, metric, device, value in (("enc", "flops", HOSTED, 1100),
                                       ("enc", "step_ms", RUNNER, 12.0)):
        b = bs.resolve(key, metric, device)
        assert b is not None and b.value == value and b.provenance is not None
        assert (b.provenance.reason, b.provenance.commit) == ("larger vocabulary, reviewed", SHA)
    assert bs.resolve("enc", "step_ms", HOSTED) is None  # the hosted runner's timing went nowhere
    assert "reason: larger vocabulary, reviewed" in rep.diffs[tmp_path / "cpu.yaml"]
    assert ("  skipped  enc.step_ms, dec.ttft_ms: timing measured on cpu-test-cpu-6-85-7-avx512: "
            "no budget file here is keyed by that identity") in rep.render()


def test_accept_refuses_an_empty_reason_and_a_commit_that_moves(tmp_path: Path) -> None:
    from perfbudget.budgets import accept_results

    with pytest.raises(ValueError, match=r"reason: expected why .* got ' '"):
        accept_results([m("flops", 1)], load_dir(tmp_path), reason=" ", commit=SHA)
    with pytest.raises(ValueError, match="got 'main'"):
        accept_results([m("flops", 1)], load_dir(tmp_path), reason="ok", commit="main")
    assert not list(tmp_path.glob("*.yaml"))
