"""Per-run state of the pytest plugin: options, budgets loaded once, devices, records, finishing, locks."""

from __future__ import annotations

import contextlib
import difflib
import platform
import shlex
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path

import pytest

from .artifacts import ArtifactConfig, parse_kinds
from .budgets.loader import BudgetSet, load_dir
from .budgets.update import UpdateReport, apply_updates, check_commit, provenance_commit
from .device import DeviceInfo, DeviceType
from .fileio import atomic_write, lock
from .measure import allocator
from .measure.instructions import running_under_valgrind
from .measure.machine import describe
from .metrics import lookup
from .results import BudgetRef, HowMeasured, Record, Results, RunInfo
from .settings import Settings, run_spec
from .verdict.judge import Judging, judging_for, stable_identity
from .vocabulary import Outcome

__all__ = ["PerfSession", "add_options", "settings_of"]

#: The settings an ini key may set (:class:`perfbudget.settings.Settings`).
_INI_FIELDS = tuple(f for f in fields(Settings) if f.metadata.get("ini"))
#: The settings that shape a measurement: an A/B run compares sides only where these agree.
_MEASURING_SETTINGS = ("threads", "burst_ms", "lease")


def add_options(parser: pytest.Parser) -> None:
    """The plugin's command-line options and ini keys (few flags: knobs live in ini and budgets)."""
    group = parser.getgroup("perfbudget", "performance budgets")
    group.addoption("--budgets-dir", default=None, metavar="DIR",
                    help="folder of budget YAML files (default: ini perfbudget_budgets_dir, 'budgets').")
    group.addoption("--perf-strict", action="store_true", default=False,
                    help="fail on stale budgets, unbudgeted, not-judged and not-measured checks.")
    group.addoption("--update-budgets", action="store_true", default=False,
                    help="write measured values into the budget files (tighten only) and print the diff.")
    group.addoption("--allow-loosen", action="store_true", default=False,
                    help="with --update-budgets, also write values worse than the current budget.")
    group.addoption("--perf-commit", default=None, metavar="SHA",
                    help="with --update-budgets, the commit measured, recorded in provenance in place of "
                         "git's answer: for a tree copied to a machine without its .git.")
    group.addoption("--perf-json", default=None, metavar="PATH",
                    help="write results JSON here (default: .perfbudget/results.json under the rootdir).")
    group.addoption("--perf-collect", action="store_true", default=False,
                    help="one side of a lockstep A/B run (perfbudget ab): record samples, fixed sample "
                         "sets, timing never fails a test; the A/B driver judges.")
    for f in _INI_FIELDS:
        if isinstance(f.default, bool):
            parser.addini(f.metadata["ini"], f.metadata["help"], type="bool", default=f.default)
        else:
            parser.addini(f.metadata["ini"], f.metadata["help"], default=str(f.default))


_SETTINGS = pytest.StashKey[Settings]()
_ALLOCATOR = pytest.StashKey[str]()


def _resolve(config: pytest.Config, cli: dict[str, object] | None = None) -> Settings:
    """:meth:`Settings.resolve` over ``cli`` and the ini file; a bad value is a usage error naming its source."""
    ini = {f.metadata["ini"]: config.getini(f.metadata["ini"]) for f in _INI_FIELDS}
    try:
        return Settings.resolve(cli=cli, ini=ini, ini_file=str(config.inipath or "ini"), root=Path(str(config.rootpath)))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def settle_allocator(config: pytest.Config) -> str:
    """Settle the process's allocator once, before the conftests import torch; returns what is in effect."""
    if _ALLOCATOR not in config.stash:
        # The command line is not parsed yet: the allocator has no option of its own.
        config.stash[_ALLOCATOR] = allocator.settle(_resolve(config).allocator)
    return config.stash[_ALLOCATOR]


def settings_of(config: pytest.Config) -> Settings:
    """The run's settings from its command line, environment and ini file, resolved once per run."""
    if _SETTINGS not in config.stash:
        config.stash[_SETTINGS] = _resolve(config, {"budgets_dir": config.getoption("--budgets-dir"),
                                                    "strict": config.getoption("--perf-strict") or None})
    return config.stash[_SETTINGS]


