"""Load and validate budget YAML files once, and pick the budget that applies to a device."""

from __future__ import annotations

import difflib
import math
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..device import (
    SELECTOR_FIELDS,
    SELECTOR_INT_FIELDS,
    SELECTOR_VERSION_FIELDS,
    DeviceInfo,
    Selector,
)
from ..metrics import UnknownMetricError, parse_name
from ..settings import find_ini
from ..verdict.rule import tolerance_for
from .schema import PROVENANCE_FIELDS, SCHEMA_VERSION, Budget, BudgetError, BudgetFile, Provenance

__all__ = ["MAX_FILE_BYTES", "BudgetSet", "confined", "load_dir", "load_file", "parse_text", "read_text", "subfolder"]

_TOP_KEYS = ("schema", "device", "budgets", "note")
_ENTRY_KEYS = ("value", "tolerance", "ab_tolerance", "provenance", "note")
_Y = "tag:yaml.org,2002:"
_COLLECTION_TAGS = (f"{_Y}map", f"{_Y}seq")
# Plain YAML scalars only. ``!!binary``, ``!!set`` and every ``!!python/...`` tag are refused
# before anything is constructed; timestamps stay allowed for an unquoted provenance date.
_SCALAR_TAGS = tuple(f"{_Y}{t}" for t in ("str", "int", "float", "bool", "null", "timestamp"))
#: Deepest nesting a budget file may have (a real one is 6 levels deep).
MAX_DEPTH = 32
#: Most values a file may expand to, aliases included (else "billion laughs").

MAX_NODES = 100_000
#: Largest file the budgets folder may hold that perfbudget reads (a real one is a few KiB).
MAX_FILE_BYTES = 1 << 20


def _short_tag(tag: str | None) -> str:
    return "!!" + tag[len(_Y):] if tag and tag.startswith(_Y) else str(tag)


