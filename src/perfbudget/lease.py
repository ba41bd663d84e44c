"""The GPU check's lease plan: which tests ``scripts/gpu-check.sh`` runs on a leased GPU, in what order, how long."""

from __future__ import annotations

# Stdlib only: the script runs this file with any ``python3`` (``python3 src/perfbudget/lease.py plan``).
import math
import sys
from dataclasses import dataclass

__all__ = ["AA_PAIRS", "ASSUMED", "COMPILE", "H200_S", "LEASE_DEVICE_STEPS", "LEASE_GPM_WINDOWS", "LEASE_OCC_ROUNDS", "LEASE_OP_ROUNDS", "LEASE_SERVE_ROUNDS", "LIMIT_S",
           "ORDER", "PARTS", "PROBE_MS", "STEP_MS", "STEP_RATIO", "Part", "Planned", "plan_text", "position", "total_s"]

LIMIT_S = 420
"""Seconds the whole check may take: one command of a lease, leaving >= 4 minutes for a second."""
LEASE_SERVE_ROUNDS = 1
"""Rounds of requests behind a serving sample set under the lease (one round: 128 requests on the GPU)."""
LEASE_OP_ROUNDS = 6
"""Profiled rounds per operator sample set under the lease: the fewest whose 95 % interval of the median lies
between two of them (1 - 2 * 0.5**6 = 0.97); device time varies by 0.1-0.6 %, so more buy little."""
LEASE_OCC_ROUNDS = 3
"""Profiled rounds behind ``sm_occupancy`` under the lease: a median with a round on each side; it is computed
from launch resources and repeated within 0.2 % on the GPU (cv of 5 rounds), so more rounds buy little."""
LEASE_DEVICE_STEPS = 6
"""Profiled steps behind a CUDA ``perf.step``'s ``step_device_ms`` under the lease: as for the operator rounds,
the fewest whose 95 % interval of the median lies between two of them (device time repeated within 0.1 %)."""
LEASE_GPM_WINDOWS = 3
"""NVML GPM windows behind ``gpm_sm_occupancy`` and ``tensor_util`` under the lease: a median with a window on
each side, as for :data:`LEASE_OCC_ROUNDS` (utilisation, not a timing: it read 0.10-0.11 in every pass)."""
AA_PAIRS = 2
"""Process pairs of the A/A (``perfbudget ab --base HEAD``): the fewest that show a spread between pairs."""

#: Wall seconds measured on an H200 (2026-12-04, torch 2.11.0+cu130, ``pytest <node ids>
#: --durations=0``, the first of two passes), at the work of :data:`MEASURED_AT`.
H200_S = {
    "install": 2.0,             # pip install --no-index of this tree
    "pytest start": 9.0,        # start and collection
    "first CUDA fixture": 14.7,  # CUDA's start and the encoder built and warmed (encoder_train set-up)
    "occupancy": 23.0, "gpm": 16.7,
    "serving set-up": 6.8, "serving round": 65.1,
    "encoder step": 3.9, "encoder operators": 50.5, "encoder memory": 2.1, "numerics": 12.2,
    "segmentation set-up": 1.6, "segmentation step": 6.1, "segmentation operators": 17.4, "segmentation memory": 0.7,
    "a/a pair": 151.0,          # the first pair of an A/A of the encoder step and operators, both sides
}
#: The work behind :data:`H200_S` (the encoder's at 64x128 tokens): operator rounds, serving rounds, occupancy
#: rounds, encoder steps in the GPM windows.
MEASURED_AT = {"op rounds": 32, "serve rounds": 1, "occupancy rounds": 5, "gpm steps": 5 * 50}
#: The encoder step on that H200 (benchmarks/gpu-step-probe-h200.md, same day): its wall time per step at
#: 64x128 (as :data:`H200_S` ran it) and the device's busy time per step at 64x512 (fused AdamW), in ms.
PROBE_MS = {"step 64x128": 65.5, "device busy 64x512": 58.7}

