"""A real main-branch history: a scratch repository of consecutive commits, one perf test, a real
lockstep A/B run of every commit against its parent, each kept in a history; a creep planted in steps.
Times code: run it on a quiet machine, never beside another timing run.

The scratch repository (``--workdir``) has a library whose step does ``--work`` small matmuls
(``--kind torch``, the default) or ``4000 * FACTOR`` pure-Python additions (``--kind python``), and
one test timing it through perfbudget's public API. Commit 0 has ``FACTOR = 1.0``; of the
``--commits`` commits after it, those named by ``--planted`` each multiply ``FACTOR`` by ``--step``;
the others change only a comment (``--planted none``: a history of no-op commits). For every
commit: ``perfbudget ab --base HEAD~1`` there, then ``perfbudget history add``; at the end
``perfbudget history show``, ``check --since`` commit 0, and ``report``, and the chain on each
run's own per-pair sd beside the pooled one (``--chains DB`` prints that for an existing history).

Usage: python benchmarks/history_real.py [--commits 5] [--planted 2,3,4,5] [--step 1.025]
           [--workdir /tmp/perfbudget-history-real] [--out FILE.md] [--dry-run]
       (--dry-run builds the repository and prints the commands, without timing anything)
The issue's creep: a no-op commit, then four of +2.5 % each (the defaults); its control:
``--planted none``.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PERFBUDGET = ROOT / ".venv" / "bin" / "perfbudget"
LIB = {"python": """\
# revision {rev}
FACTOR = {factor!r}


def step():
    x = 0
    for i in range(int(4000 * FACTOR)):
        x += i
    return x
""", "torch": """\
# revision {rev}
import torch

FACTOR = {factor!r}
A = torch.randn(64, 64)


def step():
    x = A
    for _ in range(round(400 * FACTOR)):
        x = torch.mm(A, A)
    return x
"""}

TEST = """\
import pytest

import scratchlib


@pytest.mark.budget("scratch-step")
def test_step(perf):
    perf.time("step_ms", scratchlib.step, warmup_ms=50, min_samples=30, max_ms=1500)
"""

BUDGETS = """\
schema: 1
device:
  type: cpu
budgets:
  scratch-step:
    step_ms:
      value: 1.0
      tolerance: 0.5
      ab_tolerance: 0.05
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=history", "-c", "user.email=history@example.invalid", "-C",
                           str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def build(repo: Path, commits: int, *, planted: tuple[int, ...], step: float, kind: str) -> list[str]:
    """The scratch repository; returns its commits, oldest first (commit 0 first)."""
    if repo.exists():
        shutil.rmtree(repo)
    (repo / "src" / "scratchlib").mkdir(parents=True)
    (repo / "perf").mkdir()
    (repo / "budgets").mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / ".gitignore").write_text("/.perfbudget/\n__pycache__/\nhistory.db\n")
    (repo / "perf" / "test_step.py").write_text(TEST)
    (repo / "budgets" / "cpu.yaml").write_text(BUDGETS)
    shas = []
    factor = 1.0
    for i in range(commits + 1):
        if i in planted:
            factor = round(factor * step, 6)
        (repo / "src" / "scratchlib" / "__init__.py").write_text(LIB[kind].format(rev=i, factor=factor))
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"commit {i}" + (f": step x{step}" if i in planted else ""))
        shas.append(git(repo, "rev-parse", "HEAD"))
    return shas


