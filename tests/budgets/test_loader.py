"""Budget files: validation errors name file, line, key path and value; selection by device."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from perfbudget.budgets import BudgetError, BudgetSet, load_dir, parse_text
from perfbudget.budgets.loader import load_file
from perfbudget.device import DeviceInfo

CPU = DeviceInfo(type="cpu", model="AMD EPYC 7763 64-Core Processor", count=2, torch="2.13.0+cpu", threads=1)
GPU = DeviceInfo(type="cuda", model="NVIDIA H200", count=1, compute_capability="9.0", torch="2.13.0")

GOOD = """\
schema: 1
device: {type: cpu}
budgets:
  encoder-train:
    flops: 2415919104
    step_ms: {value: 38.2, tolerance: 0.05}
    "op_self_ms[aten::mm]": {value: 20.3}
"""


def one_error(text: str) -> BudgetError:
    f = parse_text(text, "budgets/cpu.yaml")
    assert len(f.errors) == 1, [str(e) for e in f.errors]
    return f.errors[0]


def test_good_file_parses_to_typed_budgets() -> None:
    f = parse_text(GOOD, "budgets/cpu.yaml")
    assert f.errors == []
    b = f.entries["encoder-train"]
    assert b["flops"].value == 2415919104 and b["flops"].tolerance == 0.0
    assert b["step_ms"].tolerance == 0.05 and b["step_ms"].line == 6
    assert b["op_self_ms[aten::mm]"].tolerance == 0.05  # timing default


def test_tolerance_as_percent_string_names_file_line_key_and_value() -> None:
    e = one_error(GOOD.replace("tolerance: 0.05", 'tolerance: "5%"'))
    assert str(e) == "budgets/cpu.yaml:6: budgets.encoder-train.step_ms.tolerance: expected a number in [0, 1], got '5%'"


@pytest.mark.parametrize("tol", ["-0.1", "1.5", ".nan", ".inf", "true"])
def test_out_of_range_tolerances_are_refused(tol: str) -> None:
    e = one_error(GOOD.replace("tolerance: 0.05", f"tolerance: {tol}"))
    assert e.keypath == ("budgets", "encoder-train", "step_ms", "tolerance")


def test_unknown_metric_suggests_closest_name() -> None:
    e = one_error(GOOD.replace("step_ms:", "stepms:"))
    assert "unknown metric 'stepms'" in str(e) and "did you mean 'step_ms'" in str(e)
    assert e.line == 6


def test_parametrised_metric_without_argument() -> None:
    e = one_error(GOOD.replace('"op_self_ms[aten::mm]"', "op_self_ms"))
    assert "needs an argument" in str(e)


def test_duplicate_keys_are_an_error_with_both_lines() -> None:
    e = one_error(GOOD + "    flops: 1\n")
    assert e.line == 8 and "duplicate key (first defined on line 5)" in str(e)
    assert e.keypath == ("budgets", "encoder-train", "flops")


def test_malformed_yaml_names_the_line() -> None:
    e = one_error(GOOD.replace("step_ms: {value: 38.2", "step_ms: {value: [38.2"))
    assert e.path == "budgets/cpu.yaml" and e.line is not None and "invalid YAML" in str(e)


def test_unsafe_tags_are_refused() -> None:
    e = one_error("schema: 1\ndevice: !!python/object/apply:os.system ['true']\n")
    assert "invalid YAML" in str(e) and e.line == 2


def test_unknown_device_field_and_bad_type() -> None:
    e = one_error(GOOD.replace("{type: cpu}", "{type: cpu, modle: EPYC}"))
    assert e.keypath == ("device", "modle") and "did you mean 'model'" in str(e)
    e = one_error(GOOD.replace("{type: cpu}", "{type: tpu}"))
    assert str(e).endswith("device.type: expected 'cpu' or 'cuda', got 'tpu'")


@pytest.mark.parametrize(
    ("text", "keypath"),
    [
        (GOOD.replace("flops: 2415919104", "flops: lots"), ("budgets", "encoder-train", "flops")),
        (GOOD.replace("value: 38.2", "value: -1"), ("budgets", "encoder-train", "step_ms", "value")),
        (GOOD.replace("value: 38.2", "value: .nan"), ("budgets", "encoder-train", "step_ms", "value")),
        (GOOD.replace("value: 38.2,", "valeu: 38.2,"), ("budgets", "encoder-train", "step_ms", "valeu")),
        (GOOD.replace("schema: 1", "schema: 2"), ("schema",)),
        (GOOD + "extra: 1\n", ("extra",)),
    ],
)
def test_wrong_types_name_the_key_path(text: str, keypath: tuple[str, ...]) -> None:
    assert one_error(text).keypath == keypath


def test_entry_errors_only_affect_their_key(tmp_path: Path) -> None:
    (tmp_path / "cpu.yaml").write_text(GOOD + "  other:\n    flops: oops\n")
    bs = load_dir(tmp_path)
    assert bs.errors_for("encoder-train", CPU) == []
    assert len(bs.errors_for("other", CPU)) == 1
    assert bs.resolve("encoder-train", "flops", CPU) is not None


def test_file_level_errors_affect_every_key(tmp_path: Path) -> None:
    (tmp_path / "cpu.yaml").write_text(GOOD)
    (tmp_path / "broken.yaml").write_text("schema: 1\ndevice: {type: cpu\n")
    bs = load_dir(tmp_path)
    errs = bs.errors_for("encoder-train", CPU)
    assert len(errs) == 1 and errs[0].path.endswith("broken.yaml")


def test_most_specific_matching_file_wins_per_entry(tmp_path: Path) -> None:
    (tmp_path / "cpu.yaml").write_text(GOOD)
    (tmp_path / "cpu-epyc.yaml").write_text(
        "schema: 1\ndevice: {type: cpu, model: AMD EPYC, threads: 1}\n"
        "budgets:\n  encoder-train:\n    step_ms: {value: 30.0, tolerance: 0.1}\n"
    )
    (tmp_path / "cpu-xeon.yaml").write_text(
        "schema: 1\ndevice: {type: cpu, model: Xeon}\nbudgets:\n  encoder-train:\n    step_ms: 99.0\n"
    )
    (tmp_path / "cuda.yaml").write_text("schema: 1\ndevice: {type: cuda}\nbudgets:\n  encoder-train:\n    flops: 1\n")
    bs = load_dir(tmp_path)
    step = bs.resolve("encoder-train", "step_ms", CPU)
    assert step is not None and step.value == 30.0 and step.source.endswith("cpu-epyc.yaml")
    flops = bs.resolve("encoder-train", "flops", CPU)
    assert flops is not None and flops.value == 2415919104  # only the broad file has it
    assert bs.resolve("encoder-train", "flops", GPU).value == 1  # type: ignore[union-attr]
    assert bs.resolve("encoder-train", "step_ms", GPU) is None
    two_threads = DeviceInfo(type="cpu", model=CPU.model, count=2, threads=2)
    assert bs.resolve("encoder-train", "step_ms", two_threads).value == 38.2  # type: ignore[union-attr]


def test_equally_specific_files_are_ambiguous(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("schema: 1\ndevice: {type: cpu, model: EPYC}\nbudgets:\n  k:\n    flops: 1\n")
    (tmp_path / "b.yaml").write_text("schema: 1\ndevice: {type: cpu, model: AMD}\nbudgets:\n  k:\n    flops: 2\n")
    with pytest.raises(BudgetError, match="ambiguous"):
        load_dir(tmp_path).resolve("k", "flops", CPU)
    budget, problem = load_dir(tmp_path).lookup("k", "flops", CPU)
    assert budget is None and problem.startswith("budget file error: ") and "ambiguous" in problem


def test_lookup_gives_the_budget_or_every_error_that_hides_it(tmp_path: Path) -> None:
    (tmp_path / "cpu.yaml").write_text(GOOD)
    assert load_dir(tmp_path).lookup("encoder-train", "flops", CPU)[0].value == 2415919104  # type: ignore[union-attr]
    assert load_dir(tmp_path).lookup("encoder-train", "nothing", CPU) == (None, "")
    (tmp_path / "broken.yaml").write_text("schema: 1\ndevice: {type: cpu}\nbudgets: [oops]\n")
    (tmp_path / "worse.yaml").write_text("schema: 2\n")
    bs = load_dir(tmp_path)
    budget, problem = bs.lookup("encoder-train", "flops", CPU)
    errors = bs.errors_for("encoder-train", CPU)
    assert len(errors) > 1 and budget is None
    assert problem == f"budget file error: {errors[0]} (and {len(errors) - 1} more)"


def test_version_selectors_match_by_prefix(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text("schema: 1\ndevice: {type: cpu, torch: '2.13'}\nbudgets:\n  k:\n    flops: 1\n")
    bs = load_dir(tmp_path)
    assert bs.resolve("k", "flops", CPU) is not None
    assert bs.resolve("k", "flops", DeviceInfo(type="cpu", model="x", count=1, torch="2.12.1")) is None


def test_budgets_path_that_is_a_file(tmp_path: Path) -> None:
    p = tmp_path / "budgets"
    p.write_text("")
    assert "not a folder" in str(load_dir(p).errors[0])


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("{type: cpu, model: 123}", "device.model: expected a string; quote it (model: '123'), got 123"),
        ("{type: cpu, torch: 2.10}", "device.torch: expected a string; quote the version (torch: '2.1')"),
        ("{type: cpu, model: ''}", "device.model: expected a non-empty string"),
        ("{type: cpu, model: [Xeon]}", "device.model: expected a string, got ['Xeon']"),
        ("{type: cpu, threads: '1'}", "device.threads: expected a positive integer, got '1'"),
        ("{type: cpu, threads: 0}", "device.threads: expected a positive integer, got 0"),
        ("{type: cuda, count: true}", "device.count: expected a positive integer, got True"),
        ("{type: cpu, model: 2026-01-01}", "device.model: expected a string, got datetime.date(2026, 1, 1)"),
        ("[cpu]", "device: expected a mapping of device fields"),
    ],
)
def test_selector_values_of_the_wrong_type_are_file_errors(selector: str, message: str) -> None:
    # Coercing these would give a selector that matches no machine: a silently unbudgeted file.
    f = parse_text(GOOD.replace("{type: cpu}", selector), "budgets/cpu.yaml")
    assert f.selector is None and not f.usable
    assert len(f.file_errors) == 1 and str(f.file_errors[0]).startswith(f"budgets/cpu.yaml:2: {message}")


@pytest.mark.parametrize(
    "text",
    [
        GOOD + "    flops: 1\n",  # duplicate key inside an entry
        GOOD.replace("flops: 2415919104", "flops: !!python/object/apply:os.system ['true']"),
        GOOD.replace("flops: 2415919104", "flops: !!python/name:os.system"),
        GOOD.replace("flops: 2415919104", "flops: !!python/tuple [1]"),
        GOOD.replace("flops: 2415919104", "flops: !!binary aGk="),
        GOOD.replace("encoder-train:", "encoder-train: !!python/object/apply:os.system\n   "),
        GOOD.replace("  encoder-train:", "  base: &b {flops: 1}\n  other: {<<: *b}\n  encoder-train:"),
        GOOD.replace("  encoder-train:", "  loop: &l {k: *l}\n  encoder-train:"),
    ],
    ids=["duplicate", "apply-scalar", "name", "tuple", "binary", "apply-mapping", "merge", "recursive-alias"],
)
def test_parse_errors_inside_budgets_make_the_file_unusable(text: str) -> None:
    f = parse_text(text, "budgets/cpu.yaml")
    assert not f.usable and f.entries == {}
    assert f.file_errors == f.errors and len(f.errors) == 1
    assert f.errors[0].line is not None and str(f.errors[0]).startswith(f"budgets/cpu.yaml:{f.errors[0].line}: budgets")


def test_unsafe_tags_are_not_executed(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    text = f"schema: 1\ndevice: {{type: cpu}}\nbudgets: !!python/object/apply:os.system ['touch {marker}']\n"
    assert parse_text(text, "budgets/cpu.yaml").file_errors
    assert not marker.exists()


def test_alias_bombs_and_deep_nesting_are_errors() -> None:
    bomb = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    bomb += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    e = one_error("\n".join(bomb) + "\n")
    assert "aliases expanded" in str(e) and e.line is not None
    assert "nested deeper than" in str(one_error("[" * 3000 + "]" * 3000))
    assert "nested deeper than" in str(one_error("a: " + "[" * 40 + "]" * 40))


def test_huge_numbers_and_control_characters_are_errors() -> None:
    e = one_error(GOOD.replace("2415919104", "1" + "0" * 400))
    assert e.keypath == ("budgets", "encoder-train", "flops", "value") and "..." in str(e)
    e = one_error(GOOD.replace("schema: 1", "schema: 1\x07"))
    assert str(e).startswith("budgets/cpu.yaml:1: invalid YAML") and "#x0007" in str(e)


def test_top_level_note_must_be_text() -> None:
    e = one_error(GOOD + "note: [a]\n")
    assert e.keypath == ("note",) and not parse_text(GOOD + "note: [a]\n", "budgets/cpu.yaml").usable


def test_file_errors_are_listed_whatever_device_the_file_selects(tmp_path: Path) -> None:
    (tmp_path / "cpu.yaml").write_text(GOOD)
    (tmp_path / "nvidia-h100.yaml").write_text(
        "schema: 1\ndevice: {type: cuda, model: H100}\nbudgets:\n  k:\n    flops: 1\n    flops: 2\n")
    (tmp_path / "cpu-xeon.yaml").write_text(
        "schema: 1\ndevice: {type: cpu, model: Xeon}\nbudgets:\n  k:\n    flops: !!python/object/apply:os.system [x]\n")
    (tmp_path / "cpu-123.yaml").write_text("schema: 1\ndevice: {type: cpu, model: 123}\nbudgets: {}\n")
    (tmp_path / "cpu-typo.yaml").write_text(
        "schema: 1\ndevice: {type: cpu, model: Xeon}\nbudgets:\n  k:\n    flops: lots\n")
    bs = load_dir(tmp_path)
    got = sorted(str(e) for e in bs.file_errors)
    assert got == [
        f"{tmp_path}/cpu-123.yaml:2: device.model: expected a string; quote it (model: '123'), got 123",
        f"{tmp_path}/cpu-xeon.yaml:5: budgets.k.flops: invalid YAML: tag '!!python/object/apply:os.system' is not allowed",
        f"{tmp_path}/nvidia-h100.yaml:6: budgets.k.flops: duplicate key (first defined on line 5), got 'flops'",
    ]
    # An entry error leaves its file usable: it is listed apart, and fails only its key.
    assert [str(e) for e in bs.entry_errors] == [
        f"{tmp_path}/cpu-typo.yaml:5: budgets.k.flops: expected a number or a mapping with 'value' and 'tolerance', got 'lots'"
    ]
    e = bs.file_errors[0]
    assert (Path(e.path or "").name, e.line, e.key, e.message) == (
        "cpu-123.yaml", 2, "device.model", "expected a string; quote it (model: '123')")
    # The recorder's view: every file-level error counts for every key on every device.
    assert len(bs.errors_for("encoder-train", CPU)) == 3
    assert len(bs.errors_for("encoder-train", GPU)) == 3
    assert bs.resolve("encoder-train", "flops", CPU) is not None  # the good file still resolves


@pytest.mark.parametrize(("key", "quoted"), [("1", "'1'"), ("yes", "'yes'"), ("0x10", "'0x10'"), ("2.5", "'2.5'")])
def test_a_key_yaml_reads_as_a_number_or_boolean_is_an_error_asking_for_quotes(key: str, quoted: str) -> None:
    # Turned into text it would read as another key ("yes" -> "True", "0x10" -> "16"), and the
    # updater, reading the file's keys as YAML gives them, could not sort them beside strings.
    e = one_error(GOOD.replace("  encoder-train:", f"  {key}:"))
    assert str(e).startswith(f"budgets/cpu.yaml:4: budgets: a mapping key must be a string; quote it ({quoted})")
    assert parse_text(GOOD.replace("  encoder-train:", f"  {quoted}:"), "budgets/cpu.yaml").errors == []


def test_a_budget_file_that_is_a_link_or_not_a_plain_file_is_refused_unread(tmp_path: Path) -> None:
    budgets = tmp_path / "budgets"
    budgets.mkdir()
    secret = tmp_path / "outside" / "secret.yaml"
    secret.parent.mkdir()
    secret.write_text("SECRET: the text of a file outside the budgets folder\n")
    (budgets / "a.yaml").symlink_to(Path("..") / "outside" / "secret.yaml")
    (budgets / "b.yaml").symlink_to(budgets / "c.yml")  # a link inside the folder: still a link
    (budgets / "c.yml").write_text(GOOD)
    os.mkfifo(budgets / "fifo.yaml")  # reading it would wait for a writer forever
    (budgets / "folder.yaml").mkdir()
    (budgets / "big.yaml").write_text(GOOD + "#" * (1 << 20))
    loaded: list[BudgetSet] = []
    reader = threading.Thread(target=lambda: loaded.append(load_dir(budgets)), daemon=True)
    reader.start()
    reader.join(30)
    assert loaded, "load_dir hung"
    got = sorted(str(e) for e in loaded[0].file_errors)
    assert got == [
        f"{budgets}/a.yaml: cannot read: a symbolic link (to ../outside/secret.yaml); budgets must be plain files",
        f"{budgets}/b.yaml: cannot read: a symbolic link (to {budgets}/c.yml); budgets must be plain files",
        f"{budgets}/big.yaml: cannot read: larger than 1 MiB",
        f"{budgets}/fifo.yaml: cannot read: not a regular file",
        f"{budgets}/folder.yaml: cannot read: not a regular file",
    ]
    assert "SECRET" not in "".join(got)
    assert loaded[0].resolve("encoder-train", "flops", CPU) is not None  # c.yml itself loads
    assert "outside the budgets folder" in str(load_file(secret, budgets).errors[0])
