"""Lockstep A/B against a base commit: both sides measured in one job, taking turns on one machine.

``perfbudget ab --base REF [-- pytest args]`` (``ab.cli``) checks the base out as a git
worktree (``ab.trees``), runs the base and the head as two pytest processes that take
turns through a coordinator (``ab.coordinator``, ``ab.pairs``; the client is
``perfbudget.measure.turns``), in process pairs until every timing check is decided or
inconclusive, later pairs re-running only the undecided tests and pairs that lost
turn-taking not used (``ab.run``), and merges the pairs into one record per check
(``ab.merge``) with the verdict on head/base (``ab.ratios``). Never imports pytest:
the sides are subprocesses.
"""

from .coordinator import Coordinator, Turn, TurnLog
from .merge import Comparison, PairRecords, compare_pairs
from .pairs import PairRun, SideCommand, SideRun, SideSetup, pytest_command, run_pair, select_tests
from .ratios import (
    ABPolicy,
    RatioVerdict,
    describe_change,
    detectable_effect,
    judge_ratios,
    pair_ratio,
    t_quantile,
)
from .run import ABConfig, ABRun, UsageError, run_ab
from .trees import BaseTree, GitError, build_shim, instrument_dir, prepare_base, side_env

__all__ = [
    "ABConfig",
    "ABPolicy",
    "ABRun",
    "BaseTree",
    "Comparison",
    "Coordinator",
    "GitError",
    "PairRecords",
    "PairRun",
    "RatioVerdict",
    "SideCommand",
    "SideRun",
    "SideSetup",
    "Turn",
    "TurnLog",
    "UsageError",
    "build_shim",
    "compare_pairs",
    "describe_change",
    "detectable_effect",
    "instrument_dir",
    "judge_ratios",
    "pair_ratio",
    "prepare_base",
    "pytest_command",
    "run_ab",
    "run_pair",
    "select_tests",
    "side_env",
    "t_quantile",
]