@dataclass
class PerfSession:
    """Per-session state: options, budgets (loaded once), devices, collected records."""

    rootdir: Path
    settings: Settings
    """Budgets folder, threads, load limit, stable machine, reports: resolved once (:func:`settings_of`)."""
    judging: Judging
    """The run's way of judging (stored budgets, budget update, one side of an A/B run), chosen once."""
    allow_loosen: bool
    json_path: Path
    is_worker: bool
    budgets_dir_arg: str | None = None
    artifacts: ArtifactConfig = field(default_factory=ArtifactConfig)
    commit: str | None = None
    """The commit passed with ``--perf-commit``, for provenance where the tree has no git."""
    pinned_gpu: str | None = None
    records: list[Record] = field(default_factory=list)
    errors: list[dict[str, str]] = field(default_factory=list)
    known_keys: set[str] | None = None
    """Budget keys of every collected perf test, deselected ones included; ``None`` unless whole folders were run."""
    update_report: UpdateReport | None = None
    allocator: str = "as-is"
    """The allocator as the session found or settled it (:func:`settle_allocator`)."""
    _budgets: BudgetSet | None = None
    _devices: dict[str, DeviceInfo] = field(default_factory=dict)
    _checkpointed: int = 0
    """Records and errors in the file :meth:`checkpoint` last wrote."""

    @classmethod
    def from_config(cls, config: pytest.Config) -> PerfSession:
        """With :func:`settings_of`, the only place that reads ``pytest.Config``."""
        root = Path(str(config.rootpath))
        settings = settings_of(config)
        json_arg = config.getoption("--perf-json")
        try:
            kinds = parse_kinds(settings.artifacts)
        except ValueError as exc:
            raise pytest.UsageError(f"ini perfbudget_artifacts: {exc}") from None
        try:
            judging = judging_for(collect=bool(config.getoption("--perf-collect")),
                                  update=bool(config.getoption("--update-budgets")), spec=run_spec())
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
        commit = config.getoption("--perf-commit") or None
        try:
            commit = None if commit is None else check_commit(str(commit))
        except ValueError as exc:
            raise pytest.UsageError(f"--perf-commit: {exc}") from None
        return cls(
            rootdir=root,
            settings=settings,
            judging=judging,
            allow_loosen=bool(config.getoption("--allow-loosen")),
            json_path=Path(json_arg) if json_arg else root / ".perfbudget" / "results.json",
            is_worker=hasattr(config, "workerinput"),
            commit=commit,
            budgets_dir_arg=config.getoption("--budgets-dir"),
            artifacts=ArtifactConfig(kinds=kinds, threads=settings.threads),
            allocator=settle_allocator(config),
        )

    @property
    def budgets(self) -> BudgetSet:
        if self._budgets is None:
            self._budgets = load_dir(self.settings.budgets_dir)
        return self._budgets

    def device(self, type: DeviceType) -> DeviceInfo:
        if type not in self._devices:
            self._devices[type] = describe(type, threads=self.settings.threads if type == "cpu" else None)
        return self._devices[type]

    def stable_identity(self, type: DeviceType) -> str | None:
        """This device's identity when the machine is declared stable, else ``None``.

        Raises:
            ValueError: the declaration names another identity.
        """
        return stable_identity(self.settings.stable_machine, self.device(type))

    @property
    def counts_instructions(self) -> bool:
        """Whether this session runs under callgrind: a test marked ``instructions`` counts its step, not times it."""
        return running_under_valgrind()

    def update_command(self, nodeid: str) -> str:
        cmd = ["pytest", nodeid, "--update-budgets"]
        if self.budgets_dir_arg:
            cmd += ["--budgets-dir", self.budgets_dir_arg]
        return shlex.join(cmd)

    @contextlib.contextmanager
    def exclusive(self, gpu: str | None = None) -> Iterator[None]:
        """Hold the run-wide timing lock: perf tests never overlap, even across xdist workers.

        A GPU test holds it shared and its GPU's lock exclusively: tests on different GPUs run side by side.
        """
        if self.counts_instructions:
            # Under callgrind a test counts instructions, which no other process disturbs: it needs
            # no machine to itself, and must not hold back timing pairs that run beside it
            # (scripts/perf-ab.sh runs both from one checkout, so they share this lock file).
            yield
            return
        lock_dir = self.rootdir / ".perfbudget"
        lock_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as stack:
            stack.enter_context(lock(lock_dir / "timing.lock", shared=bool(gpu)))
            if gpu:
                safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in gpu)
                stack.enter_context(lock(lock_dir / f"timing-gpu-{safe}.lock"))
            yield

    @property
    def artifacts_dir(self) -> Path:
        """Failure artifacts go beside the results JSON: ``<json folder>/artifacts/<test>/``."""
        return self.json_path.parent / "artifacts"

    def _meta(self, *, unfinished: str | None = None) -> RunInfo:
        return RunInfo(budgets_dir=str(self.settings.budgets_dir), errors=tuple(self.errors), mode=self.judging.mode,
                       unfinished=unfinished, lease=self.settings.lease or None, measured=self.how_measured())

    def how_measured(self) -> HowMeasured:
        """How this session measured: its measuring settings, host, libraries as loaded, way of measuring."""
        versions: dict[str, str] = {name: str(getattr(sys.modules[name], "__version__", "?"))
                                    for name in ("torch", "triton", "numpy") if name in sys.modules}
        cpu = self.device("cpu") if "torch" in sys.modules else None
        return HowMeasured(settings={**{k: str(getattr(self.settings, k)) for k in _MEASURING_SETTINGS},
                                     "allocator": self.allocator},
                           machine=(cpu.identity or cpu.label) if cpu is not None else "",
                           versions={**versions, "python": platform.python_version()},
                           # Not from the devices touched so far: a side stopped before its first
                           # CUDA test would read unlike the other. Each record names its device.
                           way="callgrind" if self.counts_instructions else "wall")

    def checkpoint(self) -> None:
        """Write the records so far to :attr:`json_path`, marked unfinished, when any were added since.

        A killed run keeps every finished test's records. Not on an xdist worker or an A/B side: their
        records are read once they end. :meth:`finish` replaces the file.
        """
        written = len(self.records) + len(self.errors)
        if self.is_worker or self.judging.takes_turns or written == self._checkpointed:
            return
        meta = self._meta(unfinished="written after each test; the run did not finish (killed), so budgets that "
                                     "apply but no finished test recorded are not listed")
        Results(records=self.records, meta=meta).write(self.json_path)
        self._checkpointed = written

    def finish(self) -> Results:
        """Controller only: write results, then reports, then apply updates from the same records.

        Returns:
            The results written to :attr:`json_path`.
        """
        from .report import markdown_report

        self.records.extend(self.not_measured())
        results = Results(records=self.records, meta=self._meta())
        self.json_path.parent.mkdir(parents=True, exist_ok=True)
        results.write(self.json_path)  # first: a broken report must not lose measurements
        # Reports beside the JSON: results.md (CI step summary), results.html (plots).
        try:
            atomic_write(self.json_path.with_suffix(".md"), markdown_report(results))
            if self.settings.html and not self.judging.takes_turns:
                from .report import write_html

                write_html(results, self.json_path.with_suffix(".html"))
        except Exception as exc:
            warnings.warn(f"perfbudget: reports beside {self.json_path} not written: {exc!r}", stacklevel=1)
        if self.judging.writes_budgets:
            self.update_report = apply_updates(
                results.measured(), self.budgets, allow_loosen=self.allow_loosen,
                commit=provenance_commit(self.rootdir, given=self.commit)
            )
        return results

    def not_measured(self) -> list[Record]:
        """A record for every budget that applies on a measured device but no test recorded: never dropped.

        Budgets this kind of session cannot measure are left to their own sessions (:meth:`_measurable_here`).
        """
        seen: dict[tuple[str, str], Record] = {}
        recorded: set[tuple[str, str, str]] = set()
        for r in self.records:
            if r.device is None:
                continue
            seen.setdefault((r.key, r.device.type), r)
            recorded.add((r.key, r.device.type, r.metric))
        wanted = [(key, first.device, f"budgeted for {key} on {first.device.label} but no test of this run recorded "
                   "it (deselected, renamed, or below the recording threshold)")
                  for (key, _), first in sorted(seen.items()) if first.device is not None]
        wanted += self._keys_without_test({first.device.type: first.device for first in seen.values()
                                           if first.device is not None})
        out = []
        for key, device, reason in wanted:
            try:
                budgets = self.budgets.budgets_for(key, device)
            except Exception:  # broken or ambiguous budgets are reported by the checks themselves
                continue
            for metric, budget in sorted(budgets.items()):
                if (key, device.type, metric) in recorded:
                    continue
                try:
                    info = lookup(metric)
                except ValueError:
                    continue
                if not self._measurable_here(metric, info.statistical):
                    continue
                out.append(Record(
                    nodeid="", key=key, metric=metric, outcome=Outcome.NOT_MEASURED, budget=BudgetRef.of(budget),
                    reason=reason, device=device, unit=info.unit, kind=info.kind, direction=info.direction,
                ))
        return out

    def _keys_without_test(self, devices: dict[str, DeviceInfo]) -> list[tuple[str, DeviceInfo, str]]:
        """``(key, device, why)`` for every key budgeted on a measured device that no collected test has."""
        if self.known_keys is None:
            return []
        known = sorted(self.known_keys)
        out = []
        for _, device in sorted(devices.items()):
            keys = {k for f in self.budgets.matching(device) for k in f.entries} - self.known_keys \
                - {r.key for r in self.records}
            for key in sorted(keys):
                near = difflib.get_close_matches(key, known, n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                out.append((key, device, f"budgeted under the key {key!r} on {device.label}, which no test of this "
                                         f"run has, deselected ones included{hint}: a misspelt or renamed key is "
                                         "never judged"))
        return out

    def _measurable_here(self, metric: str, statistical: bool) -> bool:
        """Whether this kind of session can measure ``metric`` (see :meth:`not_measured`)."""
        if self.counts_instructions:
            return not statistical
        return metric != "instructions[callgrind]"
