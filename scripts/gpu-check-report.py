#!/usr/bin/env python3
"""The GPU check's bookkeeping (scripts/gpu-check.sh): which tests a rehearsal runs, whether a
results file is unfinished, the one-screen summary, and whether an OUT folder fits the device's
return limits. Standard library only: it runs on whatever python3 the machine has, even when
installing perfbudget failed.

  gpu-check-report.py select COLLECTED PLANNED  the [cpu] counterparts of the PLANNED [cuda] tests
                                              (one a line) among the COLLECTED ones, in PLANNED's order
  gpu-check-report.py unfinished RESULTS      exit 0 when RESULTS was cut off mid-run (or is missing)
  gpu-check-report.py failures PASS_DIR       the tests a pass recorded as failed or in error
  gpu-check-report.py summary RUN_DIR OUT     print the summary (RUN_DIR/parts.tsv, plan.tsv and each
                                              part's files): each test's seconds beside the plan's
  gpu-check-report.py check-out OUT           exit 1, naming each problem, when OUT breaks a limit
  gpu-check-report.py rehearsal-check OUT DIR  exit 1 unless the rehearsal's OUT holds what a lease's
                                              would (unpacked into DIR)
"""

from __future__ import annotations

import json
import re
import sys
import tarfile
import unicodedata
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

#: What comes back from the device's $OUT (/work/.library/device/README.md, "Limits").
MAX_FILES = 8
MAX_FILE_BYTES = 16 * 2**20
MAX_TOTAL_BYTES = 64 * 2**20
MAX_FOLDERS_DOWN = 2
NAME = re.compile(r"[A-Za-z0-9._-]+")
SHOWN_FAILURES = 5
"""Failing tests named per pass: the summary stays one screen."""

#: The parts in the order the script runs them, with the folder each keeps its files in.
PARTS = (("set-up", None), ("update", "update"), ("check", "check"), ("a/a", "aa"), ("compile", "compile"))
"""The check's parts and their folders; ``--compile`` (the second command) runs set-up and compile alone."""


def select(collected: Path, planned: Path) -> list[str]:
    """The ``[cpu]`` variant of every planned ``[cuda]`` test that has one among the collected
    (``pytest --collect-only -q`` output), in the plan's order: the same tests, the same fixtures
    and code path, on the CPU."""
    have = {line.strip() for line in collected.read_text().splitlines() if "::" in line}
    ids = [line.strip() for line in planned.read_text().splitlines() if line.strip().endswith("[cuda]")]
    return [cpu for i in ids if (cpu := i[: -len("[cuda]")] + "[cpu]") in have]


def plan(run: Path) -> dict[str, dict[str, float]]:
    """The lease plan's estimated H200 seconds (``plan.tsv``: part, step, seconds) by part and by the
    test's name as JUnit gives it (``test_encoder::test_operators[cuda]``); the part's total under ``""``."""
    out: dict[str, dict[str, float]] = {}
    try:
        rows = (run / "plan.tsv").read_text().splitlines()
    except OSError:
        return out
    for row in rows:
        part, step, seconds = [*row.split("\t"), "", ""][:3]
        try:
            value = float(seconds)
        except ValueError:
            continue
        steps = out.setdefault(part, {"": 0.0})
        steps[""] += value
        if "::" in step:
            path, name = step.split("::", 1)
            steps[f"{Path(path).stem}::{name}"] = value
    return out


