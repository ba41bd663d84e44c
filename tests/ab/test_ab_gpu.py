"""``perfbudget ab`` on a GPU machine, on constructed pairs: the sides' GPU clocks, the GPU's noise prior, the CPUs."""

from __future__ import annotations

from pathlib import Path

from perfbudget.ab.merge import PairRecords, clock_refusal, compare_pairs
from perfbudget.ab.pairs import HALVES, parse_cpus, placement
from perfbudget.ab.run import ABConfig, _say_noise, _with_noise, default_cpus
from perfbudget.budgets.loader import BudgetSet
from perfbudget.budgets.noise import CheckNoise, NoiseTable
from perfbudget.device import DeviceInfo
from perfbudget.measure.nvml import GpuClocks
from perfbudget.results import Record, Results

H200 = DeviceInfo(type="cuda", model="NVIDIA H200", count=1, compute_capability="9.0", isa_class="sm90",
                  memory_gib=140, sm_clock_mhz=1980, cpuid="6/207/2", cpu_model="Intel Xeon")
HOST = DeviceInfo(type="cpu", model="Intel Xeon", count=16, threads=1, cpuid="6/207/2", isa_class="amx")
GPU_ID, CPU_ID = "nvidia-h200-sm90-140gib-1980mhz", "cpu-intel-xeon-6-207-2-amx"


def clocks(sm_median: float, sm_mean: float | None = None, busy: int = 400) -> GpuClocks:
    return GpuClocks(busy=busy, idle=20, sm_median_mhz=sm_median, sm_mean_mhz=sm_mean or sm_median,
                     mem_median_mhz=3201.0, mem_mean_mhz=3201.0)


def record(device: DeviceInfo, key: str, scale: float) -> Record:
    xs = tuple(scale * x for x in (50.0, 50.5, 49.8, 50.2, 50.1))
    return Record(nodeid=f"t.py::test_{key}", key=key, metric="step_ms", outcome="unbudgeted", value=50.0,  # type: ignore[arg-type]
                  samples=xs, n=len(xs), unit="ms", kind="timing", direction="lower", device=device)


def pair(index: int, sides: dict[str, GpuClocks] | None = None, head_scale: float = 1.0) -> PairRecords:
    head = Results(records=[record(H200, "gpu", head_scale), record(HOST, "cpu", head_scale)])
    base = Results(records=[record(H200, "gpu", 1.0), record(HOST, "cpu", 1.0)])
    return PairRecords(head=head, base=base, index=index, clocks=sides or {})


def test_sides_clocks_apart_by_more_than_one_percent_refuse_the_verdict_median_and_mean() -> None:
    median = clock_refusal({"base": clocks(1980), "head": clocks(1950)})  # -1.5 % on the median
    assert "differ by -1.52% (median; limit 1%)" in median
    assert "base SM median 1980 / mean 1980.0 MHz" in median and "head SM median 1950 / mean 1950.0 MHz" in median
    # Medians equal, the mean moved: an excursion the median hides.
    mean = clock_refusal({"base": clocks(1980, 1978), "head": clocks(1980, 1950)})
    assert "(mean; limit 1%)" in mean and "mean 1950.0 MHz" in mean
    assert clock_refusal({"base": clocks(1980, 1975), "head": clocks(1965, 1960)}) == ""  # within 1 %


def test_no_nvml_means_no_clock_check_and_nothing_refused() -> None:
    assert clock_refusal({}) == ""
    assert clock_refusal({"base": GpuClocks(busy=0, idle=30), "head": GpuClocks(busy=0, idle=31)}) == ""
    # NVML sampled but could not say whether the GPU worked: refused, not taken for "no GPU work".
    unread = clock_refusal({"base": GpuClocks(busy=0, unknown=30), "head": GpuClocks(busy=0, unknown=31)})
    assert "clock-event reasons could not be read" in unread and "head no busy sample (0 idle, 31 of unknown state)" in unread
    assert "of one side are unknown" in clock_refusal({"base": clocks(1980), "head": GpuClocks(busy=0, idle=9)})
    # Busy samples that read no clock (0 MHz): refused, naming them, never a crash of the run.
    zero = GpuClocks(busy=5, sm_median_mhz=0.0, sm_mean_mhz=0.0)
    assert "cannot be compared" in clock_refusal({"base": zero, "head": zero})
    (gpu, cpu) = compare_pairs([pair(1), pair(2)], budgets=BudgetSet(root=Path("budgets")), final=True).records
    assert gpu.vs_base is not None and gpu.vs_base.pairs == 2 and cpu.vs_base is not None


