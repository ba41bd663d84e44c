"""The GitHub Actions end of a pull-request check (``action.yml``): run, summarise, keep one comment per check."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .exitcodes import ExitCode
from .fileio import atomic_write
from .report import (
    CommentLinks,
    comment_marker,
    junit_xml,
    markdown_report,
    pr_comment,
    read_marker,
    regressions,
    render_html,
    stale_comment,
)
from .report.common import md_text, plain
from .results import Results, load_results

__all__ = ["Comments", "GitHubEnv", "GitHubError", "check_command", "main", "prepare"]

#: Comments read per page (the API's largest page).
_PER_PAGE = 100
#: Seconds to wait for one answer of the comments API.
_TIMEOUT_S = 30.0
#: The most characters of an error message the job summary shows.
_MAX_ERROR = 1_000
#: The login the workflow's own token (``github.token``) writes as; that token cannot ask
#: GraphQL's ``viewer`` (nor ``GET /user``) who it is.
WORKFLOW_TOKEN_LOGIN = "github-actions[bot]"
_SHA = re.compile(r"[0-9a-f]{40}")
#: The actor of a run Dependabot started: GitHub gives it a read-only token.
_DEPENDABOT = "dependabot[bot]"


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
    """The commit the workflow checked out (``GITHUB_SHA``; a pull request's merge commit)."""
    graphql_url: str = "https://api.github.com/graphql"
    job: str = ""
    """The job's id (``GITHUB_JOB``): the default check name of the comment."""
    actor: str = ""
    """Who started the run (``GITHUB_ACTOR``): what decides whether Dependabot's read-only token is the job's."""

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
                   sha=environ.get("GITHUB_SHA", ""),
                   graphql_url=environ.get("GITHUB_GRAPHQL_URL") or cls.graphql_url,
                   job=environ.get("GITHUB_JOB", ""), actor=environ.get("GITHUB_ACTOR", ""))

    @property
    def pull_request(self) -> int | None:
        """The pull request's number on a ``pull_request`` (``_target``) event, else ``None``."""
        if not self.event_name.startswith("pull_request") or self.event is None:
            return None
        pr = self.event.get("pull_request")
        number = pr.get("number") if isinstance(pr, dict) else self.event.get("number")
        return number if isinstance(number, int) and not isinstance(number, bool) else None

    def _get(self, *keys: str) -> Any:
        """The event payload's value at ``keys``, ``None`` where any level is missing."""
        value: Any = self.event
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    @property
    def from_fork(self) -> bool:
        """A ``pull_request`` event whose head repository is not the base one (or is deleted):
        GitHub gives its workflow a read-only token, so no comment can be written."""
        if self.event_name != "pull_request" or self.pull_request is None:
            return False
        head = self._get("pull_request", "head", "repo", "full_name")
        return head != self._get("pull_request", "base", "repo", "full_name")

    @property
    def from_dependabot(self) -> bool:
        """A ``pull_request`` event whose run Dependabot started (``GITHUB_ACTOR``, whoever opened the pull
        request): from this repository, yet GitHub runs it with a read-only token too (its secrets are
        Dependabot's own). A maintainer's push to Dependabot's pull request runs with a write token."""
        return self.event_name == "pull_request" and self.pull_request is not None and self.actor == _DEPENDABOT

    @property
    def run_head(self) -> tuple[str, str, str] | None:
        """``(owner, branch, sha)`` of the pull request whose workflow run finished, on a
        ``workflow_run`` event of a ``pull_request`` workflow; else ``None``."""
        if self.event_name != "workflow_run" or self._get("workflow_run", "event") != "pull_request":
            return None
        got = (self._get("workflow_run", "head_repository", "owner", "login"),
               self._get("workflow_run", "head_branch"), self._get("workflow_run", "head_sha"))
        return got if all(isinstance(x, str) and x for x in got) else None

    @property
    def head_sha(self) -> str:
        """The commit a reviewer sees as the pull request's head: the event's
        ``pull_request.head.sha`` (``workflow_run.head_sha``), else ``GITHUB_SHA``.

        Raises:
            ValueError: one that is not a 40-digit hex commit (naming where it came from).
        """
        sha: Any = self.sha
        key = "GITHUB_SHA"
        if self.pull_request is not None and self._get("pull_request", "head", "sha") is not None:
            sha, key = self._get("pull_request", "head", "sha"), "pull_request.head.sha"
        elif self.run_head is not None:
            sha, key = self.run_head[2], "workflow_run.head_sha"
        if sha and not (isinstance(sha, str) and _SHA.fullmatch(sha)):
            raise ValueError(f"{key}: expected a 40-digit hex commit, got {sha!r:.60}")
        return str(sha)

    @property
    def base_sha(self) -> str:
        """The pull request's base commit (``pull_request.base.sha``), empty on other events."""
        sha = self._get("pull_request", "base", "sha") if self.pull_request is not None else None
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
    """A pull request's comments through GitHub's APIs: ours found by author, check and marker,
    then updated in place, or created."""

    def __init__(self, api_url: str, repository: str, token: str,
                 graphql_url: str = GitHubEnv.graphql_url) -> None:
        for name, url in (("GITHUB_API_URL", api_url), ("GITHUB_GRAPHQL_URL", graphql_url)):
            if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
                raise ValueError(f"{name}: expected an http(s) URL, got {url!r}")
        if repository.count("/") != 1:
            raise ValueError(f"GITHUB_REPOSITORY: expected owner/name, got {repository!r}")
        if not token:
            raise ValueError("GITHUB_TOKEN: empty; pass the job's token "
                             "(token: ${{ github.token }})")
        self.base = f"{api_url.rstrip('/')}/repos/{repository}"
        self.graphql_url = graphql_url
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

    def _graphql(self, query: str, **variables: Any) -> Mapping[str, Any]:
        got = self._call("POST", self.graphql_url, {"query": query, "variables": variables})
        if not isinstance(got, dict) or got.get("errors") or not isinstance(got.get("data"), dict):
            raise GitHubError(f"POST {self.graphql_url}: {got!r:.300}")
        return got["data"]

    def viewer(self) -> str:
        """The login this token writes as (GraphQL ``viewer``)."""
        login = self._graphql("query { viewer { login } }").get("viewer")
        if not isinstance(login, dict) or not isinstance(login.get("login"), str):
            raise GitHubError(f"POST {self.graphql_url}: no viewer login in the answer")
        return str(login["login"])

    def minimized(self, node_ids: list[str]) -> dict[str, bool]:
        """``node_id -> isMinimized`` of comments (GraphQL), those it answered for."""
        nodes = self._graphql("query($ids: [ID!]!) { nodes(ids: $ids) "
                              "{ ... on IssueComment { id isMinimized } } }", ids=node_ids)
        return {n["id"]: n["isMinimized"] is True for n in nodes.get("nodes") or []
                if isinstance(n, dict) and "id" in n}

    def pull_for(self, owner: str, branch: str, sha: str) -> int | None:
        """The open pull request whose head is ``owner:branch`` at ``sha`` (what a
        ``workflow_run`` event names; its own pull-request list is empty for a fork's)."""
        query = urllib.parse.urlencode({"state": "open", "head": f"{owner}:{branch}"})
        got = self._call("GET", f"{self.base}/pulls?{query}&per_page={_PER_PAGE}")
        for pr in got if isinstance(got, list) else []:
            if isinstance(pr, dict) and isinstance(pr.get("head"), dict) \
                    and pr["head"].get("sha") == sha and isinstance(pr.get("number"), int):
                return int(pr["number"])
        return None

    def _all(self, number: int) -> Iterator[Mapping[str, Any]]:
        url = f"{self.base}/issues/{number}/comments"
        page = 1
        while True:
            got = self._call("GET", f"{url}?per_page={_PER_PAGE}&page={page}")
            if not isinstance(got, list):
                raise GitHubError(f"GET {url}: expected a list, got {got!r:.100}")
            yield from (c for c in got if isinstance(c, dict))
            if len(got) < _PER_PAGE:
                return
            page += 1

    def find(self, number: int, *, author: str, check: str) -> Mapping[str, Any] | None:
        """Our comment on pull request ``number``: by ``author`` (anyone can write a marker), led by the
        marker of ``check`` (else an older action's bare one), and not minimized, where GraphQL says."""
        mine = [(marker[0] != check, c) for c in self._all(number)
                if str((c.get("user") or {}).get("login", "")) == author
                and (marker := read_marker(str(c.get("body") or ""))) is not None
                and marker[0] in (check, "")]
        mine = sorted(mine, key=lambda x: x[0])  # this check's own before an older bare one
        ids = [str(c["node_id"]) for _, c in mine if c.get("node_id")]
        hidden: dict[str, bool] = {}
        if ids:
            try:
                hidden = self.minimized(ids)
            except GitHubError as exc:
                print(f"perfbudget: cannot tell whether our comment is minimized ({exc}): "
                      "taken as shown")
        for _, c in mine:
            if hidden.get(str(c.get("node_id"))):
                print(f"perfbudget: comment {c.get('id')} is minimized: not updated")
                continue
            return c
        return None

    def _write(self, method: str, url: str, body: str) -> str:
        """Write a comment's body; returns its URL (empty when the answer has none)."""
        done = self._call(method, url, {"body": body})
        return str(done.get("html_url", "")) if isinstance(done, dict) else ""

    def upsert(self, number: int, body: str, *, author: str,
               check: str) -> tuple[str, str]:
        """Update our comment (:meth:`find`) on pull request ``number`` in place, or create
        one; returns ``("updated" or "created", the comment's URL)``."""
        found = self.find(number, author=author, check=check)
        if found is not None:
            return "updated", self._write("PATCH", f"{self.base}/issues/comments/{found['id']}", body)
        return "created", self._write("POST", f"{self.base}/issues/{number}/comments", body)

    def mark_stale(self, number: int, head: str, *, author: str, check: str) -> str:
        """Mark our comment stale (:func:`~perfbudget.report.stale_comment`): the push of
        ``head`` produced no results. Returns its URL, empty when there is none."""
        found = self.find(number, author=author, check=check)
        if found is None:
            return ""
        body = stale_comment(str(found.get("body") or ""), head)
        return self._write("PATCH", f"{self.base}/issues/comments/{found['id']}", body)


