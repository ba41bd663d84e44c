"""Replay the A/B verdicts of merged results files through the decision rule of the code on ``PYTHONPATH``.

Each statistical check compared with its base keeps its per-pair head/base ratios, tolerance, per-pair
prior and confidence (``record.base``); this script judges those same ratios again, as the last pair
of the run did (``final``), and prints one line per check: ``file key.metric recorded-outcome replayed``.
Run it once with the old source and once with the new to see that a change of the code that decides
leaves the verdicts of the same pairs as they were (or which ones it moves)::

    PYTHONPATH=/path/to/old/src python benchmarks/rule_replay.py RESULTS.json... > old.txt
    PYTHONPATH=src python benchmarks/rule_replay.py RESULTS.json... > new.txt
    diff old.txt new.txt
"""

from __future__ import annotations

import sys
from pathlib import Path

from perfbudget.ab.ratios import PRIOR_SD

try:
    from perfbudget.verdict.ratio import PRIOR_DF, judge_ratios
except ImportError:  # a source from before the verdict package
    from perfbudget.ab.ratios import PRIOR_DF, judge_ratios  # type: ignore[attr-defined,no-redef]
from perfbudget.metrics import UnknownMetricError, parse_name
from perfbudget.results import load_results


def main(paths: list[str]) -> int:
    for path in paths:
        for r in load_results(Path(path)).records:
            vs = r.base
            try:
                info = parse_name(r.metric).metric
            except UnknownMetricError:
                continue
            if vs is None or not vs.pair_ratios or not info.statistical or vs.tolerance is None:
                continue
            if vs.prior.startswith("measured"):
                continue  # the measured prior's own sd is not kept in the record
            rv = judge_ratios(vs.pair_ratios, tolerance=vs.tolerance, direction=info.direction,
                              prior_sd=PRIOR_SD.get(info.kind, PRIOR_SD["energy"]), prior_df=PRIOR_DF,
                              confidence=vs.confidence or 0.95, final=True)
            print(f"{Path(path).name} {r.key}.{r.metric} {r.outcome} {rv.state} {rv.ratio:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
