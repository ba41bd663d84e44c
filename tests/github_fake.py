"""A local stand-in for the parts of GitHub's REST and GraphQL APIs that ``perfbudget.github``
calls, on 127.0.0.1 (no network), and the environment a GitHub Actions job gives a step."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

TOKEN = "ghs_test-token"
"""The workflow's own token: it writes as ``github-actions[bot]`` and cannot ask who it is."""
BOT = "github-actions[bot]"
REPO = "octo/model"
PR = 7
REFUSED = (403, {"message": "Resource not accessible by integration"})


@dataclass
class FakeGitHub:
    """One repository's pull-request comments, pulls and GraphQL ``viewer``/``nodes``, in memory;
    every call is logged as ``(method, path)``."""

    comments: list[dict[str, Any]] = field(default_factory=list)
    calls: list[tuple[str, str]] = field(default_factory=list)
    logins: dict[str, str] = field(default_factory=lambda: {TOKEN: BOT})
    """Token -> the login it writes as."""
    refuse: set[str] = field(default_factory=set)
    """Methods answered 403 on the comments endpoints (``POST``, ``PATCH``)."""
    minimized: set[int] = field(default_factory=set)
    """Ids of comments a maintainer hid."""
    graphql: bool = True
    """False: every GraphQL query answers 403."""
    pulls: list[dict[str, Any]] = field(default_factory=list)

    def add(self, body: str, login: str = "someone") -> dict[str, Any]:
        i = 1000 + len(self.comments)
        c = {"id": i, "node_id": f"IC_{i}", "body": body, "user": {"login": login},
             "html_url": f"https://github.test/{REPO}/pull/{PR}#issuecomment-{i}"}
        self.comments.append(c)
        return c

    def by(self, login: str) -> list[dict[str, Any]]:
        return [c for c in self.comments if c["user"]["login"] == login]

    def handle(self, method: str, path: str, query: dict[str, list[str]], auth: str,
               body: Any) -> tuple[int, Any]:
        self.calls.append((method, path))
        login = self.logins.get(auth.removeprefix("Bearer "))
        if login is None:
            return 401, {"message": "Bad credentials"}
        if path == "/graphql" and method == "POST":
            return self._graphql(login, body["query"], body.get("variables") or {})
        if path == f"/repos/{REPO}/issues/{PR}/comments":
            if method == "GET":
                per_page, page = int(query["per_page"][0]), int(query["page"][0])
                return 200, self.comments[(page - 1) * per_page:page * per_page]
            if method == "POST":
                return REFUSED if "POST" in self.refuse else (201, self.add(body["body"], login))
        if method == "PATCH" and (m := re.fullmatch(rf"/repos/{REPO}/issues/comments/(\d+)", path)):
            found = next(c for c in self.comments if c["id"] == int(m.group(1)))
            if "PATCH" in self.refuse or found["user"]["login"] != login:
                return REFUSED
            found["body"] = body["body"]
            return 200, found
        if method == "GET" and path == f"/repos/{REPO}/pulls":
            head = query["head"][0]
            return 200, [p for p in self.pulls
                         if f"{p['head']['repo']['owner']['login']}:{p['head']['ref']}" == head]
        return 404, {"message": "Not Found"}

    def _graphql(self, login: str, text: str, variables: dict[str, Any]) -> tuple[int, Any]:
        if not self.graphql:
            return REFUSED
        if "viewer" in text:
            if login == BOT:  # what GitHub answers the workflow's token
                return 200, {"errors": [{"message": "Resource not accessible by integration"}]}
            return 200, {"data": {"viewer": {"login": login}}}
        if "isMinimized" in text:
            nodes = [{"id": c["node_id"], "isMinimized": c["id"] in self.minimized}
                     for c in self.comments if c["node_id"] in variables["ids"]]
            return 200, {"data": {"nodes": nodes}}
        return 200, {"errors": [{"message": "unknown query"}]}


@contextmanager
def serve(state: FakeGitHub) -> Iterator[str]:
    """Serve ``state`` on a free local port; yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            url = urlsplit(self.path)
            size = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(size)) if size else None
            status, data = state.handle(self.command, url.path, parse_qs(url.query),
                                        self.headers.get("Authorization", ""), body)
            payload = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PATCH = _answer

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def job_environ(home: Path, url: str, head: str, *, job: str = "perf",
                event_name: str = "pull_request", event: dict[str, Any] | None = None,
                head_repo: str = REPO, token: str = TOKEN, actor: str = "octocat") -> dict[str, str]:
    """A job's environment on a pull request's event (``event`` replaces the payload), started by
    ``actor``; its summary, output and payload files under ``home``."""
    if event is None:
        pr = {"number": PR, "head": {"sha": head, "repo": {"full_name": head_repo}},
              "base": {"sha": "b" * 40, "ref": "main", "repo": {"full_name": REPO}}}
        event = {"action": "synchronize", "number": PR, "pull_request": pr}
    (home / "event.json").write_text(json.dumps(event))
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "GITHUB_ACTIONS": "true",
            "GITHUB_EVENT_NAME": event_name, "GITHUB_EVENT_PATH": str(home / "event.json"),
            "GITHUB_REPOSITORY": REPO, "GITHUB_API_URL": url, "GITHUB_GRAPHQL_URL": f"{url}/graphql",
            "GITHUB_TOKEN": token, "GITHUB_JOB": job, "GITHUB_SHA": "c" * 40, "GITHUB_ACTOR": actor,
            "GITHUB_STEP_SUMMARY": str(home / "summary.md"), "GITHUB_OUTPUT": str(home / "output")}
