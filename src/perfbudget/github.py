"""The GitHub Actions end of a pull-request check (``action.yml``): run the checks, write the job
summary and the folder to upload, keep one sticky pull-request comment through the REST API
(standard library only).

    python -m perfbudget.github run --mode ab|stored --results PATH [--base REF] [--tests ...]
    python -m perfbudget.github prepare RESULTS --out DIR [--title T]
    python -m perfbudget.github comment RESULTS [--report-url URL] [--history-url URL]

Exit codes: ``run`` exits as the checks do; the others 0 done (or nothing to do: not a pull
request; a token that may not comment, with a warning), 1 the API refused otherwise, 2 usage or
input error.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .exitcodes import ExitCode
from .fileio import atomic_write
from .report import (
    COMMENT_MARKER,
    CommentLinks,
    junit_xml,
    markdown_report,
    pr_comment,
    regressions,
    render_html,
)
from .results import Results, load_results

__all__ = ["Comments", "GitHubEnv", "GitHubError", "check_command", "main", "prepare"]

#: Comments read per page (the API's largest page).
_PER_PAGE = 100
#: Seconds to wait for one answer of the comments API.
_TIMEOUT_S = 30.0


class GitHubError(RuntimeError):
    """A REST call GitHub refused; ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, kw_only=True)