def check_command(*, mode: str, results: str, env: GitHubEnv, base: str = "", tests: str = "",
                  pytest_args: str = "", ab_args: str = "",
                  python: str = sys.executable) -> list[str]:
    """The command that runs the checks and writes ``results``: ``perfbudget ab`` against ``base`` (else a
    pull request's merge-base with its base, else ``HEAD~1``), or pytest against the stored budgets.

    Raises:
        ValueError: an unknown mode, arguments a shell could not split, or a ``pull_request_target``
            event (it must never run a pull request's code).
    """
    if env.event_name == "pull_request_target":
        raise ValueError("pull_request_target: refused: that event runs with a write token and "
                         "secrets, and this would run the pull request's code; run the checks on "
                         "pull_request and publish with mode: report (docs: 'Pull requests from "
                         "forks')")
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
    except ValueError as exc:  # naming what a results file held: text, never Markdown
        env.append_summary(f"## ⚠️ {args.title}: no results\n\n{md_text(exc, limit=_MAX_ERROR)}\n\n"
                           "See the log of the step that runs the checks.\n")
        raise
    print(f"perfbudget: {len(results.records)} records; summary written; upload {kept.parent}")
    return ExitCode.OK


def _comment(args: argparse.Namespace, env: GitHubEnv) -> int:
    if env.from_fork or env.from_dependabot:
        who = "a pull request from a fork" if env.from_fork else "a pull request's run Dependabot started"
        print(f"::warning::perfbudget: {who}: "
              "its workflow's token is read-only, so no comment; the verdict is in the job summary. To comment "
              "on such pull requests, see the docs page 'Pull requests from forks'.")
        return ExitCode.OK
    if env.pull_request is None and env.run_head is None:
        print(f"perfbudget: a {env.event_name or 'local'} event, not a pull request: no comment")
        return ExitCode.OK
    check = args.check_name or env.job
    if not check:
        raise ValueError("--check-name: empty, and GITHUB_JOB is not set: name this check")
    head = env.head_sha
    api = Comments(env.api_url, env.repository, env.token, env.graphql_url)
    results_path = Path(args.results)
    try:
        number = env.pull_request or (api.pull_for(*env.run_head) if env.run_head else None)
        if number is None:
            print(f"perfbudget: no open pull request has head {head[:12]}: no comment")
            return ExitCode.OK
        author = args.author or api.viewer()
        try:
            results = load_results(results_path)
        except ValueError:
            if url := api.mark_stale(number, head, author=author, check=check):
                print(f"perfbudget: no results for {head[:12]}: marked the comment stale: {url}")
            raise
        links = CommentLinks(report_url=args.report_url, history_url=args.history_url,
                             results_url=args.results_url)
        body = pr_comment(results, title=args.title, links=links, results_name=results_path.name,
                          commit=head or None, marker=comment_marker(check, head), head=head)
        action, url = api.upsert(number, body, author=author, check=check)
    except GitHubError as exc:
        why = (" (the token may not write this pull request's comments: give the job "
               "`permissions: pull-requests: write`)") if exc.status == 403 else ""
        print(f"::error::perfbudget: {exc}{why}")
        return ExitCode.FAILED
    env.set_outputs(comment_url=url)
    print(f"perfbudget: {action} the comment of check {check!r} on pull request #{number} as "
          f"{author}: {url}")
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
    com.add_argument("--check-name", default="",
                     help="this check's name: one comment per name (default: GITHUB_JOB)")
    com.add_argument("--author", default="",
                     help="the login the token writes as (the workflow's token: "
                          f"{WORKFLOW_TOKEN_LOGIN}); default: GraphQL's viewer")
    com.set_defaults(func=_comment)
    return p


def main(argv: Iterable[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run ``python -m perfbudget.github run|prepare|comment``.

    Returns:
        ``run``: the checks' exit code; the others 0 done or nothing to do (not a pull request, or
        one whose token is read-only), 1 GitHub refused, 2 usage or input error (no results: the
        comment of an earlier commit is marked stale first).
    """
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    try:
        env = GitHubEnv.from_environ(os.environ if environ is None else environ)
        return int(args.func(args, env))
    except ValueError as exc:  # a results file or an environment variable, named: one line, no workflow command
        print(f"::error::perfbudget {args.command}: {plain(exc)}")
        return ExitCode.USAGE


if __name__ == "__main__":
    sys.exit(main())