#: The suite's constants the estimates are computed for, as they were measured; tests/test_lease_plan.py
#: holds each to the code, so changing one without the plan fails there.
ASSUMED = {
    "OP_ROUND_STEPS": 1,                      # perfbudget.recorder.operators
    "encoder batch": 128,                     # EncoderConfig.for_size("large").batch_size
    "encoder sequence": 512,                  # EncoderConfig.for_size("large").seq_len
    "occupancy rounds": 5,                    # Gpu.occupancy default
    "gpm steps": 10,                          # perf_tests/test_gpu.py: encoder steps a GPM window
    "energy windows": 5,                      # Energy.energy default, each >= 1 s
    "decoder requests": 128,                  # DecoderConfig.for_size("large").n_requests: one serving round
    "energy requests": 8,                     # perf_tests/test_energy.py: requests per energy call
    "speedup rounds": 6,                      # perf_tests/test_levers.py: SPEEDUP_ROUNDS
}


@dataclass(frozen=True, kw_only=True)
class Planned:
    """One step of the plan: a test (its node id) or the work around the tests."""

    what: str
    """The test's node id (``path::name[cuda]``), or what the step is."""
    seconds: float
    """Estimated wall seconds on the H200, set-up included."""
    how: str
    """How the estimate was made: ``measured``, or the arithmetic from measured costs."""
    measured: bool = True
    """False: an estimate of work nobody measured (printed with ``~``)."""

    @property
    def is_test(self) -> bool:
        return "::" in self.what


@dataclass(frozen=True, kw_only=True)
class Part:
    """A part of the check, its steps in the order they run and the share of time over its estimate it may take."""

    name: str
    steps: tuple[Planned, ...]
    margin: float = 1.2
    """Its bound: the estimate times this (cut, in the script, to what is left before the limit)."""
    runs: tuple[str, ...] = ()
    """The tests it runs when its steps are not tests (the A/A's pairs)."""

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.steps)

    @property
    def bound_s(self) -> int:
        return math.ceil(self.seconds * self.margin)

    @property
    def tests(self) -> tuple[str, ...]:
        return self.runs or tuple(s.what for s in self.steps if s.is_test)


def _scaled(what: str, name: str, units: int, measured_units: int, unit: str) -> Planned:
    """A cost measured at ``measured_units`` of work, at ``units`` (an estimate unless they are the same)."""
    if units == measured_units:
        return Planned(what=what, seconds=H200_S[name], how="measured")
    return Planned(what=what, seconds=H200_S[name] * units / measured_units, measured=False,
                   how=f"{H200_S[name]:g} s measured at {measured_units} {unit}, x {units}/{measured_units}")


_B, _L = ASSUMED["encoder batch"], ASSUMED["encoder sequence"]
STEP_MS = PROBE_MS["device busy 64x512"] * _B * _L / (64 * 512)
"""The encoder step's estimated time at :data:`ASSUMED` tokens: the device's work sets it there (busy 81 % of
the step at 64x512), and it grows with the tokens from the 64x512 row."""
STEP_RATIO = STEP_MS / PROBE_MS["step 64x128"]
"""The estimated step time over the one the encoder's costs in :data:`H200_S` were measured at."""
_RATIO_HOW = (f"x {STEP_RATIO:.3f} = {STEP_MS:.1f} ms a step at {_B}x{_L} ({PROBE_MS['device busy 64x512']:g} ms "
              f"device busy at 64x512 x {_B * _L / (64 * 512):g}) / {PROBE_MS['step 64x128']:g} ms at 64x128")


def _encoder(what: str, seconds: float, how: str) -> Planned:
    """An encoder cost of ``seconds`` at 64x128 (``how``: from what), at the step's size now: an estimate."""
    return Planned(what=what, seconds=seconds * STEP_RATIO, measured=False, how=f"{how}, x {STEP_RATIO:.3f}")