class _Doc:
    """YAML parsed into plain Python with the line of every key path; raises :class:`BudgetError`.

    Values are built from ``yaml.SafeLoader``'s nodes here so that other tags are refused before
    construction, duplicate keys caught (``safe_load`` keeps the last), and alias bombs bounded.
    """

    def __init__(self, text: str, path: Path) -> None:
        self.path = path
        self.lines: dict[tuple[str, ...], int] = {}
        self._nodes = 0
        self._active: set[int] = set()
        loader: yaml.SafeLoader | None = None
        try:
            loader = yaml.SafeLoader(text)
            node = loader.get_single_node()
            self.data = self._build(loader, node, ()) if node is not None else None
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = mark.line + 1 if mark is not None else None
            msg = " ".join(str(p) for p in (exc.context, exc.problem) if p)
            raise BudgetError(f"invalid YAML: {msg}", path=path, line=line) from None
        except yaml.reader.ReaderError as exc:
            # Characters YAML forbids (NUL, control characters): an offset, not a mark.
            line = text.count("\n", 0, exc.position) + 1 if isinstance(exc.position, int) else None
            char = f"#x{exc.character:04x}" if isinstance(exc.character, int) else repr(exc.character)
            raise BudgetError(f"invalid YAML: {exc.reason} (character {char})",
                              path=path, line=line) from None
        except yaml.YAMLError as exc:
            raise BudgetError(f"invalid YAML: {exc}", path=path) from None
        except RecursionError:
            # PyYAML composes nested collections recursively.
            raise BudgetError(f"invalid YAML: nested deeper than {MAX_DEPTH} levels", path=path) from None
        finally:
            if loader is not None:
                loader.dispose()

    def _fail(self, message: str, node: yaml.Node, keypath: tuple[str, ...]) -> BudgetError:
        return BudgetError(message, path=self.path, line=node.start_mark.line + 1, keypath=keypath)

    def _build(self, loader: yaml.SafeLoader, node: yaml.Node, keypath: tuple[str, ...]) -> Any:
        self.lines.setdefault(keypath, node.start_mark.line + 1)
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise self._fail(f"invalid YAML: more than {MAX_NODES} values (aliases expanded)", node, keypath)
        if len(keypath) > MAX_DEPTH:
            raise self._fail(f"invalid YAML: nested deeper than {MAX_DEPTH} levels", node, keypath)
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(loader, node, keypath)
        if node.tag not in _COLLECTION_TAGS:
            raise self._fail(f"invalid YAML: tag {_short_tag(node.tag)!r} is not allowed", node, keypath)
        if id(node) in self._active:
            raise self._fail("invalid YAML: an alias refers to a collection that contains it", node, keypath)
        self._active.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                return [self._build(loader, n, (*keypath, str(i))) for i, n in enumerate(node.value)]
            return self._mapping(loader, node, keypath)
        finally:
            self._active.discard(id(node))

    def _mapping(self, loader: yaml.SafeLoader, node: yaml.Node, keypath: tuple[str, ...]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for knode, vnode in node.value:
            if knode.tag == f"{_Y}merge":
                raise self._fail("invalid YAML: merge keys ('<<') are not supported; write the keys out",
                                 knode, keypath)
            if not isinstance(knode, yaml.ScalarNode):
                raise self._fail("invalid YAML: mapping keys must be plain strings, got a collection",
                                 knode, keypath)
            skey = self._scalar(loader, knode, keypath)
            if not isinstance(skey, str):
                # YAML reads 1, yes and 0x10 as a number or a boolean, not as the text written.
                raise BudgetError(f"a mapping key must be a string; quote it ('{knode.value}')",
                                  path=self.path, line=knode.start_mark.line + 1, keypath=keypath, value=skey)
            sub = (*keypath, skey)
            if skey in out:
                raise BudgetError(
                    f"duplicate key (first defined on line {self.lines[sub]})",
                    path=self.path, line=knode.start_mark.line + 1, keypath=sub, value=skey,
                )
            self.lines[sub] = knode.start_mark.line + 1
            out[skey] = self._build(loader, vnode, sub)
        return out

    def _scalar(self, loader: yaml.SafeLoader, node: yaml.ScalarNode, keypath: tuple[str, ...]) -> Any:
        if node.tag not in _SCALAR_TAGS:
            # '=' and '<<' resolve to these tags when unquoted.
            hint = "; quote it if it is text" if node.tag in (f"{_Y}value", f"{_Y}merge") else ""
            raise self._fail(f"invalid YAML: tag {_short_tag(node.tag)!r} is not allowed{hint}", node, keypath)
        try:
            return loader.construct_object(node, deep=True)
        except ValueError as exc:  # an integer past Python's 4300-digit limit, a date like 2024-13-01
            said = f"expected a number that fits a float, got {len(node.value)} digits" \
                if node.tag == f"{_Y}int" else f"{_short_tag(node.tag)} {node.value!r}: {exc}"
            raise self._fail(said, node, keypath) from None

    def line(self, keypath: tuple[str, ...]) -> int | None:
        while keypath and keypath not in self.lines:
            keypath = keypath[:-1]
        return self.lines.get(keypath)


def _suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else f"; expected one of {', '.join(choices)}"


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite(v: Any) -> bool:
    """A number that fits a float and is finite (a 400-digit integer does not fit)."""
    if not _number(v):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


class _Validator:
    def __init__(self, doc: _Doc) -> None:
        self.doc = doc
        self.errors: list[BudgetError] = []

    def err(self, message: str, keypath: tuple[str, ...], value: Any = ...) -> None:
        self.errors.append(
            BudgetError(message, path=self.doc.path, line=self.doc.line(keypath), keypath=keypath, value=value)
        )

    def selector(self, raw: Any) -> Selector | None:
        kp = ("device",)
        if not isinstance(raw, dict):
            self.err("expected a mapping of device fields such as {type: cpu}", kp, raw)
            return None
        ok = True
        criteria: list[tuple[str, Any]] = []
        for name, want in raw.items():
            problem = self._selector_field(name, want)
            if problem:
                self.err(problem, (*kp, name), name if problem.startswith("unknown") else want)
                ok = False
            else:
                criteria.append((name, want))
        if "type" not in raw:
            self.err("missing 'type' (cpu or cuda)", kp, raw)
            ok = False
        return Selector(tuple(sorted(criteria))) if ok else None

    @staticmethod
    def _selector_field(name: str, want: Any) -> str:
        """Why ``name: want`` is not a usable selector field, or ``""``."""
        # A wrong type must not become a selector that matches nothing and silently budgets nothing.
        if name not in SELECTOR_FIELDS:
            return f"unknown device field{_suggest(name, SELECTOR_FIELDS)}"
        if name == "type":
            return "" if want in ("cpu", "cuda") else "expected 'cpu' or 'cuda'"
        if name in SELECTOR_INT_FIELDS:
            ok = isinstance(want, int) and not isinstance(want, bool) and want >= 1
            return "" if ok else "expected a positive integer"
        if isinstance(want, str):
            # A substring or prefix match on "" selects every device.
            return "" if want else "expected a non-empty string (an empty one selects every device)"
        if _number(want) and name in SELECTOR_VERSION_FIELDS:
            return f"expected a string; quote the version ({name}: '{want}'): as a number 2.10 reads as 2.1"
        if _number(want):
            return f"expected a string; quote it ({name}: '{want}')"
        return "expected a string"

    def provenance(self, raw: Any, kp: tuple[str, ...]) -> Provenance | None:
        if raw is None:
            return None
        if not isinstance(raw, dict):
            self.err("expected a mapping", kp, raw)
            return None
        for name in raw:
            if name not in PROVENANCE_FIELDS:
                self.err(f"unknown provenance field{_suggest(name, PROVENANCE_FIELDS)}", (*kp, name), name)
                return None
        samples, cv, threads = raw.get("samples"), raw.get("cv"), raw.get("threads")
        for name, v in (("samples", samples), ("threads", threads)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                self.err("expected a non-negative integer", (*kp, name), v)
                return None
        for name in ("cv", "noise", "ref_ms"):
            v = raw.get(name)
            if v is not None and (not _finite(v) or v < 0):
                self.err("expected a non-negative number", (*kp, name), v)
                return None
        text = {k: (None if raw.get(k) is None else str(raw[k]))
                for k in ("device", "identity", "torch", "date", "commit", "reason")}
        ref = raw.get("ref_ms")
        noise = raw.get("noise")
        return Provenance(samples=samples, cv=cv, threads=threads, ref_ms=None if ref is None else float(ref),
                          noise=None if noise is None else float(noise), **text)

    def entry(self, key: str, metric: str, raw: Any) -> Budget | None:
        kp = ("budgets", key, metric)
        try:
            parsed = parse_name(metric)
        except UnknownMetricError as exc:
            self.err(str(exc), kp, metric)
            return None
        if _number(raw):
            raw = {"value": raw}
        if not isinstance(raw, dict):
            self.err("expected a number or a mapping with 'value' and 'tolerance'", kp, raw)
            return None
        for name in raw:
            if name not in _ENTRY_KEYS:
                self.err(f"unknown budget field{_suggest(name, _ENTRY_KEYS)}", (*kp, name), name)
                return None
        value = raw.get("value")
        if value is None:
            self.err("missing 'value'", kp, raw)
            return None
        if not _finite(value):
            self.err("expected a finite number", (*kp, "value"), value)
            return None
        if value < 0:
            self.err("expected a non-negative number", (*kp, "value"), value)
            return None
        tol, ab_tol = raw.get("tolerance", tolerance_for(parsed.metric).value), raw.get("ab_tolerance")
        for name, v in (("tolerance", tol), ("ab_tolerance", 0.0 if ab_tol is None else ab_tol)):
            if not _finite(v) or not 0.0 <= v <= 1.0:

                self.err("expected a number in [0, 1]", (*kp, name), v)
                return None

        note = raw.get("note")
        if note is not None and not isinstance(note, str):
            self.err("expected a string", (*kp, "note"), note)
            return None
        prov = self.provenance(raw.get("provenance"), (*kp, "provenance"))
        if raw.get("provenance") is not None and prov is None:
            return None
        return Budget(
            key=key,
            metric=metric,
            value=float(value),
            tolerance=float(tol),
            ab_tolerance=None if ab_tol is None else float(ab_tol),
            source=str(self.doc.path),
            line=self.doc.line(kp),
            provenance=prov,
            note=note,
        )


def parse_text(text: str, path: str | Path) -> BudgetFile:
    """Parse and validate one budget file's text. Errors are collected, never raised."""
    path = Path(path)
    try:
        doc = _Doc(text, path)
    except BudgetError as exc:
        return BudgetFile(path=path, selector=None, errors=[exc])
    v = _Validator(doc)
    data = doc.data
    if not isinstance(data, dict):
        v.err("expected a mapping with 'schema', 'device' and 'budgets'", (), data)
        return BudgetFile(path=path, selector=None, errors=v.errors)
    for name in data:
        if name not in _TOP_KEYS:
            v.err(f"unknown top-level key{_suggest(name, _TOP_KEYS)}", (name,), name)
    schema = data.get("schema")
    if schema != SCHEMA_VERSION:
        v.err(f"expected schema: {SCHEMA_VERSION}", ("schema",), schema)
    selector = v.selector(data.get("device"))
    entries: dict[str, dict[str, Budget]] = {}
    budgets = data.get("budgets", {})
    if budgets is None:
        budgets = {}
    if not isinstance(budgets, dict):
        v.err("expected a mapping of workload keys to metrics", ("budgets",), budgets)
        budgets = {}
    for key, metrics in budgets.items():
        if not isinstance(metrics, dict):
            v.err("expected a mapping of metric names to budgets", ("budgets", key), metrics)
            continue
        for metric, raw in metrics.items():
            b = v.entry(key, metric, raw)
            if b is not None:
                entries.setdefault(key, {})[metric] = b
    note = data.get("note")
    if note is not None and not isinstance(note, str):
        v.err("expected a string", ("note",), note)
        note = None
    return BudgetFile(path=path, selector=selector, entries=entries, errors=v.errors, note=note)


def read_text(path: str | Path, root: str | Path) -> str:
    """The text of ``path`` in the budgets folder ``root``, which a pull request may have written.

    Refused unless a regular file of at most :data:`MAX_FILE_BYTES`, no link, inside ``root``: a
    link could show another file in messages, a FIFO hang the reader, ``/dev/zero`` fill memory.

    Raises:
        BudgetError: naming the file (and the line of a byte that is not UTF-8).
    """
    path = Path(path)

    def refuse(why: str, line: int | None = None) -> BudgetError:
        return BudgetError(f"cannot read: {why}", path=path, line=line)

    if path.is_symlink():
        raise refuse(f"a symbolic link (to {os.readlink(path)}); budgets must be plain files")
    if not path.resolve().is_relative_to(Path(root).resolve()):
        raise refuse(f"it lies outside the budgets folder {root}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise refuse(exc.strerror or str(exc)) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise refuse("not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise refuse(f"larger than {MAX_FILE_BYTES // (1 << 20)} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise refuse(f"not UTF-8 (byte {data[exc.start]:#04x})", data.count(b"\n", 0, exc.start) + 1) from None


def subfolder(root: str | Path, name: str) -> Path:
    """``root/name`` (``noise``), refused when a link or outside ``root``: a pull request may commit
    either, and what is written there would land where ``git status`` does not show it.

    Raises:
        BudgetError: naming the folder and where it leads.
    """
    folder = Path(root) / name
    if folder.is_symlink():
        raise BudgetError(f"a symbolic link (to {os.readlink(folder)}); budget folders must be plain folders",
                          path=folder)
    if not folder.resolve().is_relative_to(Path(root).resolve()):
        raise BudgetError(f"it leads to {folder.resolve()}, outside the budgets folder {root}", path=folder)
    return folder


def confined(budgets_dir: Path, *, named: bool, cwd: Path | None = None) -> Path:
    """``budgets_dir``, refused when it leads out of the repository (the rootdir pytest finds from
    ``cwd``), unless ``named`` on the command line outside it: a pull request may commit any other.

    Raises:

        BudgetError: naming the ini file and key (or the folder), the value and where it leads.
        ValueError: the ini file cannot be read (naming it).
    """
    rootdir, ini, options = find_ini(cwd or Path.cwd())
    root, leads = rootdir.resolve(), budgets_dir.resolve()
    if leads.is_relative_to(root):
        return budgets_dir
    as_written = Path(os.path.normpath((cwd or Path.cwd()) / budgets_dir))
    if named and not as_written.is_relative_to(root) and not as_written.is_relative_to(rootdir):
        return budgets_dir
    leads_out = f"leads to {leads}, outside the repository {rootdir}: refused, since a pull request may have committed it"
    if named:
        raise BudgetError(f"a folder inside the repository that {leads_out}; name the folder it leads to instead",
                          path=budgets_dir)
    why = f"{leads_out}; to use a folder outside, name it with --budgets-dir"
    if "perfbudget_budgets_dir" in options:
        raise BudgetError(why, path=ini, keypath=("perfbudget_budgets_dir",), value=options["perfbudget_budgets_dir"])
    raise BudgetError(f"the default budgets folder {why}", path=budgets_dir)


def load_file(path: str | Path, root: str | Path | None = None) -> BudgetFile:
    """Read (:func:`read_text`) and validate one budget file of the folder ``root`` (default: its own folder)."""
    path = Path(path)
    try:
        text = read_text(path, path.parent if root is None else root)
    except BudgetError as exc:
        return BudgetFile(path=path, selector=None, errors=[exc])
    return parse_text(text, path)


@dataclass
class BudgetSet:
    """All budget files of a folder, validated once."""

    root: Path
    files: list[BudgetFile] = field(default_factory=list)
    errors: list[BudgetError] = field(default_factory=list)
    """Errors of the folder itself (not a folder); the files' errors are on each file."""

    @property
    def file_errors(self) -> list[BudgetError]:
        """Every error that makes a file (or the folder) unusable, whatever device it selects."""
        return [*self.errors, *(e for f in self.files for e in f.file_errors)]

    @property
    def entry_errors(self) -> list[BudgetError]:
        """Errors confined to one workload key of a usable file, in every file."""
        return [e for f in self.files for e in f.entry_errors]

    def matching(self, info: DeviceInfo) -> list[BudgetFile]:
        """Usable files that select ``info``, most specific first."""
        found = [f for f in self.files if f.usable and f.matches(info)]
        return sorted(found, key=lambda f: (-f.selector.specificity if f.selector else 0, f.path.name))

    def selector_of(self, budget: Budget) -> Selector | None:
        """The device selector of the file ``budget`` was loaded from (``None``: not from this set)."""
        for f in self.files:
            if str(f.path) == str(budget.source):
                return f.selector
        return None

    def keyed_by(self, budget: Budget, identity: str) -> bool:
        """Whether ``budget`` comes from a file whose selector names the machine ``identity``."""
        selector = self.selector_of(budget)
        want = selector.as_dict().get("identity") if selector is not None else None
        return isinstance(want, str) and want.lower() == identity.lower()

    def errors_for(self, key: str, info: DeviceInfo | None = None) -> list[BudgetError]:
        """Errors that make the budgets of ``key`` unknowable: every file error, and ``key``'s entry
        errors in the files selecting ``info`` (``None``: every file)."""
        out = list(self.file_errors)
        for f in self.files:
            if info is None or f.matches(info):
                out.extend(f.key_errors(key))
        return out

    def resolve(self, key: str, metric: str, info: DeviceInfo) -> Budget | None:
        """The budget for ``key``/``metric`` on ``info``, or ``None`` when unbudgeted.

        Raises:
            BudgetError: two equally specific matching files both budget it.
        """
        best: Budget | None = None
        best_spec = -1
        for f in self.matching(info):
            b = f.entries.get(key, {}).get(metric)
            if b is None or f.selector is None:
                continue
            spec = f.selector.specificity
            if best is not None and spec == best_spec:
                raise BudgetError(
                    f"ambiguous: also budgeted in {best.source}, whose device selector is as specific",
                    path=f.path, line=b.line, keypath=("budgets", key, metric), value=b.value,
                )
            if best is None:
                best, best_spec = b, spec
        return best

    def lookup(self, key: str, metric: str, info: DeviceInfo) -> tuple[Budget | None, str]:
        """The budget for ``key``/``metric`` on ``info`` (``None``: unbudgeted) and ``""``, or ``None``
        and why it cannot be known (``budget file error: ...``)."""
        errors = self.errors_for(key, info)
        try:
            budget = self.resolve(key, metric, info)
        except BudgetError as exc:
            errors.append(exc)
        if not errors:
            return budget, ""
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return None, f"budget file error: {errors[0]}{more}"

    def budgets_for(self, key: str, info: DeviceInfo) -> dict[str, Budget]:
        """Every metric budgeted for ``key`` on ``info``, most specific file winning."""
        metrics = {m for f in self.matching(info) for m in f.entries.get(key, {})}
        out = {}
        for m in sorted(metrics):
            b = self.resolve(key, m, info)
            if b is not None:
                out[m] = b
        return out


def load_dir(root: str | Path) -> BudgetSet:
    """Load every ``*.yaml``/``*.yml`` file in ``root``; a missing folder is an empty set."""

    root = Path(root)
    bs = BudgetSet(root=root)
    if not root.exists():
        return bs
    if not root.is_dir():
        bs.errors.append(BudgetError("budgets path is not a folder", path=root))
        return bs
    for p in sorted([*root.glob("*.yaml"), *root.glob("*.yml")]):
        bs.files.append(load_file(p, root))
    return bs