def load(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _dict(x: object) -> dict:
    return x if isinstance(x, dict) else {}


def _num(x: object) -> str:
    """A number to 4 decimals, ``?`` for anything else (a results file is a test's output: any JSON)."""
    return f"{x:.4f}" if isinstance(x, (int, float)) and not isinstance(x, bool) else "?"


def plain(text: str) -> str:
    """``text`` with each control or format character (an ANSI escape, a newline) shown as a space."""
    return "".join(" " if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") else c for c in text)


def failures(folder: Path) -> int:
    """Tests a pass in ``folder`` recorded as failed or in error: its junit.xml (pytest ends its session at the
    bound's SIGINT), else its results (written after every test; a pass killed later wrote no junit)."""
    cases = junit(folder / "junit.xml")
    if cases is not None:
        return sum(1 for _, outcome, _, _ in cases if outcome in ("failed", "error"))
    data = load(folder / "results.json")
    records = data.get("records") if data is not None else None
    return sum(1 for r in records if isinstance(r, dict) and r.get("outcome") in ("fail", "error")) \
        if isinstance(records, list) else 0


def unfinished(path: Path) -> bool:
    data = load(path)
    return data is None or bool(_dict(data.get("meta")).get("unfinished"))


def junit(path: Path) -> list[tuple[str, str, float, str]] | None:
    """(test, outcome, seconds, first line of the message) per test case; ``None`` without a file."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    out = []
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name', '')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (el.get("message") or el.text or "").strip().splitlines()[0:1]
                message = message[0] if message else ""
                break
        out.append((name, outcome, float(case.get("time", 0) or 0), message))
    return out


def part_line(name: str, status: str, wall: str, bound: str, note: str, folder: Path | None,
              planned: dict[str, float] | None = None) -> list[str]:
    """The part's lines; ``planned``: its estimated seconds, the part's under ``""`` (see :func:`plan`)."""
    planned = planned or {}
    time_text = f"{wall}/{bound} s" if bound not in ("", "-") else f"{wall} s"
    head = f"{name:<8} {status:<10} {time_text:>11}" + (f" (plan {planned['']:.0f})" if "" in planned else "")
    lines = []
    if folder is None or not folder.is_dir():
        return [f"{head}  {note}".rstrip()]
    results = load(folder / "results.json")
    cases = junit(folder / "junit.xml")
    bits = []
    if cases is not None:
        counts = Counter(o for _, o, _, _ in cases)
        bits.append("tests " + ", ".join(f"{n} {o}" for o, n in sorted(counts.items())))
    records = [r for r in results.get("records", []) if isinstance(r, dict)] \
        if results is not None and isinstance(results.get("records"), list) else []
    if results is not None:
        meta = _dict(results.get("meta"))
        tests = {str(r.get("nodeid")) for r in records if r.get("nodeid")}
        if cases is None:
            bits.append(f"{len(tests)} test(s) recorded")
        outcomes = Counter(str(r.get("outcome")) for r in records)
        bits.append(f"{len(records)} records (" + ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items())) + ")")
        if meta.get("unfinished"):
            bits.append("unfinished: the records of the tests finished before the kill")
        ab = meta.get("ab")
        if isinstance(ab, dict):
            bits.append(f"stopped: {ab.get('stopped', '?')}")
    elif status != "skipped":
        bits.append("no results file")
    lines.append(f"{head}  {'; '.join(bits)}")
    if note:
        lines.append(f"{'':<8} {note}")
    if cases:
        bad = [(t, o, m) for t, o, _, m in cases if o in ("failed", "error")]
        for test, outcome, message in bad[:SHOWN_FAILURES]:
            lines.append(f"{'':<8} {outcome.upper()} {test}: {message[:110]}")
        if len(bad) > SHOWN_FAILURES:
            lines.append(f"{'':<8} and {len(bad) - SHOWN_FAILURES} more: see its log.txt and results.md in the tarball")
        # Each test's seconds beside the plan's H200 estimate (a [cpu] test beside its [cuda] one's).
        for test, _, seconds, _ in cases:
            est = planned.get(test.removesuffix("[cpu]") + "[cuda]" if test.endswith("[cpu]") else test)
            lines.append(f"{'':<8} {seconds:6.1f} s (plan {'-' if est is None else f'{est:.1f}':>5})  {test}")
    if name == "a/a":
        for r in records:
            base = _dict(r.get("base"))
            if r.get("metric") == "step_ms" and base.get("ratio") is not None:
                ci = base.get("ratio_ci")
                lo, hi = ci if isinstance(ci, list) and len(ci) == 2 else ("?", "?")
                lines.append(f"{'':<8} {r.get('key')}.step_ms head/base {_num(base['ratio'])} "
                             f"[{_num(lo)}, {_num(hi)}] over {base.get('pairs')} pair(s): {r.get('outcome')}")
    return lines


def summary(run: Path, out: Path) -> str:
    lines = []
    env = run / "environment.txt"
    if env.is_file():
        lines += [line for line in env.read_text().splitlines() if line.startswith("gpu-check")][:4]
    parts = {}
    tsv = run / "parts.tsv"
    if tsv.is_file():
        for row in tsv.read_text().splitlines():
            name, status, wall, bound, note = (row.split("\t") + [""] * 5)[:5]
            parts[name] = (status, wall, bound, note)
    estimates = plan(run)
    second = "compile" in parts
    for name, folder in PARTS:
        if name != "set-up" and (name == "compile") != second:
            continue
        if name in parts:
            lines += part_line(name, *parts[name], folder=run / folder if folder else None,
                               planned=estimates.get(name))
        else:
            lines.append(f"{name:<8} {'not run':<10}")
    written = sorted(p.name for p in (run / "budgets").glob("*.yaml")) if (run / "budgets").is_dir() else []
    diff = run / "budgets.diff"
    added = sum(1 for line in diff.read_text().splitlines() if re.match(r"\+\s+value:", line)) if diff.is_file() else 0
    lines.append(f"budgets  {', '.join(written) or 'none written'}" + (f" ({added} values added or changed)" if written else ""))
    files = sorted(p for p in out.rglob("*") if p.is_file())
    lines.append("OUT      " + ", ".join(f"{p.relative_to(out)} ({p.stat().st_size / 2**20:.1f} MiB)" for p in files)
                 + "; unpack: tar -xzf gpu-check.tar.gz")
    # Names, messages and outcomes come from the tests' files: no escape sequence reaches the terminal.
    return "\n".join(plain(line) for line in lines)


def check_out(out: Path) -> list[str]:
    problems = []
    files = []
    for p in sorted(out.rglob("*")):
        rel = p.relative_to(out)
        if not NAME.fullmatch(p.name):
            problems.append(f"{rel}: name has characters other than letters, digits, '.', '_' and '-'")
        if p.is_symlink() or not (p.is_file() or p.is_dir()):
            problems.append(f"{rel}: not a plain file or folder")
        elif p.is_file():
            files.append(p)
            if len(rel.parts) - 1 > MAX_FOLDERS_DOWN:
                problems.append(f"{rel}: more than {MAX_FOLDERS_DOWN} folders down")
            if p.stat().st_size > MAX_FILE_BYTES:
                problems.append(f"{rel}: {p.stat().st_size} bytes, over {MAX_FILE_BYTES}")
    if len(files) > MAX_FILES:
        problems.append(f"{len(files)} files, over {MAX_FILES}: {', '.join(str(p.relative_to(out)) for p in files)}")
    total = sum(p.stat().st_size for p in files)
    if total > MAX_TOTAL_BYTES:
        problems.append(f"{total} bytes in all, over {MAX_TOTAL_BYTES}")
    return problems


def rehearsal_check(out: Path, unpacked: Path) -> list[str]:
    """What a rehearsal must have left: the summary, and in the tarball the update pass's results
    and budget files, the check pass's results (cut or not) and the A/A's."""
    problems = [f"{name}: missing" for name in ("summary.txt", "gpu-check.tar.gz") if not (out / name).is_file()]
    if problems:
        return problems
    with tarfile.open(out / "gpu-check.tar.gz") as tar:
        tar.extractall(unpacked, filter="data")
    run = unpacked / "gpu-check"
    parts = {row.split("\t")[0]: row.split("\t")[1] for row in (run / "parts.tsv").read_text().splitlines()}
    for name, allowed in (("set-up", {"ok"}), ("update", {"ok"}), ("check", {"ok", "cut"}), ("a/a", {"ok", "failed"})):
        if parts.get(name) not in allowed:
            problems.append(f"{name}: {parts.get(name, 'not run')}, expected {' or '.join(sorted(allowed))}")
    for folder, finished in (("update", True), ("check", False), ("aa", True)):
        data = load(run / folder / "results.json")
        if data is None or not data.get("records"):
            problems.append(f"{folder}/results.json: missing, unreadable or without records")
        elif finished and bool(_dict(data.get("meta")).get("unfinished")):
            problems.append(f"{folder}/results.json: unfinished")
    if not list((run / "budgets").glob("*.yaml")):
        problems.append("budgets/: the update pass wrote no budget file")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "select":
        print("\n".join(select(Path(argv[1]), Path(argv[2]))))
        return 0
    if len(argv) == 2 and argv[0] == "failures":
        print(failures(Path(argv[1])))
        return 0
    if len(argv) == 2 and argv[0] == "unfinished":
        return 0 if unfinished(Path(argv[1])) else 1
    if len(argv) == 3 and argv[0] == "summary":
        print(summary(Path(argv[1]), Path(argv[2])))
        return 0
    if len(argv) == 2 and argv[0] == "check-out":
        problems = check_out(Path(argv[1]))
        for p in problems:
            print(f"gpu-check: OUT breaks the device's return limits: {p}", file=sys.stderr)
        return 1 if problems else 0
    if len(argv) == 3 and argv[0] == "rehearsal-check":
        problems = rehearsal_check(Path(argv[1]), Path(argv[2]))
        for p in problems:
            print(f"gpu-check: rehearsal: {p}", file=sys.stderr)
        return 1 if problems else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