#: Seconds a profiled encoder step costs (the operator rounds', at 64x128): host-bound (0.79 s a step exceeds
#: the device's estimated step), so not scaled by :data:`STEP_RATIO`.
_PROFILED_STEP_S = H200_S["encoder operators"] / (MEASURED_AT["op rounds"] * (ASSUMED["OP_ROUND_STEPS"] + 1))
_DEVICE_PASS = f"{LEASE_DEVICE_STEPS + 1} profiled steps x {_PROFILED_STEP_S:.3f} s (the device-time pass)"


_T, _E, _S, _G = "perf_tests/test_encoder.py::", "perf_tests/test_energy.py::", "perf_tests/test_segmentation.py::", \
    "perf_tests/test_gpu.py::"
_START = Planned(what="pytest start and collection", seconds=H200_S["pytest start"], how="measured")
_FIRST = H200_S["first CUDA fixture"]
_ENCODER_OPS = Planned(what=f"{_T}test_operators[cuda]", measured=False,
                       seconds=H200_S["encoder operators"] * LEASE_OP_ROUNDS / MEASURED_AT["op rounds"],
                       how=f"{H200_S['encoder operators']:g} s measured at {MEASURED_AT['op rounds']} rounds x "
                           f"{LEASE_OP_ROUNDS}/{MEASURED_AT['op rounds']}, profiled: host-bound, not scaled")
_ENCODER_STEP = Planned(what=f"{_T}test_step_latency_and_throughput[cuda]", measured=False,
                        seconds=H200_S["encoder step"] * STEP_RATIO + (LEASE_DEVICE_STEPS + 1) * _PROFILED_STEP_S,
                        how=f"{H200_S['encoder step']:g} measured x {STEP_RATIO:.3f} + {_DEVICE_PASS}")
_ENERGY_CALL_S = H200_S["serving round"] * ASSUMED["energy requests"] / ASSUMED["decoder requests"]

