"""Per-operator attribution of a step from torch.profiler: time, calls, shapes, FLOPs, roofline, diffs."""

from perfbudget.measure.operators.fields import read_event_field
from perfbudget.measure.operators.flops import FlopCount, attention_flops, count_flops
from perfbudget.measure.operators.profiling import (
    OpRounds,
    profile_rounds,
    profile_steps,
    trace_steps,
)
from perfbudget.measure.operators.roofline import (
    DATASHEET_PEAKS,
    DevicePeaks,
    Roofline,
    datasheet_peaks,
    measure_cpu_peaks,
)
from perfbudget.measure.operators.table import (
    OP_METRIC_FAMILIES,
    OpChange,
    OpDiff,
    OpMove,
    OpRow,
    OpTable,
    moved_operators,
    op_metric,
    table_from_events,
)

__all__ = [
    "DATASHEET_PEAKS",
    "OP_METRIC_FAMILIES",
    "DevicePeaks",
    "FlopCount",
    "OpChange",
    "OpDiff",
    "OpMove",
    "OpRounds",
    "OpRow",
    "OpTable",
    "Roofline",
    "attention_flops",
    "count_flops",
    "datasheet_peaks",
    "measure_cpu_peaks",
    "moved_operators",
    "op_metric",
    "profile_rounds",
    "profile_steps",
    "read_event_field",
    "table_from_events",
    "trace_steps",
]
