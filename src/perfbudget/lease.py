"""The GPU check's lease plan: which tests ``scripts/gpu-check.sh`` runs on a lent GPU, in what order, for how long.

A lease is 15 minutes of device time, the machine's start (1-2 minutes) included, at most 10 minutes a
command. The check (set-up, update pass, check pass, A/A) is planned to end within :data:`LIMIT_S`, so
that a lease keeps at least 4 minutes for a second command. Its work is lease-sized when the run's
``perfbudget_lease`` setting is on: :data:`LEASE_SERVE_ROUNDS` serving rounds, :data:`LEASE_OP_ROUNDS`
profiled operator rounds, :data:`AA_PAIRS` A/A pairs; and the plugin runs the tests in :data:`ORDER`.

Each estimate is a cost measured on the lent H200 (:data:`H200_S`), scaled by the work this plan runs
instead of the work measured; what was not measured is an estimate and says so. Stdlib only: the
script runs this file with any ``python3`` (``python3 src/perfbudget/lease.py plan``).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

__all__ = ["AA_PAIRS", "ASSUMED", "H200_S", "LEASE_OP_ROUNDS", "LEASE_SERVE_ROUNDS", "LIMIT_S", "ORDER", "PARTS",
           "Part", "Planned", "plan_text", "position", "total_s"]

LIMIT_S = 420
"""Seconds the whole check may take: one command of a lease, leaving >= 4 minutes for a second."""
LEASE_SERVE_ROUNDS = 1
"""Rounds of requests behind a serving sample set under the lease (one round: 128 requests on the GPU)."""
LEASE_OP_ROUNDS = 6
"""Profiled rounds behind a per-operator sample set under the lease: the fewest whose distribution-free
95 % interval of the median lies between two of them (1 - 2 * 0.5**6 = 0.97); per-operator device time
varies by 0.1-0.6 % on the GPU, so more rounds buy little there."""
AA_PAIRS = 2
"""Process pairs of the A/A (``perfbudget ab --base HEAD``): the fewest that show a spread between pairs."""

#: Wall seconds measured on the lent H200 (2026-12-04, torch 2.11.0+cu130, ``pytest <node ids>
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
#: The work behind :data:`H200_S`: operator rounds, serving rounds.
MEASURED_AT = {"op rounds": 32, "serve rounds": 1}

#: The suite's constants the estimates are computed for, as they were measured; tests/test_lease_plan.py
#: holds each to the code, so changing one without the plan fails there.
ASSUMED = {
    "OP_ROUND_STEPS": 1,                      # perfbudget.recorder.operators
    "occupancy rounds": 5,                    # Gpu.occupancy default
    "gpm windows": 5,                         # Gpu.gpm default
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


def _ops(what: str, name: str) -> Planned:
    return _scaled(what, f"{name} operators", LEASE_OP_ROUNDS, MEASURED_AT["op rounds"], "rounds")


_T, _E, _S, _G = "perf_tests/test_encoder.py::", "perf_tests/test_energy.py::", "perf_tests/test_segmentation.py::", \
    "perf_tests/test_gpu.py::"
_START = Planned(what="pytest start and collection", seconds=H200_S["pytest start"], how="measured")
_FIRST = H200_S["first CUDA fixture"]
_ENCODER_OPS = _ops(f"{_T}test_operators[cuda]", "encoder")
_ENERGY_CALL_S = H200_S["serving round"] * ASSUMED["energy requests"] / ASSUMED["decoder requests"]

_UPDATE = (
    _START,
    Planned(what=f"{_G}test_sm_occupancy_and_kernels[cuda]", seconds=_FIRST + H200_S["occupancy"],
            how=f"measured: {_FIRST:g} first CUDA fixture + {H200_S['occupancy']:g}"),
    Planned(what=f"{_G}test_gpm_utilisation[cuda]", seconds=H200_S["gpm"], how="measured"),
    Planned(what=f"{_E}test_energy_per_sample[cuda]", seconds=ASSUMED["energy windows"] * 1.2, measured=False,
            how=f"{ASSUMED['energy windows']} windows of >= 1 s, a step over each"),
    Planned(what=f"{_E}test_energy_per_token[cuda]",
            seconds=H200_S["serving set-up"] + ASSUMED["energy windows"] * _ENERGY_CALL_S, measured=False,
            how=f"{H200_S['serving set-up']:g} decoder set-up + {ASSUMED['energy windows']} windows x "
                f"{ASSUMED['energy requests']}/{ASSUMED['decoder requests']} of a {H200_S['serving round']:g} s round"),
    _scaled("perf_tests/test_decoder.py::test_serving_latency[cuda]", "serving round", LEASE_SERVE_ROUNDS,
            MEASURED_AT["serve rounds"], "round"),
    Planned(what=f"{_T}test_step_latency_and_throughput[cuda]", seconds=H200_S["encoder step"], how="measured"),
    _ENCODER_OPS,
    Planned(what=f"{_T}test_peak_memory_per_phase[cuda]", seconds=H200_S["encoder memory"], how="measured"),
    Planned(what=f"{_T}test_numerical_health[cuda]", seconds=H200_S["numerics"], how="measured"),
    Planned(what=f"{_S}test_step_latency_and_throughput[cuda]",
            seconds=H200_S["segmentation set-up"] + H200_S["segmentation step"], how="measured, set-up included"),
    _ops(f"{_S}test_operators[cuda]", "segmentation"),
    Planned(what=f"{_S}test_peak_memory_per_phase[cuda]", seconds=H200_S["segmentation memory"], how="measured"),
    Planned(what="perf_tests/test_levers.py::test_bucketing_speedup[cuda]", seconds=8.0, measured=False,
            how=f"an encoder built, {ASSUMED['speedup rounds']} rounds of two epochs of ~3 steps"),
    Planned(what="perf_tests/test_levers.py::test_precision_memory_saving[cuda]", seconds=8.0, measured=False,
            how="4 encoders built, one step each"),
)
_AA_SIDE_S = H200_S["encoder step"] + _ENCODER_OPS.seconds
_AA_PAIR_OVERHEAD_S = H200_S["a/a pair"] - 2 * (H200_S["encoder step"] + H200_S["encoder operators"])

#: The check's parts in the order the script runs them.
PARTS = (
    Part(name="set-up", steps=(
        Planned(what="pip install", seconds=H200_S["install"], how="measured"),
        Planned(what="probe: torch, CUDA, perfbudget show", seconds=8.0, measured=False,
                how="torch imported, CUDA started, the budgets read"),
    ), margin=1.0),
    # Every GPU metric once, its budget written: compiling tests are not planned (a cold inductor
    # compile of the encoder, an estimated 60-90 s, would not leave the A/A its time).
    Part(name="update", steps=_UPDATE),
    # What the A/A measures too, judged against the budgets just written: the encoder's host-bound
    # step (its budget failed on the same machine minutes after it was written) and its operators'
    # device time. Extra rounds of a straddling check are what the margin is for.
    Part(name="check", steps=(
        _START,
        Planned(what=f"{_T}test_step_latency_and_throughput[cuda]", seconds=_FIRST + H200_S["encoder step"],
                how=f"measured: {_FIRST:g} first CUDA fixture + {H200_S['encoder step']:g}"),
        _ENCODER_OPS,
    ), margin=1.5),
    Part(name="a/a", steps=(
        Planned(what=f"{AA_PAIRS} pairs of the encoder step and operators",
                seconds=AA_PAIRS * (_AA_PAIR_OVERHEAD_S + 2 * _AA_SIDE_S), measured=False,
                how=f"{AA_PAIRS} x ({_AA_PAIR_OVERHEAD_S:.1f} s a pair beyond its measuring + 2 sides x "
                    f"{_AA_SIDE_S:.1f} s), from a measured {H200_S['a/a pair']:g} s pair at "
                    f"{MEASURED_AT['op rounds']} rounds"),
    ), runs=(f"{_T}test_step_latency_and_throughput[cuda]", _ENCODER_OPS.what)),
    Part(name="finish", steps=(Planned(what="pack and summary", seconds=3.0, measured=False, how="tar and report"),),
         margin=1.0),
)

#: Every planned test in the order the plugin runs them under the lease: the update pass's.
ORDER: tuple[str, ...] = PARTS[1].tests


def total_s() -> float:
    """The plan's estimated seconds, every part."""
    return sum(p.seconds for p in PARTS)