def test_a_gpu_timing_check_is_not_judged_on_pairs_whose_clocks_differ() -> None:
    apart = {"base": clocks(1980), "head": clocks(1900)}
    together = {"base": clocks(1980), "head": clocks(1975)}
    budgets = BudgetSet(root=Path("budgets"))
    running = compare_pairs([pair(1, apart, head_scale=1.2)], budgets=budgets, final=False, min_pairs=2)
    assert ("t.py::test_gpu", "gpu", "step_ms") in running.undecided  # another pair may run at matching clocks
    gpu, cpu = compare_pairs([pair(1, apart, head_scale=1.2), pair(2, apart, head_scale=1.2)], budgets=budgets,
                             final=True).records
    assert gpu.outcome == "not_judged" and gpu.base is not None and not gpu.base.compared
    assert gpu.reason.startswith("not judged: pair 1: the sides' GPU SM clocks differ by -4.04% (median")
    assert "base SM median 1980" in gpu.reason and "head SM median 1900" in gpu.reason
    assert cpu.outcome == "fail"  # the host's check of the same pairs is judged: the GPU's clock is not its
    gpu, _ = compare_pairs([pair(1, apart), pair(2, together), pair(3, together)], budgets=budgets,
                           final=True).records
    assert gpu.vs_base is not None and gpu.vs_base.pairs == 2 and gpu.outcome == "pass"
    assert "not compared in pair 1 (the sides' GPU SM clocks differ" in gpu.reason


def table(identity: str, sd: float, burst_ms: float = 100.0) -> NoiseTable:
    return NoiseTable(identity=identity, checks={("gpu", "step_ms"): CheckNoise(ss=sd * sd * 4, df=4, runs=1),
                                                 ("cpu", "step_ms"): CheckNoise(ss=sd * sd * 4, df=4, runs=1)},
                      provenance=({"file": "aa.json", "burst_ms": burst_ms},))


def test_a_cuda_check_looks_up_the_noise_prior_of_its_gpu_not_the_host_cpu(tmp_path: Path) -> None:
    budgets = tmp_path / "budgets"
    table(GPU_ID, 0.004).write(budgets)
    table(CPU_ID, 0.03).write(budgets)
    said: list[str] = []
    policy = _with_noise(ABConfig(root=tmp_path, base="HEAD"), budgets, said.append, burst_ms=100.0)
    assert set(policy.noise) == {GPU_ID, CPU_ID} and said == []
    gpu, cpu = compare_pairs([pair(1), pair(2)], budgets=BudgetSet(root=budgets), policy=policy, final=True).records
    assert gpu.base is not None and gpu.base.prior == f"measured: {policy.noise[GPU_ID].where}, 4 df"
    assert GPU_ID in gpu.base.prior and cpu.base is not None and CPU_ID in cpu.base.prior
    head = pair(1).head
    assert head is not None
    _say_noise(policy, head, said.append, pairs=2)
    assert any(GPU_ID in line and "measured noise for this machine" in line for line in said), said
    # Noise measured in turns of another length is set aside whatever its device, and said.
    said.clear()
    table(GPU_ID, 0.004, burst_ms=400.0).write(budgets)
    policy = _with_noise(ABConfig(root=tmp_path, base="HEAD"), budgets, said.append, burst_ms=100.0)
    assert set(policy.noise) == {CPU_ID} and f"noise of {GPU_ID}" in said[0] and "400 ms" in said[0]
    _say_noise(policy, head, said.append, pairs=2)
    assert any(f"no measured noise for {GPU_ID} in turns of this length" in line for line in said), said


def test_on_a_gpu_machine_each_side_has_its_own_half_of_the_cpus_swapped_every_pair() -> None:
    assert default_cpus(gpus=1) == HALVES and default_cpus(gpus=0) != HALVES and default_cpus(gpus=1, instructions=True) == ()
    odd, even = placement(HALVES, 1, allowed=range(16)), placement(HALVES, 2, allowed=range(16))
    assert odd == {"base": (1, 2, 3, 4, 5, 6, 7), "head": (8, 9, 10, 11, 12, 13, 14)}
    assert even == {"base": odd["head"], "head": odd["base"]} and not set(odd["base"]) & set(odd["head"])
    assert placement(HALVES, 1, allowed=[0, 1]) == {"base": (0,), "head": (1,)}
    assert placement((3,), 2) == {"base": (3,), "head": (3,)} and placement((), 1) == {"base": (), "head": ()}
    assert parse_cpus("halves") == HALVES



def test_the_summary_names_each_pairs_gpu_clocks_and_a_refusal() -> None:
    from perfbudget.ab.cli import summary
    from perfbudget.ab.merge import Comparison
    from perfbudget.ab.run import ABRun
    from perfbudget.results import ABRunInfo, PairClocks, RunInfo

    apart = {"base": clocks(1980), "head": clocks(1900)}
    meta = RunInfo(ab=ABRunInfo(clocks=(PairClocks(pair=1, **apart, refused=clock_refusal(apart)),)))
    run = ABRun(results=Results(meta=meta), path=Path("results.json"), exit_code=0,  # type: ignore[arg-type]
                comparison=Comparison(records=[]), pairs=())
    line = summary(run).splitlines()[1]
    assert line.startswith("pair 1 GPU clocks: base SM median 1980 / mean 1980.0 MHz, memory 3201 MHz (400 busy")
    assert "GPU timing not compared (the sides' GPU SM clocks differ by -4.04%" in line
