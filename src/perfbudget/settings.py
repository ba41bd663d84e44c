"""The run's settings, read once (command line > environment > ini file > default), and an A/B side's run spec."""

from __future__ import annotations

# Stdlib only, and nothing of perfbudget's: every floor reads its settings from here.
import argparse
import configparser
import functools
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest's own dependency before 3.11
    import tomli as tomllib

__all__ = [
    "ALLOCATOR_MODES",
    "CALLGRIND_OUT_ENV",
    "DEFAULT_BURST_MS",
    "DEFAULT_MAX_LOAD_PER_CORE",
    "DEFAULT_WAIT_S",
    "HELPER_CACHE_ENV",
    "SIDES",
    "SPEC_ENV",
    "STABLE_MACHINE_ENV",
    "RunSpec",
    "Settings",
    "find_ini",
    "for_folder",
    "run_spec",
]

STABLE_MACHINE_ENV = "PERFBUDGET_STABLE_MACHINE"
"""A self-hosted runner declares itself stable: its identity (``perfbudget show --identity``) or ``yes``."""
CALLGRIND_OUT_ENV = "PERFBUDGET_CALLGRIND_OUT"
"""The ``--callgrind-out-file`` pattern the process runs under; set by ``perfbudget instructions``."""
HELPER_CACHE_ENV = "PERFBUDGET_CACHE_DIR"
"""Where the compiled callgrind helper is kept."""
SPEC_ENV = "PERFBUDGET_AB_SPEC"
"""Path of the :class:`RunSpec` that ``perfbudget ab`` hands each side process."""

SIDES: tuple[str, ...] = ("base", "head")
#: How a session leaves the process's allocator before timing (:mod:`perfbudget.measure.allocator`).
ALLOCATOR_MODES: tuple[str, ...] = ("settled", "as-is")

# Long enough that the ~0.1 ms hand-over is small, short enough that both sides see the same machine (a VM's
# speed drifts within a second: benchmarks/process-causes-cpu.md); A/A pairs agreed 2-3x better at 100 ms
# than at 400 ms (benchmarks/burst-length-cpu.md).
DEFAULT_BURST_MS = 100.0
# The other side may keep the machine for minutes (torch.compile); past this the run is assumed broken.
DEFAULT_WAIT_S = 1800.0
#: 1-minute load average per core above which CPU timing is refused (the run itself adds about one).
DEFAULT_MAX_LOAD_PER_CORE = 1.5


