"""The runnable examples of a Markdown page: its fenced shell and Python blocks, in order, as one script.

A page's blocks run as one shell session, as a reader would type them: variables and background processes
of one block are there for the next. A ``python`` block is run with the environment's ``python`` as one module
with the page's earlier Python blocks before it, as a tutorial builds a module step by step (a page of
independent Python blocks must therefore not redefine what an earlier one defined). A ``console`` block runs its ``$ `` lines (with their ``\\`` continuations); its other lines are
output to read, not checked. Other blocks (``json``, ``text``, plain) are not run.

Every ``curl`` reports its answer's status: an answer of 400 or more fails the page's examples unless the page
says ``<!-- example: shows error answers -->`` (then only 5xx does), and so does a URL the API has no route for.

A block preceded by ``<!-- example: not-run "why" -->`` is not run; the reason must say what it needs that a
test machine lacks (Docker, a second database server) or why running it makes no sense (the test suite itself).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

RUNNABLE = {"sh", "bash", "console", "python"}
FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
NOT_RUN = re.compile(r'<!-- example: not-run "([^"]+)" -->\s*$')


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    code: str
    not_run: str | None  # the reason, when the page says not to run it

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = NOT_RUN.match(before.strip())
        found.append(Block(page, text.count("\n", 0, match.start()) + 1, match.group(1), match.group(2),
                           marker.group(1) if marker else None))
    return found


def runnable(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.language in RUNNABLE and b.not_run is None]


def console_commands(code: str) -> str:
    commands, continuing = [], False
    for line in code.splitlines():
        if line.startswith("$ "):
            commands.append(line[2:])
            continuing = line.endswith("\\")
        elif continuing:
            commands.append(line)
            continuing = line.endswith("\\")
    return "\n".join(commands) + "\n"


# Every curl of a page reports its status and URL on stderr (the page's output is unchanged), so that an example
# answered 5xx, or naming a route the server does not have, fails although curl itself exits 0.
CURL_REPORTS = """curl() { command curl --write-out '%{stderr}\\ncurl-status: %{http_code} %{url_effective}\\n' "$@"; }"""
CURL_STATUS = re.compile(r"^curl-status: (\d{3}) (\S+)$", re.MULTILINE)


def curl_statuses(output: str) -> list[tuple[int, str]]:
    return [(int(code), url) for code, url in CURL_STATUS.findall(output)]


def _as_module(blocks_so_far: list[str]) -> str:
    """The blocks as one module: their ``from __future__`` imports first, as Python requires."""
    text = "\n\n".join(blocks_so_far)
    future = sorted(set(re.findall(r"^from __future__ import .+$", text, flags=re.MULTILINE)))
    return "\n".join(future) + "\n" + re.sub(r"^from __future__ import .+$", "", text, flags=re.MULTILINE)


def script(page_blocks: list[Block], folder: Path) -> str:
    """One bash script running the blocks in order; a failing command stops it, naming its block."""
    parts = ["set -eo pipefail", 'trap \'echo "example failed: $EXAMPLE_BLOCK" >&2\' ERR', CURL_REPORTS]
    module: list[str] = []
    for n, block in enumerate(page_blocks):
        parts.append(f"EXAMPLE_BLOCK='{block.where} ({block.language})'")
        parts.append(f"echo '>>> {block.where}' >&2")
        if block.language == "python":
            module.append(f"# {block.where}\n{block.code}")
            source = folder / f"example_{n}.py"
            source.write_text(_as_module(module))
            parts.append(f"python {source}")
        elif block.language == "console":
            parts.append(console_commands(block.code))
        else:
            parts.append(block.code)
    parts.append("echo '>>> every example ran' >&2")
    return "\n".join(parts) + "\n"