class GitHubEnv:
    """What a GitHub Actions job tells a step, read once from its environment."""

    api_url: str = "https://api.github.com"
    repository: str = ""
    """``owner/name``."""
    token: str = ""
    event_name: str = ""
    event: Mapping[str, Any] | None = None
    """The event's payload (``GITHUB_EVENT_PATH``)."""
    step_summary: Path | None = None
    output: Path | None = None
    sha: str = ""
    """The commit the workflow checked out (``GITHUB_SHA``)."""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> GitHubEnv:
        """Read the variables GitHub Actions sets.

        Raises:
            ValueError: an event payload that cannot be read, naming the file.
        """
        event = None
        if path := environ.get("GITHUB_EVENT_PATH", ""):
            try:
                event = json.loads(Path(path).read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as exc:
                raise ValueError(f"GITHUB_EVENT_PATH {path}: cannot read the event payload: "
                                 f"{exc}") from None

        def path_of(name: str) -> Path | None:
            return Path(environ[name]) if environ.get(name) else None

        return cls(api_url=environ.get("GITHUB_API_URL") or cls.api_url,
                   repository=environ.get("GITHUB_REPOSITORY", ""),
                   token=environ.get("GITHUB_TOKEN", ""),
                   event_name=environ.get("GITHUB_EVENT_NAME", ""),
                   event=event if isinstance(event, dict) else None,
                   step_summary=path_of("GITHUB_STEP_SUMMARY"), output=path_of("GITHUB_OUTPUT"),
                   sha=environ.get("GITHUB_SHA", ""))

    @property
    def pull_request(self) -> int | None:
        """The pull request's number on a ``pull_request`` (``_target``) event, else ``None``."""
        if not self.event_name.startswith("pull_request") or self.event is None:
            return None
        pr = self.event.get("pull_request")
        number = pr.get("number") if isinstance(pr, dict) else self.event.get("number")
        return number if isinstance(number, int) and not isinstance(number, bool) else None

    @property
    def base_sha(self) -> str:
        """The pull request's base commit (``pull_request.base.sha``), empty on other events."""
        if self.pull_request is None or self.event is None:
            return ""
        pr = self.event.get("pull_request")
        base = pr.get("base") if isinstance(pr, dict) else None
        sha = base.get("sha") if isinstance(base, dict) else None
        return sha if isinstance(sha, str) else ""

    def append_summary(self, text: str) -> None:
        """Append Markdown to the job summary (``GITHUB_STEP_SUMMARY``), when set."""
        if self.step_summary is not None:
            with self.step_summary.open("a", encoding="utf-8") as fh:
                fh.write(text)

    def set_outputs(self, **values: str) -> None:
        """Append ``name=value`` lines to ``GITHUB_OUTPUT`` (the step's outputs), when set."""
        if self.output is not None:
            with self.output.open("a", encoding="utf-8") as fh:
                fh.writelines(f"{k.replace('_', '-')}={v}\n" for k, v in values.items())


class Comments:
    """A pull request's comments through the REST API: ours found by its marker, then updated
    in place, or created."""

    def __init__(self, api_url: str, repository: str, token: str) -> None:
        if urllib.parse.urlsplit(api_url).scheme not in ("http", "https"):
            raise ValueError(f"GITHUB_API_URL: expected an http(s) URL, got {api_url!r}")
        if repository.count("/") != 1:
            raise ValueError(f"GITHUB_REPOSITORY: expected owner/name, got {repository!r}")
        if not token:
            raise ValueError("GITHUB_TOKEN: empty; pass the job's token "
                             "(token: ${{ github.token }})")
        self.base = f"{api_url.rstrip('/')}/repos/{repository}"
        self.token = token

    def _call(self, method: str, url: str, body: Mapping[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/vnd.github+json", "Authorization": f"Bearer {self.token}",
                   "X-GitHub-Api-Version": "2022-11-28", "User-Agent": "perfbudget"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:300]
            raise GitHubError(f"{method} {url}: HTTP {exc.code}: {detail}", exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            raise GitHubError(f"{method} {url}: no answer: {exc}") from None

    def find(self, number: int) -> Mapping[str, Any] | None:
        """The first comment of pull request ``number`` whose body starts with :data:`COMMENT_MARKER`."""
        url = f"{self.base}/issues/{number}/comments"
        page = 1
        while True:
            got = self._call("GET", f"{url}?per_page={_PER_PAGE}&page={page}")
            if not isinstance(got, list):
                raise GitHubError(f"GET {url}: expected a list, got {got!r:.100}")
            for c in got:
                if isinstance(c, dict) and str(c.get("body") or "").startswith(COMMENT_MARKER):
                    return c
            if len(got) < _PER_PAGE:
                return None
            page += 1

    def upsert(self, number: int, body: str) -> tuple[str, str]:
        """Update our comment on pull request ``number`` in place, or create it; returns
        ``("updated" or "created", the comment's URL)``."""
        found = self.find(number)
        if found is not None:
            action = "updated"
            done = self._call("PATCH", f"{self.base}/issues/comments/{found['id']}", {"body": body})
        else:
            action = "created"
            done = self._call("POST", f"{self.base}/issues/{number}/comments", {"body": body})
        return action, str(done.get("html_url", "")) if isinstance(done, dict) else ""


def check_command(*, mode: str, results: str, env: GitHubEnv, base: str = "", tests: str = "",
                  pytest_args: str = "", ab_args: str = "",
                  python: str = sys.executable) -> list[str]:
    """The command that runs the checks and writes ``results``.

    ``ab``: ``perfbudget ab`` against ``base``, else on a pull request its merge-base with the
    pull request's base, else the first parent (``HEAD~1``); ``stored``: pytest against the
    stored budgets. ``tests``, ``pytest_args`` and ``ab_args`` are split as a shell would.

    Raises:
        ValueError: an unknown mode, or arguments a shell could not split (naming them).
    """
    try:
        selection = [*shlex.split(tests), *shlex.split(pytest_args)]
        extra = shlex.split(ab_args)
    except ValueError as exc:
        raise ValueError(f"tests, pytest-args or ab-args: {exc}") from None
    if mode == "stored":
        return [python, "-m", "pytest", *selection, f"--perf-json={results}"]
    if mode != "ab":
        raise ValueError(f"mode: expected ab or stored, got {mode!r}")
    on_pr = env.pull_request is not None
    ref = base or (env.base_sha if on_pr else "") or "HEAD~1"
    return [python, "-m", "perfbudget.cli", "ab", "--base", ref,
            *(["--merge-base"] if on_pr else []), "--out", results, *extra, "--", *selection]


def _run(args: argparse.Namespace, env: GitHubEnv) -> int:
    argv = check_command(mode=args.mode, results=args.results, env=env, base=args.base,
                         tests=args.tests, pytest_args=args.pytest_args, ab_args=args.ab_args)
    if args.mode == "ab" and subprocess.run(["git", "rev-parse", "--is-shallow-repository"], capture_output=True,
                                            text=True).stdout.strip() == "true":
        # The base commit and the merge-base must be in the clone; a default checkout is shallow.
        subprocess.run(["git", "fetch", "--quiet", "--unshallow"], check=False)
    Path(args.results).parent.mkdir(parents=True, exist_ok=True)
    print("perfbudget: " + shlex.join(argv), flush=True)
    return subprocess.run(argv).returncode


def prepare(results_path: Path, out: Path, *, title: str, env: GitHubEnv) -> tuple[Path, Results]:
    """Write the folder to upload (the results file, ``report.html``, ``report.md``,
    ``junit.xml``) and the job summary; returns the results file in the folder, and the results.

    Raises:
        ValueError: the results file cannot be read (naming it).
    """
    results = load_results(results_path)
    out.mkdir(parents=True, exist_ok=True)
    kept = out / results_path.name
    if kept.resolve() != results_path.resolve():
        shutil.copyfile(results_path, kept)
    summary = markdown_report(results, title=title)
    atomic_write(out / "report.md", summary)
    atomic_write(out / "report.html", render_html(results, title=title))
    atomic_write(out / "junit.xml", junit_xml(results))
    env.append_summary(summary + "\n")
    failed = bool(regressions(results.records))
    env.set_outputs(dir=str(out), results=str(kept), failed=str(failed).lower())
    return kept, results


def _prepare(args: argparse.Namespace, env: GitHubEnv) -> int:
    try:
        kept, results = prepare(Path(args.results), Path(args.out), title=args.title, env=env)
    except ValueError as exc:
        env.append_summary(f"## ⚠️ {args.title}: no results\n\n{exc}\n\n"
                           "See the log of the step that runs the checks.\n")
        raise
    print(f"perfbudget: {len(results.records)} records; summary written; upload {kept.parent}")
    return ExitCode.OK


def _comment(args: argparse.Namespace, env: GitHubEnv) -> int:
    number = env.pull_request
    if number is None:
        print(f"perfbudget: a {env.event_name or 'local'} event, not a pull request: no comment")
        return ExitCode.OK
    results_path = Path(args.results)
    results = load_results(results_path)
    links = CommentLinks(report_url=args.report_url, history_url=args.history_url,
                         results_url=args.results_url)
    body = pr_comment(results, title=args.title, links=links, results_name=results_path.name,
                      commit=env.sha or None)
    try:
        action, url = Comments(env.api_url, env.repository, env.token).upsert(number, body)
    except GitHubError as exc:
        if exc.status == 403:
            # A pull request from a fork gets a read-only token: the verdict stays in the summary.
            print(f"::warning::perfbudget: cannot write the pull request's comment ({exc}); a pull "
                  "request from a fork gets a read-only token, and the job needs `permissions: "
                  "pull-requests: write`. The verdict is in the job summary.")
            return ExitCode.OK
        print(f"::error::perfbudget: {exc}")
        return ExitCode.FAILED
    env.set_outputs(comment_url=url)
    print(f"perfbudget: {action} the comment on pull request #{number}: {url}")
    return ExitCode.OK


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m perfbudget.github",
        description="Run the checks, write the job summary and the folder to upload, keep one "
                    "pull-request comment (GitHub Actions).")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the checks: perfbudget ab against the base, or pytest "
                                     "against the stored budgets")
    run.add_argument("--mode", choices=("ab", "stored"), default="ab")
    run.add_argument("--results", required=True, help="results JSON file to write")
    run.add_argument("--base", default="",
                     help="base commit-ish (default: the pull request's base, else HEAD~1)")
    run.add_argument("--tests", default="perf_tests",
                     help="the perf tests to run (paths, -m/-k selections)")
    run.add_argument("--pytest-args", default="", help="more pytest arguments, for both sides")
    run.add_argument("--ab-args", default="", help="more perfbudget ab options (--max-pairs 4)")
    run.set_defaults(func=_run)
    pre = sub.add_parser("prepare", help="write the job summary and the folder to upload")
    pre.add_argument("results", help="results JSON file")
    pre.add_argument("--out", required=True, help="folder to upload (created)")
    pre.add_argument("--title", default="perf")
    pre.set_defaults(func=_prepare)
    com = sub.add_parser("comment", help="create the pull request's comment, or update it in place")
    com.add_argument("results", help="results JSON file (the accept command names it)")
    com.add_argument("--title", default="perf")
    com.add_argument("--report-url", default="", help="the HTML report (the uploaded artifact)")
    com.add_argument("--results-url", default="",
                     help="the results file (default: the report's URL)")
    com.add_argument("--history-url", default="", help="the main branch's history page")
    com.set_defaults(func=_comment)
    return p


def main(argv: Iterable[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run a subcommand; returns the exit code (see the module docstring)."""
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    try:
        env = GitHubEnv.from_environ(os.environ if environ is None else environ)
        return int(args.func(args, env))
    except ValueError as exc:  # a results file or an environment variable, named
        print(f"::error::perfbudget {args.command}: {exc}")
        return ExitCode.USAGE


if __name__ == "__main__":
    sys.exit(main())