def position(nodeid: str) -> int:
    """Where a test runs under the lease: its index in :data:`ORDER` (a ``[cpu]`` variant where its
    ``[cuda]`` one is), after every planned test when unplanned."""
    cuda = nodeid[: -len("[cpu]")] + "[cuda]" if nodeid.endswith("[cpu]") else nodeid
    return ORDER.index(cuda) if cuda in ORDER else len(ORDER)


def plan_text() -> str:
    """The plan as ``scripts/gpu-check.sh --plan`` prints it, ending ``total N s``."""
    lines = [f"The GPU check on the lent H200 under the lease (perfbudget_lease = true): tests in the order they "
             f"run, estimated seconds ('~': not measured; the others scale costs measured there); limit {LIMIT_S} s"]
    for part in PARTS:
        lines.append(f"{part.name:<8} {part.seconds:6.0f} s   bound {part.bound_s} s")
        lines += [f"  {'~' if not s.measured else ' '}{s.seconds:6.1f}  {s.what}  ({s.how})" for s in part.steps]
    lines.append(f"total {total_s():.0f} s")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """``plan``: the plan; ``tests PART``: its tests, one a line; ``bound PART``: its bound in seconds;
    ``tsv``: part, step and seconds a line, for the summary; ``limit``: :data:`LIMIT_S`; ``pairs``:
    :data:`AA_PAIRS`."""
    parts = {p.name: p for p in PARTS}
    if argv == ["plan"]:
        print(plan_text())
    elif len(argv) == 2 and argv[0] in ("tests", "bound") and argv[1] in parts:
        print("\n".join(parts[argv[1]].tests) if argv[0] == "tests" else parts[argv[1]].bound_s)
    elif argv == ["tsv"]:
        print("\n".join(f"{p.name}\t{s.what}\t{s.seconds:.1f}" for p in PARTS for s in p.steps))
    elif argv in (["limit"], ["pairs"]):
        print(LIMIT_S if argv == ["limit"] else AA_PAIRS)
    else:
        print(f"usage: lease.py plan | tests PART | bound PART | tsv | limit | pairs (PART: {', '.join(parts)})",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
