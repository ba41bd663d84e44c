"""How good is the lockstep A/B gate? False alarms, detection and cost of `perfbudget ab`, measured.

Works in a scratch clone of this repository's HEAD (never in the checkout itself):

- A/A: ``perfbudget ab --base HEAD`` with the working tree equal to the base: every failing
  timing check is a false alarm;
- planted regressions as real commits on top of the base, each a changed workload file
  (``src/torchlevers/workloads/encoder.py``):
  - ``step:F``: every encoder training step spins F of its own duration longer;
  - ``op:F``: the encoder's FFN gets an extra matmul sized to add F to the step's
    ``aten::mm`` FLOPs; it also adds ``aten::mm`` calls, so the exact ``op_count`` and
    ``flops`` checks see it too: detection is counted by any check and by timing checks alone.
  A plant is named in the table by what it did to the time, as measured here (the median
  head/base of ``step_ms`` and of ``op_self_ms[aten::mm]`` over its runs), beside what was
  planted;
- ``--suite-aa N``: A/A runs of the whole suite (``perf_tests``), with their wall time.

Verdicts: ``fail`` counts as a detection (a false alarm in an A/A); ``inconclusive`` (the
interval still straddles the tolerance after the last pair) is counted apart: never a
failure, never a pass.

Usage (a quiet machine, nothing else running)::

    python benchmarks/ab_gate.py --aa 20 --plant step:0.10:10 --plant op:0.10:10 \\
        --plant step:0.05:3 --plant step:0.20:3 --plant op:0.05:3 --plant op:0.20:3 \\
        --suite-aa 2 --out benchmarks/ab-gate-cpu.md --minutes 80

Runs are interleaved across scenarios (so a time limit leaves every scenario with some
runs); the table is rewritten after every run with the counts behind every rate.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The suite's encoder checks: step latency/throughput and the per-operator checks.
TESTS = ("perf_tests/test_encoder.py", "-k", "step_latency or operators")
SUITE = ("perf_tests",)
#: The suite's smallest timed steps, where whole processes differ most (process-modes-cpu.md):
#: the tiny MLP's training step and the decoder's serving latencies.
SMALL = ("perf_tests/test_tiny.py", "perf_tests/test_decoder.py", "-k", "tiny_mlp_step_time or serving_latency")
TIMING = ("step_ms", "throughput_samples_per_s", "op_self_ms", "op_share", "ttft_ms", "token_ms", "e2e_ms_p50",
          "e2e_ms_p90", "tokens_per_s", "speedup", "compile_s", "latency_ms")
#: The whole suite's A/A should finish within this (the issue's target for a pull-request check).
SUITE_TARGET_S = 600.0
WORKLOAD = "src/torchlevers/workloads/encoder.py"

STEP_PLANT = '''

# --- planted by benchmarks/ab_gate.py: every training step spins {frac} of its own duration longer
import time as _planted_time

_planted_step = EncoderWorkload.step


def _planted_slow_step(self, batch):  # type: ignore[no-untyped-def]
    t0 = _planted_time.perf_counter()
    out = _planted_step(self, batch)
    t1 = _planted_time.perf_counter()
    stop = t1 + {frac} * (t1 - t0)
    while _planted_time.perf_counter() < stop:
        pass
    return out


EncoderWorkload.step = _planted_slow_step  # type: ignore[method-assign]
'''

WIDTH_PROBE = '''
import sys
from torchlevers.workloads import EncoderConfig, EncoderWorkload
from perfbudget.measure.operators import count_flops
frac = float(sys.argv[1])
cfg = EncoderConfig.for_size("tiny", device="cpu")
w = EncoderWorkload(cfg)
batch = w.make_batch()
mm = count_flops(lambda: w.step(batch)).by_op.get("aten::mm", 0)
# The planted matmul adds 4*T*d_ff FLOPs per output column and layer (one mm forward, one
# for the input gradient), as the fixtures' op_slowdown plant computed it.
per_column = 4 * cfg.batch_size * cfg.seq_len * cfg.d_ff * cfg.n_layers
print(min(cfg.d_model, max(1, round(frac * mm / per_column))))
'''


@dataclass
class Scenario:
    name: str
    kind: str  # "aa", "suite-aa", "small-aa", "step", "op"
    frac: float
    runs: int
    done: list[dict] = field(default_factory=list)
    precision: float | None = None
    """``perfbudget ab --precision`` (``None``: its default)."""

    @property
    def tests(self) -> tuple[str, ...]:
        return {"suite-aa": SUITE, "small-aa": SMALL}.get(self.kind, TESTS)

    def label(self) -> str:
        """What was planted, and what it did to the time as measured in these runs."""
        if self.kind == "aa":
            return "A/A, encoder (false alarms)"
        if self.kind == "small-aa":
            return "A/A, small steps: tiny MLP step, decoder serving (false alarms)"
        if self.kind == "suite-aa":
            how = (" (one fixed sample set per check, `--precision 0`)" if self.precision == 0 else
                   f" (sampled to a within-pair precision of ±{self.precision:.0%}, `--precision {self.precision:g}`)"
                   if self.precision else "")
            return f"A/A, whole suite (false alarms){how}"
        step = _median_ratio(self.done, "encoder-train.step_ms")
        mm = _median_ratio(self.done, "encoder-train.op_self_ms[aten::mm]")
        planted = (f"step spins +{self.frac:.0%} of its own time" if self.kind == "step"
                   else f"extra matmul: +{self.frac:.0%} of aten::mm FLOPs")
        measured = ", ".join(x for x in (f"step time {step - 1:+.1%}" if step else "",
                                         f"aten::mm self time {mm - 1:+.1%}" if mm and self.kind == "op" else "") if x)
        return f"{planted} (measured: {measured})" if measured else planted


def _median_ratio(runs: list[dict], check: str) -> float | None:
    xs = [r["checks"][check]["ratio"] for r in runs if check in r.get("checks", {})
          and r["checks"][check]["ratio"] is not None]
    return statistics.median(xs) if xs else None


def sh(*args: str, cwd: Path, env: dict[str, str] | None = None, check: bool = True) -> str:
    got = subprocess.run(args, cwd=cwd, env=env, text=True, capture_output=True)
    if check and got.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({got.returncode}): {got.stderr[-2000:]}")
    return got.stdout


def plant(clone: Path, base: str, kind: str, frac: float) -> str:
    """Commit the plant on top of ``base`` on a scratch branch; returns the commit."""
    sh("git", "checkout", "-q", "--detach", base, cwd=clone)
    path = clone / WORKLOAD
    text = path.read_text()
    if kind == "step":
        text += STEP_PLANT.format(frac=frac)
    else:
        env = {**os.environ, "PYTHONPATH": str(clone / "src")}
        width = int(sh(sys.executable, "-c", WIDTH_PROBE, str(frac), cwd=clone, env=env).strip())
        old_flag, old_width = "    extra_ffn_matmul: bool = False", "    extra_ffn_width: int = 0"
        if old_flag not in text or old_width not in text:
            raise RuntimeError(f"{WORKLOAD}: the EncoderConfig fields the op plant edits have moved")
        text = text.replace(old_flag, "    extra_ffn_matmul: bool = True").replace(
            old_width, f"    extra_ffn_width: int = {width}")
    path.write_text(text)
    sh("git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-qam",
       f"planted {kind} {frac}", cwd=clone)
    return sh("git", "rev-parse", "HEAD", cwd=clone).strip()


def ab_run(clone: Path, base: str, out: Path, max_pairs: int, tests: tuple[str, ...] = TESTS,
           precision: float | None = None) -> dict:
    start = time.perf_counter()
    extra = [] if precision is None else ["--precision", f"{precision:g}"]
    got = subprocess.run(
        [sys.executable, "-m", "perfbudget.cli", "ab", "--base", base, "--max-pairs", str(max_pairs),
         "--out", str(out), *extra, "--", *tests],
        cwd=clone, text=True, capture_output=True,
        env={**os.environ, "PYTHONPATH": str(clone / "src")},
    )
    wall = time.perf_counter() - start
    if not out.exists():
        return {"wall_s": wall, "rc": got.returncode, "error": got.stderr[-1500:], "checks": {}}
    data = json.loads(out.read_text())
    checks = {}
    for r in data["records"]:
        if r["outcome"] == "not_measured":
            continue
        base_side = r.get("base") or {}
        info = {**base_side, **((r.get("extra") or {}).get("ab") or {})}  # results schema 2 / 1
        checks[f"{r['key']}.{r['metric']}"] = {"outcome": r["outcome"], "ratio": base_side.get("ratio"),
                                              "pairs": base_side.get("pairs"), "sd": info.get("sd"),
                                              "mde": info.get("mde", info.get("detectable")),
                                              "pair_ratios": base_side.get("pair_ratios") or []}
    ab = data["meta"].get("ab", {})
    runs = ab.get("runs") or []
    return {"wall_s": wall, "rc": got.returncode, "pairs": ab.get("pairs"), "checks": checks,
            "invalid": sum(1 for x in runs if x.get("invalid")),
            "tests_per_pair": [len(x["tests"]) if isinstance(x.get("tests"), list) else None for x in runs]}


def family(metric: str) -> str:
    return metric.split(".", 1)[1].split("[", 1)[0]


def table(scenarios: list[Scenario], plain_s: dict[str, float], command: str) -> str:
    lines = ["# Lockstep A/B gate, measured", "",
             f"Machine: {platform_line()}; torch threads 1; both sides pinned to one CPU (`--cpus auto`).",
             f"Encoder checks: `{' '.join(TESTS)}` (step latency/throughput, per-operator self time/share/count); "
             f"whole suite: `{' '.join(SUITE)}`.",
             f"Command: `{command}`", ""]
    for what, secs in plain_s.items():
        lines.append(f"One plain run of `pytest {what}`: {secs:.0f} s.")
    lines += ["", "| scenario | runs | detected (any check) | detected (timing checks) | inconclusive (runs) | "
              "failing / inconclusive / timing checks | invalid pairs | median pairs | median wall (s) | "
              "cost vs plain run |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for s in scenarios:
        runs = [r for r in s.done if "error" not in r]
        errors = len(s.done) - len(runs)
        if not s.done:
            continue
        any_fail = sum(1 for r in runs if any(c["outcome"] in ("fail", "error") for c in r["checks"].values()))
        timing_fail = sum(1 for r in runs if any(c["outcome"] == "fail" and family(k) in TIMING
                                                 for k, c in r["checks"].items()))
        incon = sum(1 for r in runs if any(c["outcome"] == "inconclusive" for c in r["checks"].values()))
        n_checks = sum(1 for r in runs for k in r["checks"] if family(k) in TIMING)
        n_fail = sum(1 for r in runs for k, c in r["checks"].items() if family(k) in TIMING and c["outcome"] == "fail")
        n_incon = sum(1 for r in runs for c in r["checks"].values() if c["outcome"] == "inconclusive")
        invalid = sum(r.get("invalid", 0) for r in runs)
        pairs = statistics.median([r["pairs"] or 0 for r in runs]) if runs else 0
        wall = statistics.median([r["wall_s"] for r in runs]) if runs else 0
        plain = plain_s.get(" ".join(s.tests))
        cost = f"{wall / plain:.1f}x" if plain else "-"
        err = f" (+{errors} errored)" if errors else ""
        lines.append(f"| {s.label()} | {len(runs)}{err} | {any_fail}/{len(runs)} | {timing_fail}/{len(runs)} | "
                     f"{incon}/{len(runs)} | {n_fail} / {n_incon} / {n_checks} | {invalid} | {pairs:g} | {wall:.0f} | "
                     f"{cost} |")
    for suite in (s for s in scenarios if s.kind == "suite-aa" and s.done):
        walls = [r["wall_s"] for r in suite.done]
        lines += ["", f"{suite.label()}: wall time {', '.join(f'{w:.0f} s' for w in walls)} "
                      f"(target {SUITE_TARGET_S:.0f} s); tests run per pair: "
                      + "; ".join(str(r.get("tests_per_pair")) for r in suite.done) + " (None: every selected test)."]
    lines += ["", "Per-check per-pair sd of ln(head/base) in the A/A runs, per scenario (median over runs; the raw "
                  "sd of the pair ratios, and the pooled sd the verdict uses, with the prior), the smallest change "
                  "each run could resolve (median MDE) and the pairs it got:", ""]
    aa = [s for s in scenarios if s.kind in ("aa", "suite-aa", "small-aa") and s.done]
    lines += ["| check | " + " | ".join(f"{s.name}: raw sd / pooled sd / MDE / pairs" for s in aa) + " |",
              "|---|" + "---|" * len(aa)]
    per_sd: dict[str, dict[str, list[tuple[float | None, float, float | None, int]]]] = defaultdict(dict)
    for s in aa:
        for r in s.done:
            for k, c in r.get("checks", {}).items():
                if c.get("sd") is not None:
                    per_sd[k].setdefault(s.name, []).append(
                        (_raw_sd(c.get("pair_ratios") or []), c["sd"], c.get("mde"), c.get("pairs") or 0))
    for k, by in sorted(per_sd.items()):
        cells = []
        for s in aa:
            xs = by.get(s.name, [])
            if not xs:
                cells.append("-")
                continue
            raw = [x for x, _, _, _ in xs if x is not None]
            mdes = [m for _, _, m, _ in xs if m is not None]
            cells.append(f"{format(statistics.median(raw), '.1%') if raw else '-'} / "
                         f"{statistics.median(x for _, x, _, _ in xs):.1%} / "
                         f"{'+' + format(statistics.median(mdes), '.1%') if mdes else '-'} / "
                         f"{statistics.median(p for _, _, _, p in xs):g}")
        lines.append(f"| `{k}` | " + " | ".join(cells) + " |")
    lines += ["", "Do a run's pairs replicate it? Per check, the sd of the run means of ln(head/base) over the "
                  "A/A runs, beside what independent pairs would give (the mean within-run variance over the mean "
                  "pairs, square-rooted): a ratio well above 1 is a run-level offset that the pairs of one run "
                  "share and cannot show, so their interval is too narrow for it.", "",
              "| scenario | check | runs | sd of run means | expected from the pairs | ratio |", "|---|---|---|---|---|---|"]
    for s in aa:
        for k, (observed, expected, n) in sorted(_run_level(s.done).items()):
            lines.append(f"| {s.name} | `{k}` | {n} | {observed:.1%} | {expected:.1%} | {observed / expected:.1f} |")
    lines += ["", "Per-check ratios (head/base, one value per run):", ""]
    for s in scenarios:
        per: dict[str, list[str]] = defaultdict(list)
        for r in s.done:
            for k, c in r.get("checks", {}).items():
                if c["ratio"] is not None:
                    mark = {"fail": "!", "inconclusive": "?"}.get(c["outcome"], "")
                    per[k].append(f"{c['ratio']:.3f}{mark}")
        if per:
            lines.append(f"- {s.label()}:")
            lines += [f"  - `{k}`: {', '.join(v)}" for k, v in sorted(per.items())]
    lines += ["", "`!` marks a failing verdict, `?` an inconclusive one. Rates above are counts of runs (any check "
              "failing, or any timing check failing); `failing / inconclusive / timing checks` counts every timing "
              "check of every run."]
    return "\n".join(lines) + "\n"


def _run_level(runs: list[dict]) -> dict[str, tuple[float, float, int]]:
    """Per check with >= 5 runs of >= 2 pairs: (sd of the run means of ln ratio, the sd those means
    would have if pairs were independent replicates, runs)."""
    per: dict[str, list[list[float]]] = defaultdict(list)
    for r in runs:
        for k, c in r.get("checks", {}).items():
            logs = [math.log(x) for x in c.get("pair_ratios") or [] if x and x > 0]
            if len(logs) >= 2:
                per[k].append(logs)
    out = {}
    for k, xs in per.items():
        if len(xs) < 5:
            continue
        expected = math.sqrt(statistics.mean(statistics.variance(x) / len(x) for x in xs))
        if expected > 0:
            out[k] = (statistics.stdev(statistics.mean(x) for x in xs), expected, len(xs))
    return out


def _raw_sd(ratios: list[float]) -> float | None:
    """The sample sd of ln(ratio) over a run's pairs (``None``: fewer than two)."""
    logs = [math.log(x) for x in ratios if x and x > 0]
    return statistics.stdev(logs) if len(logs) >= 2 else None


