"""Pictures for the docs, taken in a real browser: the pull-request comment, the HTML report and the
history page, each rendered by the package from real files and shot by headless Chromium.

Usage: .venv/bin/python scripts/docs-screenshots.py --results RESULTS.json --history HISTORY.db
           [--out docs/img] [--chromium chromium]

The comment is rendered as GitHub renders a comment's Markdown (tables, folded ``<details>``,
code), with a style close to GitHub's; the report and the history page are the package's own HTML.
Needs a Chromium (``apt-get install chromium``); writes ``pr-comment.png``, ``report.png`` and
``history.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import markdown

ROOT = Path(__file__).resolve().parent.parent
PERFBUDGET = [sys.executable, "-m", "perfbudget.cli"]

STYLE = """
body { font: 14px/1.5 -apple-system, "Segoe UI", "DejaVu Sans", Helvetica, Arial, sans-serif; color: #1f2328;
       margin: 0; padding: 24px; background: #f6f8fa; }
.comment { max-width: 900px; margin: auto; background: #fff; border: 1px solid #d0d7de; border-radius: 6px; }
.head { background: #f6f8fa; border-bottom: 1px solid #d0d7de; padding: 8px 16px; color: #59636e;
        border-radius: 6px 6px 0 0; }
.body { padding: 8px 16px 16px; }
h2, h3 { border-bottom: 1px solid #d1d9e0; padding-bottom: .3em; }
table { border-collapse: collapse; margin: 8px 0; display: block; overflow: auto; }
th, td { border: 1px solid #d1d9e0; padding: 4px 10px; }
tr:nth-child(2n) { background: #f6f8fa; }
code { background: rgba(129,139,152,.12); border-radius: 6px; padding: .1em .3em; font-size: 85%;
       font-family: "DejaVu Sans Mono", monospace; }
pre { background: #f6f8fa; padding: 12px; border-radius: 6px; overflow: auto; }
pre code { background: none; padding: 0; }
details { margin: 8px 0; } summary { cursor: pointer; }
"""


def comment_html(results: Path, title: str) -> str:
    """The comment's Markdown, as ``perfbudget report -f comment`` prints it, in a GitHub-like page."""
    text = subprocess.run([*PERFBUDGET, "report", "-f", "comment", "--exit-zero", "--title", title,
                           "--report-url", "https://example.invalid/report.html",
                           "--history-url", "https://example.invalid/history.html", str(results)],
                          check=True, capture_output=True, text=True).stdout
    body = markdown.markdown(text, extensions=["tables", "fenced_code", "md_in_html"])
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><style>{STYLE}</style></head><body>"
            f"<div class='comment'><div class='head'><b>github-actions</b> bot commented</div>"
            f"<div class='body'>{body}</div></div></body></html>")


def shoot(chromium: str, page: Path, png: Path, width: int, height: int) -> None:
    """One screenshot of ``page`` at ``width`` x ``height`` CSS pixels."""
    subprocess.run([chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size={width},{height}", f"--screenshot={png}", page.as_uri()],
                   check=True, capture_output=True, timeout=120)
    print(f"docs-screenshots: wrote {png}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, required=True, help="a perfbudget ab results file")
    p.add_argument("--history", type=Path, required=True, help="a history database")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    p.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    p.add_argument("--title", default="perf")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "comment.html").write_text(comment_html(args.results, args.title), encoding="utf-8")
        shoot(args.chromium, work / "comment.html", args.out / "pr-comment.png", 960, 1100)
        subprocess.run([*PERFBUDGET, "report", "-f", "html", "--exit-zero", "-o", str(work / "report.html"),
                        str(args.results)], check=True)
        shoot(args.chromium, work / "report.html", args.out / "report.png", 1280, 1100)
        subprocess.run([*PERFBUDGET, "history", "report", "--db", str(args.history), "-o",
                        str(work / "history.html")], check=True)
        shoot(args.chromium, work / "history.html", args.out / "history.png", 1280, 1000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