def chains(db: Path, name: str = "scratch-step.step_ms") -> str:
    """The cumulative change since the chain's start, on each run's own per-pair sd and with the
    machine's runs pooled (what ``history check`` uses): how much the pooling narrowed it."""
    from perfbudget.history import HistoryStore
    from perfbudget.history.chain import chain_of, cumulative, pooled

    key, metric = name.rsplit(".", 1)
    with HistoryStore(db) as store:
        points = store.series(key, metric)
    own, _ = chain_of(points)
    out = []
    for label, links in (("each run's own sd", own), ("pooled per machine", pooled(own, points))):
        c = cumulative(links)
        out.append(f"{label}: {c.change:+.1%} ({c.ci[0] - 1:+.1%} to {c.ci[1] - 1:+.1%})")
    sds = ", ".join(f"{p.check.pair_sd:.1%}" if p.check.pair_sd is not None else "-" for p in points)
    return f"{name} since the chain's start: " + "; ".join(out) + f" (pairs' own sd per run: {sds})"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--commits", type=int, default=5, help="commits after commit 0")
    p.add_argument("--planted", default="2,3,4,5", help="commits that multiply the work by --step, or none")
    p.add_argument("--step", type=float, default=1.025)
    p.add_argument("--kind", choices=("torch", "python"), default="torch")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/perfbudget-history-real"))
    p.add_argument("--max-pairs", type=int, default=4)
    p.add_argument("--dry-run", action="store_true", help="build the repository and print the commands only")
    p.add_argument("--chains", type=Path, metavar="DB",
                   help="only print the chain of an existing history on each run's own sd and pooled")
    p.add_argument("--out", type=Path, default=None,
                   help="also write a Markdown transcript (each commit's A/B verdict, history show and check)")
    args = p.parse_args(argv)
    if args.chains is not None:
        print(chains(args.chains))
        return 0
    repo = args.workdir / "repo"
    planted = () if args.planted == "none" else tuple(int(x) for x in args.planted.split(","))
    shas = build(repo, args.commits, planted=planted, step=args.step, kind=args.kind)
    db = args.workdir / "history.db"
    commands: list[list[str]] = []
    for i, sha in enumerate(shas[1:], start=1):
        out = args.workdir / f"ab-{i:02d}.json"
        commands += [["git", "-C", str(repo), "checkout", "-q", sha],
                     [str(PERFBUDGET), "ab", "--base", "HEAD~1", "--max-pairs", str(args.max_pairs), "--out", str(out),
                      "--", "perf", "-q"],
                     [str(PERFBUDGET), "history", "add", str(out), "--db", str(db)]]
    commands += [[str(PERFBUDGET), "history", "show", "scratch-step.step_ms", "--db", str(db)],
                 [str(PERFBUDGET), "history", "check", "--since", shas[0], "--db", str(db)],
                 [str(PERFBUDGET), "history", "report", "--db", str(db), "-o", str(args.workdir / "history.html")]]
    if args.dry_run:
        print(f"# scratch repository: {repo} ({len(shas)} commits; planted x{args.step} at {planted})")
        for c in commands:
            print(shlex.join(c))
        return 0
    if db.exists():
        db.unlink()
    transcript = [f"Scratch repository: {len(shas)} commits ({args.kind} step); planted x{args.step} at commits "
                  f"{planted or 'none'}.", ""]
    for c in commands:
        print("$ " + shlex.join(c), flush=True)
        # `ab` exits 1 when a commit fails its own A/B (the planted steps may): that is data here;
        # `history check` exits 1 when it finds the drift.
        done = subprocess.run(c, cwd=repo, capture_output=True, text=True)
        print(done.stdout + done.stderr, end="", flush=True)
        if done.returncode not in (0, 1):
            print(f"history_real: {c[0]} exited {done.returncode}", file=sys.stderr)
            return done.returncode
        if c[1] == "ab":
            line = next((ln for ln in (done.stdout + done.stderr).splitlines() if "scratch-step" in ln
                         and "step_ms" in ln), "")
            transcript.append(f"- `{Path(c[7]).stem}` (commit vs its parent) ab exit {done.returncode}: `{line.strip()}`")
        elif c[1] == "history" and c[2] != "add":
            transcript += ["", f"`$ perfbudget {' '.join(c[2:4])}` (exit {done.returncode}):", "", "```",
                           (done.stdout + done.stderr).rstrip(), "```"]
    transcript += ["", chains(db)]
    if args.out is not None:
        args.out.write_text("# A real main-branch history, measured\n\nCommand: `python benchmarks/history_real.py "
                            + " ".join(argv if argv is not None else sys.argv[1:]) + "`\n\n" + "\n".join(transcript)
                            + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