def platform_line() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} vCPU {model!r}"


def save(out: Path, scenarios: list[Scenario], plain_s: dict[str, float], commands: list[str]) -> None:
    """The table, and the JSON that ``--resume`` reads."""
    out.write_text(table(scenarios, plain_s, "`; `".join(commands)))
    out.with_suffix(".json").write_text(json.dumps(
        {"plain_s": plain_s, "commands": commands, "scenarios": [s.__dict__ for s in scenarios]}, indent=1))


def start_neighbour(clone: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """What `.ci/run` puts beside the timing pairs: the suite's instruction tests under callgrind,
    pinned to every CPU but the last (the one the A/B sides take turns on), over and over."""
    cpus = sorted(os.sched_getaffinity(0))[:-1]
    if not cpus or shutil.which("valgrind") is None:
        raise SystemExit("--neighbour needs valgrind and a second CPU")
    loop = (f"while true; do {sys.executable} -m perfbudget.cli instructions --out .perfbudget/neighbour -- "
            "perf_tests -m instructions -q -p no:cacheprovider -p no:randomly; done")
    return subprocess.Popen(["taskset", "-c", ",".join(map(str, cpus)), "bash", "-c", loop], cwd=clone, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aa", type=int, default=20, help="A/A runs")
    ap.add_argument("--plant", action="append", default=[], metavar="KIND:FRAC:RUNS",
                    help="a planted regression: step:0.10:10 or op:0.10:10")
    ap.add_argument("--suite-aa", type=int, default=0,
                    help="A/A runs of the whole suite sampled to a within-pair precision (--precision 0.01)")
    ap.add_argument("--suite-aa-fixed", type=int, default=0,
                    help="A/A runs of the whole suite with one fixed sample set per check (--precision 0), to "
                         "compare the per-pair sd with --suite-aa's")
    ap.add_argument("--small-aa", type=int, default=0,
                    help="A/A runs of the smallest steps (tiny MLP, decoder serving), where per-process speed "
                         "modes are largest")
    ap.add_argument("--neighbour", action="store_true",
                    help="keep the other CPUs busy as .ci/run does: instruction counts under callgrind, in a loop")
    ap.add_argument("--max-pairs", type=int, default=6)
    ap.add_argument("--minutes", type=float, default=80.0, help="stop starting runs after this long")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "ab-gate-cpu.md")
    ap.add_argument("--resume", type=Path, action="append", default=[], metavar="JSON",
                    help="an earlier run's JSON (repeatable): its runs count toward this run's targets and stay "
                         "in the table")
    args = ap.parse_args()
    command = " ".join(["python benchmarks/ab_gate.py", *sys.argv[1:]])
    scenarios = [Scenario("A/A", "aa", 0.0, args.aa)]
    if args.small_aa:
        scenarios.append(Scenario("A/A small steps", "small-aa", 0.0, args.small_aa))
    if args.suite_aa:
        scenarios.append(Scenario("A/A suite, precision", "suite-aa", 0.0, args.suite_aa, precision=0.01))
    if args.suite_aa_fixed:
        scenarios.append(Scenario("A/A suite, fixed", "suite-aa", 0.0, args.suite_aa_fixed, precision=0.0))
    for spec in args.plant:
        kind, frac, runs = spec.split(":")
        if kind not in ("step", "op"):
            ap.error(f"--plant {spec}: kind must be step or op")
        scenarios.append(Scenario(f"{kind} +{float(frac):.0%}", kind, float(frac), int(runs)))
    tmp = Path(tempfile.mkdtemp(prefix="ab-gate-"))
    clone = tmp / "scratch"
    sh("git", "clone", "-q", str(ROOT), str(clone), cwd=tmp)
    base = sh("git", "rev-parse", "HEAD", cwd=clone).strip()
    env = {**os.environ, "PYTHONPATH": str(clone / "src")}
    plain_s: dict[str, float] = {}
    commands = [f"{command}  (at {base[:12]})"]
    earlier_commands: list[str] = []
    for resumed in args.resume:
        earlier = json.loads(resumed.read_text())
        plain_s.update(earlier.get("plain_s", {}))
        earlier_commands += earlier.get("commands", [])
        for d in earlier["scenarios"]:
            same = next((sc for sc in scenarios if (sc.name, sc.kind, sc.frac, sc.precision)
                         == (d["name"], d["kind"], d["frac"], d.get("precision"))), None)
            if same is None:
                scenarios.append(Scenario(**{**d, "runs": len(d["done"])}))
            else:
                same.done += d["done"]
    commands = [*earlier_commands, *commands]
    for tests in {s.tests for s in scenarios if s.runs and " ".join(s.tests) not in plain_s}:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pytest", *tests, "-q", "-p", "no:cacheprovider"], cwd=clone, env=env,
                       capture_output=True)
        plain_s[" ".join(tests)] = time.perf_counter() - t0
    neighbour = start_neighbour(clone, env) if args.neighbour else None
    commits: dict[tuple[str, float], str] = {}
    deadline = time.monotonic() + args.minutes * 60
    i = 0
    while time.monotonic() < deadline and any(len(s.done) < s.runs for s in scenarios):
        # Interleaved: the scenario furthest from its target (by fraction done) goes next.
        s = min((s for s in scenarios if len(s.done) < s.runs), key=lambda s: len(s.done) / s.runs)
        head = base
        if s.kind not in ("aa", "suite-aa", "small-aa"):
            if (s.kind, s.frac) not in commits:
                commits[(s.kind, s.frac)] = plant(clone, base, s.kind, s.frac)
            head = commits[(s.kind, s.frac)]
        sh("git", "checkout", "-q", "--detach", head, cwd=clone)
        got = ab_run(clone, base, tmp / f"run-{i}.json", args.max_pairs, s.tests, s.precision)
        s.done.append(got)
        i += 1
        print(f"ab-gate: {s.name} run {len(s.done)}/{s.runs}: {got.get('pairs')} pairs, {got['wall_s']:.0f} s, "
              + ", ".join(f"{k.split('.', 1)[1]}={c['outcome']}" for k, c in got["checks"].items()
                          if family(k) in TIMING), flush=True)
        save(args.out, scenarios, plain_s, commands)  # after every run: a run stopped early keeps what it measured
    save(args.out, scenarios, plain_s, commands)
    if neighbour is not None:
        neighbour.kill()
        neighbour.wait()
    shutil.rmtree(tmp, ignore_errors=True)
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