_UPDATE = (
    _START,
    Planned(what=f"{_G}test_sm_occupancy_and_kernels[cuda]", measured=False,
            seconds=_FIRST + H200_S["occupancy"] * LEASE_OCC_ROUNDS / MEASURED_AT["occupancy rounds"],
            how=f"{_FIRST:g} first CUDA fixture + {H200_S['occupancy']:g} measured x {LEASE_OCC_ROUNDS}/"
                f"{MEASURED_AT['occupancy rounds']} rounds, profiled: host-bound, not scaled"),
    Planned(what=f"{_G}test_gpm_utilisation[cuda]", measured=False,
            seconds=H200_S["gpm"] * LEASE_GPM_WINDOWS * ASSUMED["gpm steps"] / MEASURED_AT["gpm steps"] * STEP_RATIO,
            how=f"{H200_S['gpm']:g} s measured at {MEASURED_AT['gpm steps']} steps, x "
                f"{LEASE_GPM_WINDOWS * ASSUMED['gpm steps']}/{MEASURED_AT['gpm steps']} x {STEP_RATIO:.3f}"),
    Planned(what=f"{_E}test_energy_per_sample[cuda]", seconds=ASSUMED["energy windows"] * 1.2, measured=False,
            how=f"{ASSUMED['energy windows']} windows of >= 1 s, a step over each"),
    Planned(what=f"{_E}test_energy_per_token[cuda]",
            seconds=H200_S["serving set-up"] + ASSUMED["energy windows"] * _ENERGY_CALL_S, measured=False,
            how=f"{H200_S['serving set-up']:g} decoder set-up + {ASSUMED['energy windows']} windows x "
                f"{ASSUMED['energy requests']}/{ASSUMED['decoder requests']} of a {H200_S['serving round']:g} s round"),
    _scaled("perf_tests/test_decoder.py::test_serving_latency[cuda]", "serving round", LEASE_SERVE_ROUNDS,
            MEASURED_AT["serve rounds"], "round"),
    _ENCODER_STEP,
    _ENCODER_OPS,
    _encoder(f"{_T}test_peak_memory_per_phase[cuda]", H200_S["encoder memory"], f"{H200_S['encoder memory']:g} measured"),
    _encoder(f"{_T}test_numerical_health[cuda]", H200_S["numerics"], f"{H200_S['numerics']:g} measured"),
    Planned(what=f"{_S}test_step_latency_and_throughput[cuda]", measured=False,
            seconds=H200_S["segmentation set-up"] + H200_S["segmentation step"]
            + (LEASE_DEVICE_STEPS + 1) * H200_S["segmentation operators"] / (2 * MEASURED_AT["op rounds"]),
            how=f"{H200_S['segmentation set-up'] + H200_S['segmentation step']:g} measured, set-up included, + "
                f"{LEASE_DEVICE_STEPS + 1} profiled steps at its operator rounds' "
                f"{H200_S['segmentation operators'] / (2 * MEASURED_AT['op rounds']):.3f} s"),
    _scaled(f"{_S}test_operators[cuda]", "segmentation operators", LEASE_OP_ROUNDS, MEASURED_AT["op rounds"],
            "rounds"),
    Planned(what=f"{_S}test_peak_memory_per_phase[cuda]", seconds=H200_S["segmentation memory"], how="measured"),
    Planned(what="perf_tests/test_levers.py::test_bucketing_speedup[cuda]", seconds=8.0, measured=False,
            how=f"an encoder built, {ASSUMED['speedup rounds']} rounds of two epochs of ~3 steps"),
    Planned(what="perf_tests/test_levers.py::test_precision_memory_saving[cuda]", seconds=8.0, measured=False,
            how="4 encoders built, one step each"),
)
_AA_SIDE_S = _ENCODER_STEP.seconds + _ENCODER_OPS.seconds
# Beyond its measuring, the measured pair spent each side's start, collection and encoder set-up one after the
# other; the sides now join at their first test, so one side's first CUDA fixture overlaps the other's.
_AA_PAIR_OVERHEAD_S = H200_S["a/a pair"] - 2 * (H200_S["encoder step"] + H200_S["encoder operators"]) - _FIRST

#: The check's parts in the order the script runs them.
PARTS = (
    Part(name="set-up", steps=(
        Planned(what="pip install", seconds=H200_S["install"], how="measured"),
        Planned(what="probe: torch, CUDA, perfbudget show", seconds=8.0, measured=False,
                how="torch imported, CUDA started, the budgets read"),
    ), margin=1.0),
    # Every GPU metric once, its budget written; no compiling tests (60-90 s would not leave the A/A its time).
    Part(name="update", steps=_UPDATE),
    # What the A/A measures, judged against the budgets just written (the host-bound step's failed minutes after
    # it was written); the margin is for a straddling check's extra rounds.
    Part(name="check", steps=(
        _START,
        Planned(what=_ENCODER_STEP.what, seconds=_FIRST + _ENCODER_STEP.seconds, measured=False,
                how=f"{_FIRST:g} first CUDA fixture + {_ENCODER_STEP.seconds:.1f} as above"),
        _ENCODER_OPS,
    ), margin=1.5),
    Part(name="a/a", steps=(
        Planned(what=f"{AA_PAIRS} pairs of the encoder step and operators",
                seconds=AA_PAIRS * (_AA_PAIR_OVERHEAD_S + 2 * _AA_SIDE_S), measured=False,
                how=f"{AA_PAIRS} x ({_AA_PAIR_OVERHEAD_S:.1f} s a pair beyond its measuring + 2 sides x "
                    f"{_AA_SIDE_S:.1f} s as above), the first from a measured {H200_S['a/a pair']:g} s pair at "
                    f"{MEASURED_AT['op rounds']} rounds less {_FIRST:g} s of set-up now overlapped"),
    ), runs=(f"{_T}test_step_latency_and_throughput[cuda]", _ENCODER_OPS.what)),
    Part(name="finish", steps=(Planned(what="pack and summary", seconds=3.0, measured=False, how="tar and report"),),
         margin=1.0),
)