def _from(*, ini: str = "", env: str = "", help: str = "", positive: bool = False, spec: bool = False,
          choices: tuple[str, ...] = ()) -> dict[str, Any]:
    """A field's sources besides the command line (``spec``: an A/B side's run spec, above env and ini)."""
    return {"ini": ini, "env": env, "help": help, "positive": positive, "spec": spec, "choices": choices}


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What a run or a command is set to, from its command line, environment, ini file and defaults."""

    budgets_dir: Path = field(default=Path("budgets"), metadata=_from(
        ini="perfbudget_budgets_dir", help="budget folder, relative to the rootdir"))
    """Folder of budget YAML files (``--budgets-dir`` is relative to the working folder)."""
    stable_machine: str = field(default="", metadata=_from(
        ini="perfbudget_stable_machine", env=STABLE_MACHINE_ENV,
        help="declare this machine stable, so stored timing budgets keyed by its identity gate: its identity "
             f"(`perfbudget show --identity`) or 'yes'; env {STABLE_MACHINE_ENV} wins; unset: stored timing is "
             "advisory"))
    """The declaration of a stable machine (an identity or ``yes``), empty when not declared."""
    strict: bool = field(default=False, metadata=_from(
        ini="perfbudget_strict", help="as --perf-strict: fail on stale budgets, unbudgeted, not-judged and "
                                      "not-measured checks, and (perfbudget ab) on inconclusive ones"))
    """``--perf-strict``: what is only reported otherwise fails the run."""
    threads: int = field(default=1, metadata=_from(ini="perfbudget_threads", help="torch threads for CPU timing"))
    """Torch threads for CPU timing (and the CPU budgets' identity)."""
    max_load: float = field(default=DEFAULT_MAX_LOAD_PER_CORE, metadata=_from(
        ini="perfbudget_max_load", help="1-minute load average per core above which CPU timing checks are not "
                                        "judged (skip; a failure under --perf-strict)"))
    artifacts: str = field(default="all", metadata=_from(
        ini="perfbudget_artifacts", help="failure artifacts: all, none, or some of trace, flamegraph, memory"))
    """Failure artifacts to write (parsed by :func:`perfbudget.artifacts.parse_kinds`)."""
    html: bool = field(default=True, metadata=_from(
        ini="perfbudget_html", help="write the HTML report (with plots) beside the results JSON"))
    pin_gpus: bool = field(default=True, metadata=_from(
        ini="perfbudget_pin_gpus", help="under xdist, pin each worker to one GPU (CUDA_VISIBLE_DEVICES)"))
    inductor_dir: str = field(default=".perfbudget", metadata=_from(
        ini="perfbudget_inductor_dir", help="folder (relative to the rootdir) for inductor's cache and headers "
                                            "when tests marked `compiles` run, so a second run is warm; empty: "
                                            "leave them"))
    lease: bool = field(default=False, metadata=_from(
        ini="perfbudget_lease", spec=True,
        help="lease-sized work for a GPU leased by time (scripts/gpu-check.sh): fewer serving, profiled operator and "
             "occupancy rounds, tests in the lease plan's order (perfbudget.lease)"))
    """Lease-sized work (:mod:`perfbudget.lease`), recorded in the results' meta; an A/B side takes the driver's."""
    benchmark: bool = field(default=False, metadata=_from(
        ini="perfbudget_benchmark", help="perfbudget measures pytest-benchmark suites: the `benchmark` fixture and the "
                                         "benchmark/codspeed_benchmark markers record timing checks, and pytest-benchmark "
                                         "stands aside (always so in `perfbudget ab` sides)"))
    """Tests of the ``benchmark`` fixture or markers are perfbudget's checks (:mod:`perfbudget.benchmark`)."""
    keep_tmpdir: bool = field(default=False, metadata=_from(env="PERFBUDGET_KEEP_TMPDIR"))
    """Leave TMPDIR alone when inductor's folders move under :attr:`inductor_dir`."""
    helper_cache_dir: Path = field(default=Path("~/.cache/perfbudget"), metadata=_from(env=HELPER_CACHE_ENV))
    """Where the compiled callgrind helper is kept."""
    callgrind_out: str = field(default="callgrind.out.%p", metadata=_from(env=CALLGRIND_OUT_ENV))
    """The ``--callgrind-out-file`` pattern this process runs under (``%p``: its pid)."""
    allocator: str = field(default="settled", metadata=_from(
        ini="perfbudget_allocator", env="PERFBUDGET_ALLOCATOR", spec=True, choices=ALLOCATOR_MODES,
        help="settled (default): glibc keeps large blocks on its heap and torch aligns them, so a process's "
             "allocation history does not set the speed of large-tensor code; as-is: leave the allocator alone"))
    """How the allocator is left before timing (:mod:`perfbudget.measure.allocator`); an A/B side takes the driver's."""
    burst_ms: float = field(default=DEFAULT_BURST_MS, metadata=_from(env="PERFBUDGET_TURNS_BURST_MS", positive=True, spec=True))
    """``perfbudget ab``: target length of one turn-taking burst, in milliseconds."""
    wait_s: float = field(default=DEFAULT_WAIT_S, metadata=_from(env="PERFBUDGET_TURNS_WAIT_S", positive=True))
    """``perfbudget ab``: longest wait of a side for its turn before it gives up on turn-taking, in seconds."""

    @classmethod
    def resolve(cls, *, cli: Mapping[str, object] | None = None, ini: Mapping[str, object] | None = None,
                ini_file: str = "ini", root: Path | None = None, env: Mapping[str, str] | None = None) -> Settings:
        """Each field from the first source that sets it: command line > run spec > environment > ini > default.

        Args:
            cli: command-line values by field name (``None``: not given).
            ini: ini values by ini key (absent: not set; an empty string is a value).
            ini_file: where ``ini`` was read, for errors.
            root: the rootdir, which ini and default folders are relative to (default: the working folder).
            env: the environment (default: this process's; an empty variable is not set), naming the run spec.

        Raises:
            ValueError: naming the option, variable, run spec or ini file and key, and the bad value.
        """
        cli, ini = cli or {}, ini or {}
        env = os.environ if env is None else env
        spec = run_spec(env)
        values: dict[str, object] = {}
        for f in fields(cls):
            key, var = f.metadata.get("ini", ""), f.metadata.get("env", "")
            given = ((f"--{f.name.replace('_', '-')}", cli.get(f.name), None),  # (where, value, relative to)
                     (f"{SPEC_ENV}: {f.name}", getattr(spec, f.name) if spec and f.metadata.get("spec") else None, None),
                     (var, env.get(var, "").strip() or None if var else None, None),
                     (f"{ini_file}: {key}", ini.get(key) if key else None, root),
                     ("default", f.default, root))
            where, raw, folder = next(g for g in given if g[1] is not None)
            try:
                value = _parse(f.type, raw, positive=f.metadata.get("positive", False))
                if f.metadata.get("choices") and value not in f.metadata["choices"]:
                    raise ValueError(f"expected one of {', '.join(f.metadata['choices'])}, got {raw!r}")
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
            if isinstance(value, Path) and not value.is_absolute():
                value = (folder or Path.cwd()) / value
            values[f.name] = value
        return cls(**values)  # type: ignore[arg-type]


_TRUE, _FALSE = ("1", "true", "yes", "y", "on", "t"), ("0", "false", "no", "n", "off", "f")


def _parse(kind: Any, raw: object, *, positive: bool) -> object:
    """``raw`` (text, or a TOML or pytest value) as a field of type ``kind`` (its annotation's text)."""
    text = str(raw).strip()
    if kind == "bool":
        if isinstance(raw, bool) or text.lower() in _TRUE + _FALSE:
            return raw if isinstance(raw, bool) else text.lower() in _TRUE
        raise ValueError(f"expected true or false, got {raw!r}")
    if kind in ("int", "float"):
        try:
            number: float = int(text) if kind == "int" else float(text)
        except ValueError:
            number = math.nan
        if math.isnan(number) or (positive and not (math.isfinite(number) and number > 0)):
            raise ValueError(f"expected {'a positive number' if positive else 'an integer' if kind == 'int' else 'a number'}"
                             f", got {raw!r}")
        return number
    return Path(text).expanduser() if kind == "Path" else text


#: pytest's ini files in the order it looks for them in each folder (``_pytest.config.findpaths``).
_INI_FILES = ("pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")


def find_ini(folder: Path) -> tuple[Path, Path | None, dict[str, object]]:
    """The rootdir, ini file and its pytest options as pytest finds them from ``folder`` (upwards; else the first
    ``pyproject.toml`` marks the rootdir; else ``folder``, no ini file).

    Raises:
        ValueError: an ini file on the way cannot be parsed (naming it).
    """
    pyproject: Path | None = None
    for base in (folder, *folder.parents):
        for name in _INI_FILES:
            path = base / name
            if not path.is_file():
                continue
            pyproject = pyproject or (path if name == "pyproject.toml" else None)
            options = _pytest_options(path)
            if options is not None:
                return base, path, options
    return (pyproject.parent, pyproject, {}) if pyproject else (folder, None, {})


def _pytest_options(path: Path) -> dict[str, object] | None:
    """The pytest options ``path`` holds (``None``: no pytest section)."""
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(path.read_text(encoding="utf-8"))
            table = data.get("tool", {}).get("pytest") if path.name == "pyproject.toml" else data.get("pytest")
            if isinstance(table, dict) and isinstance(table.get("ini_options"), dict):
                table = table["ini_options"]
            return dict(table) if isinstance(table, dict) else None
        parser = configparser.ConfigParser(interpolation=None)
        parser.read(path, encoding="utf-8")
    except (OSError, ValueError, configparser.Error) as exc:
        raise ValueError(f"{path}: cannot be read: {exc}") from None
    section = "tool:pytest" if path.name == "setup.cfg" else "pytest"
    if parser.has_section(section):
        return dict(parser[section])
    return {} if path.name.endswith("pytest.ini") else None


def pytest_cli(args: Sequence[str]) -> dict[str, object]:
    """The settings among a pytest command line (``--budgets-dir DIR``, ``--perf-strict``), read as pytest does;
    ``-c`` and ``addopts`` are not read (``-o``: :func:`pytest_overrides`)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--budgets-dir", dest="budgets_dir", default=None)
    parser.add_argument("--perf-strict", dest="strict", action="store_const", const=True, default=None)
    known, _ = parser.parse_known_args([a for a in args if a != "--"])
    return {k: v for k, v in vars(known).items() if v is not None}


def pytest_overrides(args: Sequence[str]) -> dict[str, str]:
    """The ini values a pytest command line overrides (``-o K=V``, ``-oK=V``, ``--override-ini[=]K=V``), last wins."""
    out: dict[str, str] = {}
    for i, arg in enumerate(args):
        if arg in ("-o", "--override-ini"):
            given = args[i + 1] if i + 1 < len(args) else ""
        elif arg.startswith(("--override-ini=", "-o")) and arg != "--override-ini":
            given = arg.partition("=")[2] if arg.startswith("--") else arg[2:]
        else:
            continue
        key, eq, text = given.partition("=")
        if eq and key.strip():
            out[key.strip()] = text
    return out


def for_folder(folder: Path, *, cli: Mapping[str, object] | None = None, overrides: Mapping[str, str] | None = None,
               env: Mapping[str, str] | None = None) -> Settings:
    """The settings of a pytest run in ``folder``, its ini values ``overrides`` (:func:`pytest_overrides`) replaced.

    Raises:
        ValueError: a bad value or an unreadable ini file (see :meth:`Settings.resolve`).
    """
    root, path, ini = find_ini(folder)
    return Settings.resolve(cli=cli, ini={**ini, **(overrides or {})}, root=root, env=env,
                            ini_file=f"-o or {path}" if overrides else str(path))


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """What ``perfbudget ab`` tells one side process: a JSON file named by :data:`SPEC_ENV`, read once."""

    side: str
    """Which side the process is: one of :data:`SIDES`."""
    socket: str = ""
    """The turn coordinator's Unix socket; empty: the side does not take turns (instruction counts)."""
    report: str = ""
    """File the side appends one line to for each way turn-taking was lost (empty: none)."""
    burst_ms: float = DEFAULT_BURST_MS
    """Target length of one burst, in milliseconds."""
    wait_s: float = DEFAULT_WAIT_S
    """Longest wait for the turn before giving up on turn-taking, in seconds."""
    precision: float | None = None
    """Half-width each statistical check's within-pair ratio samples to (``None``: one fixed sample set)."""
    operators_file: str = ""
    """The driver's JSON ``{nodeid: {key: [operator, ...]}}`` of pinned operators (absent before it writes one)."""
    lease: bool = False
    """Lease-sized work (:attr:`Settings.lease`), the same on both sides: the driver's setting."""
    allocator: str = "settled"
    """How both sides leave their allocator (:attr:`Settings.allocator`): the driver's setting."""

    def __post_init__(self) -> None:
        def number(x: object) -> bool:
            return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

        checks = [("side", self.side in SIDES, f"one of {SIDES}"),
                  *((k, isinstance(getattr(self, k), str), "a path") for k in ("socket", "report", "operators_file")),
                  *((k, number(getattr(self, k)) and getattr(self, k) > 0, "a positive number")
                    for k in ("burst_ms", "wait_s")),
                  ("lease", isinstance(self.lease, bool), "true or false"),
                  ("allocator", self.allocator in ALLOCATOR_MODES, f"one of {', '.join(ALLOCATOR_MODES)}"),
                  ("precision", self.precision is None or (number(self.precision) and 0 < self.precision < 1),
                   "a fraction in (0, 1) such as 0.01, or null for one fixed sample set")]
        for key, ok, expected in checks:
            if not ok:
                raise ValueError(f"{key}: expected {expected}, got {getattr(self, key)!r}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1) + "\n"

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> RunSpec:
        """The spec in ``path``.

        Raises:
            ValueError: naming the file, and the key and value that are wrong.
        """
        where = f"{SPEC_ENV}={path} (the run spec of `perfbudget ab`)"
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{where}: cannot be read: {exc}") from None
        known = {f.name for f in fields(cls)}
        if not isinstance(data, dict) or "side" not in data or set(data) - known:
            got = sorted(set(data) - known) if isinstance(data, dict) else data
            raise ValueError(f"{where}: expected an object with side and some of {sorted(known - {'side'})}, "
                             f"got {'unknown keys ' if isinstance(data, dict) and got else ''}{got!r}")
        try:
            return cls(**data)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None


def run_spec(env: Mapping[str, str] | None = None) -> RunSpec | None:
    """This process's run spec when ``perfbudget ab`` started it (:data:`SPEC_ENV` set), else ``None``.

    Raises:
        ValueError: the file cannot be read or holds a bad value (see :meth:`RunSpec.read`).
    """
    path = (os.environ if env is None else env).get(SPEC_ENV, "")
    return _spec_in(path) if path else None


@functools.lru_cache(maxsize=8)
def _spec_in(path: str) -> RunSpec:
    # Read once: the file never changes, and the timers ask at every burst boundary.
    return RunSpec.read(path)
