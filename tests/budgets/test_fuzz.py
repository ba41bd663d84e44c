"""Fuzzed budget input: any bytes load, or give the project's own errors naming the file; never an exception."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfbudget.budgets import BudgetError, BudgetSet, Measured, apply_updates, load_dir, parse_text
from perfbudget.device import SELECTOR_FIELDS, DeviceInfo
from perfbudget.metrics import METRICS

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
)
trees = st.recursive(
    scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4),
    max_leaves=20,
)
metric_names = st.sampled_from(sorted(METRICS)).flatmap(
    lambda n: st.just(n) if METRICS[n].arg is None else st.text("abcdef:_", min_size=1, max_size=8).map(lambda a: f"{n}[{a}]")
)
entries = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 10**9),
    st.fixed_dictionaries({"value": scalars}, optional={"tolerance": scalars, "note": scalars, "provenance": trees}),
    trees,
)
docs = st.fixed_dictionaries(
    {},
    optional={
        "schema": st.one_of(st.just(1), scalars),
        "device": st.one_of(
            st.dictionaries(st.sampled_from([*SELECTOR_FIELDS, "modle", "gpu"]), scalars, max_size=4), trees
        ),
        "budgets": st.one_of(
            st.dictionaries(st.text(min_size=1, max_size=12), st.dictionaries(st.one_of(metric_names, st.text(max_size=10)), entries, max_size=4), max_size=3),
            trees,
        ),
        "note": scalars,
    },
)


def check(text: str) -> None:
    f = parse_text(text, "budgets/fuzz.yaml")
    for e in f.errors:
        assert isinstance(e, BudgetError)
        assert str(e).startswith("budgets/fuzz.yaml")
    # Either usable (entry errors at most, each confined to its key) or every error is file-level.
    assert f.usable == (f.selector is not None and not f.file_errors)
    if not f.usable:
        assert f.file_errors == f.errors and f.errors
    for e in f.entry_errors:
        assert e.keypath[0] == "budgets" and e.keypath[1] in _keys(text)
    for metrics in f.entries.values():
        for b in metrics.values():
            assert math.isfinite(b.value) and b.value >= 0 and 0 <= b.tolerance <= 1


def _keys(text: str) -> set[str]:
    data = yaml.safe_load(text)
    return {str(k) for k in data["budgets"]}


def load_bytes(data: bytes) -> tuple[BudgetSet, str]:
    """``data`` as the only budget file of a folder, loaded; never raises."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "fuzz.yaml"
        path.write_bytes(data)
        return load_dir(d), str(path)


def check_bytes(data: bytes) -> None:
    bs, path = load_bytes(data)
    assert [str(f.path) for f in bs.files] == [path] and not bs.errors
    f = bs.files[0]
    for e in f.errors:
        assert isinstance(e, BudgetError) and e.path == path and str(e).startswith(path)
    if f.usable:  # loaded; what failed is confined to entries, each listed
        assert f.selector is not None and bs.file_errors == [] and bs.entry_errors == f.errors
    else:  # never a silent skip: the run sees the file's errors
        assert f.errors and bs.file_errors == f.errors


# A real budget file, then edits of the kinds people and tools make: tags, aliases,
# duplicated or cut lines, stray brackets, control bytes, invalid UTF-8.
VALID = (Path(__file__).parents[2] / "budgets" / "cpu.yaml").read_bytes()
TOKENS = [
    b"!!python/object/apply:os.system ['true']", b"!!python/name:os.system", b"!!binary aGk=", b"!!set {a}",
    b"&a ", b"*a", b"<<: *a\n", b"{", b"}", b"[", b"]", b": ", b"- ", b"\t", b"\x00", b"\xff\xfe", b"'", b'"',
    b"\n    flops: 1\n", b"model: 123", b"1e400", b"1" + b"0" * 400, b"~", b"=", b"? ", b"%YAML 1.1\n---\n",
    b"---\n", b"...\n", b"\n", b"  ", b"#", b"!x ",
]
edits = st.lists(
    st.tuples(st.floats(0, 1), st.sampled_from(["insert", "delete", "duplicate_line"]), st.sampled_from(TOKENS),
              st.integers(1, 40)),
    min_size=1, max_size=5,
)


def apply_edits(text: bytes, ops: list[tuple[float, str, bytes, int]]) -> bytes:
    for where, op, token, n in ops:
        i = int(where * len(text))
        if op == "insert":
            text = text[:i] + token + text[i:]
        elif op == "delete":
            text = text[:i] + text[i + n:]
        else:
            start = text.rfind(b"\n", 0, i) + 1
            end = text.find(b"\n", i)
            end = len(text) if end < 0 else end + 1
            text = text[:end] + text[start:end] + text[end:]
    return text


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_load_or_fail_naming_the_file(data: bytes) -> None:
    check_bytes(data)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits)
def test_edited_budget_files_load_or_fail_naming_the_file(ops: list[tuple[float, str, bytes, int]]) -> None:
    check_bytes(apply_edits(VALID, ops))


def test_the_edited_file_is_the_real_one_and_valid() -> None:
    bs, _ = load_bytes(VALID)
    assert bs.files[0].usable and not bs.files[0].errors and bs.files[0].entries


@settings(max_examples=100, deadline=None)
@given(docs)
def test_any_structure_gives_budgets_or_named_errors(doc: dict) -> None:
    check(yaml.safe_dump(doc, allow_unicode=True))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_any_text_gives_budgets_or_named_errors(text: str) -> None:
    check(text)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["!!python/object:os.system", "!!python/object/apply:os.system", "!!python/name:os.system",
                        "!!python/module:os", "!!binary", "!!set"]),
       st.sampled_from(["device: {tag} {{}}", "budgets: {tag} []", "schema: {tag} 1", "{tag} {{a: 1}}"]))
def test_unsafe_tags_are_refused(tag: str, template: str) -> None:
    f = parse_text(template.format(tag=tag), "budgets/fuzz.yaml")
    assert f.errors and not f.entries


devices = st.builds(
    DeviceInfo,
    type=st.sampled_from(["cpu", "cuda"]),
    model=st.text(min_size=1, max_size=20),
    count=st.integers(1, 8),
    threads=st.one_of(st.none(), st.integers(1, 4)),
    torch=st.sampled_from(["2.13.0+cpu", "2.4.1"]),
)
values = st.floats(min_value=0, max_value=1e12, allow_nan=False, allow_infinity=False)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.text("abc-xyz0", min_size=1, max_size=6), metric_names, values), min_size=1, max_size=6),
       devices)
def test_update_then_load_round_trips(items: list, device: DeviceInfo) -> None:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        measured = [Measured(key=k, metric=m, value=v, samples=30, cv=0.01, device=device) for k, m, v in items]
        rep = apply_updates(measured, load_dir(root))
        assert not rep.errors, [str(e) for e in rep.errors]
        bs = load_dir(root)
        assert all(not f.errors for f in bs.files), [str(e) for f in bs.files for e in f.errors]
        last = {(m.key, m.metric): m.value for m in measured}
        for (key, metric), value in last.items():
            b = bs.resolve(key, metric, device)
            assert b is not None
            written = [c for c in rep.changes if (c.key, c.metric) == (key, metric)][-1]
            assert b.value == written.new or written.action in ("kept", "refused")
            assert math.isclose(b.value, value, rel_tol=1e-3, abs_tol=1e-9) or written.action in ("kept", "refused")
        again = apply_updates(measured, bs)  # the same values again change nothing
        assert again.diffs == {}