#: The lease's second command (``scripts/gpu-check.sh --compile OUT``), not in the check: the compiling tests,
#: their budgets written. No GPU run has compiled the encoder yet (the H200's first run failed in the fixture).
COMPILE = Part(name="compile", steps=(
    _START,
    Planned(what="perf_tests/test_compile.py::test_compile_health[cuda]", seconds=_FIRST + 90.0, measured=False,
            how=f"{_FIRST:g} first CUDA fixture + the fixture's cold inductor compile of the encoder, 90 s: a guess "
                "at the upper end of 60-90 s, not measured"),
    Planned(what="perf_tests/test_compile.py::test_compiled_step_without_recompiles[cuda]", seconds=_ENCODER_STEP.seconds, measured=False, how="the compiled step timed as the eager one above"),
))

#: Every planned test in the order the plugin runs them under the lease: the update pass's.
ORDER: tuple[str, ...] = PARTS[1].tests


def total_s() -> float:
    """The plan's estimated seconds, every part."""
    return sum(p.seconds for p in PARTS)


def position(nodeid: str) -> int:
    """A test's index in :data:`ORDER` (a ``[cpu]`` variant at its ``[cuda]`` one's), after all when unplanned."""
    cuda = nodeid[: -len("[cpu]")] + "[cuda]" if nodeid.endswith("[cpu]") else nodeid
    return ORDER.index(cuda) if cuda in ORDER else len(ORDER)


def plan_text() -> str:
    """The plan as ``scripts/gpu-check.sh --plan`` prints it, ending ``total N s`` (and any excess over the limit)."""
    lines = [f"The GPU check on an H200 under the lease (perfbudget_lease = true): tests in the order they "
             f"run, estimated seconds ('~': not measured; the others scale costs measured there); limit {LIMIT_S} s",
             f"encoder costs measured at 64x128 scale by the step ratio: ~{_RATIO_HOW}"]
    for part in PARTS:
        lines.append(f"{part.name:<8} {part.seconds:6.0f} s   bound {part.bound_s} s")
        lines += [f"  {'~' if not s.measured else ' '}{s.seconds:6.1f}  {s.what}  ({s.how})" for s in part.steps]
    lines.append(f"second command (scripts/gpu-check.sh --compile OUT): {COMPILE.seconds:.0f} s, bound {COMPILE.bound_s} s")
    lines += [f"  ~{s.seconds:6.1f}  {s.what}  ({s.how})" for s in COMPILE.steps if s.is_test]
    over = round(total_s()) - LIMIT_S
    lines.append(f"total {total_s():.0f} s" + (f": {over} s over the limit" if over > 0 else ""))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """``plan``; ``tests PART``: one a line; ``bound PART``: seconds; ``tsv``: part, step, seconds a line;
    ``limit``: :data:`LIMIT_S`; ``pairs``: :data:`AA_PAIRS`."""
    parts = {p.name: p for p in (*PARTS, COMPILE)}
    if argv == ["plan"]:
        print(plan_text())
    elif len(argv) == 2 and argv[0] in ("tests", "bound") and argv[1] in parts:
        print("\n".join(parts[argv[1]].tests) if argv[0] == "tests" else parts[argv[1]].bound_s)
    elif argv == ["tsv"]:
        print("\n".join(f"{p.name}\t{s.what}\t{s.seconds:.1f}" for p in (*PARTS, COMPILE) for s in p.steps))
    elif argv in (["limit"], ["pairs"]):
        print(LIMIT_S if argv == ["limit"] else AA_PAIRS)
    else:
        print(f"usage: lease.py plan | tests PART | bound PART | tsv | limit | pairs (PART: {', '.join(parts)})",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
