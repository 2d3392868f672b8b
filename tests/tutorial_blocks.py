"""The tutorial's blocks (docs/tutorial/), read from its Markdown in the reader's order, each
with what the reader is told to do with it (docs/tutorial/index.md, "How to read the blocks"):

- a shell block (```` ```sh ````, or ```` ```{code-block} sh ```` without a caption): run it,
  in order, in one terminal at the repository's root;
- a block captioned "In another terminal ..." (it has a ``:name:``): start it and leave it
  running; one named ``<name>-again`` starts ``<name>`` again (after Ctrl-C in its terminal);
- a block whose caption is a relative path (in backticks): write that file with exactly
  this content;
- a ``text`` block: what a command prints, not run; one with a ``:name:`` is a step the
  reader takes in the browser, which the test takes over HTTP as the reader would.

Any other block is refused, so no block is left out of the run unnoticed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

FENCE = "```"
BACKGROUND = "In another terminal"
FILE_PATH = re.compile(r"^[\w.][\w./-]*$")
# The order the reader takes the pages in: the index's toctree.
TOCTREE_ENTRY = re.compile(r"^([a-z][\w-]*)$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    language: str
    text: str
    options: dict[str, str] = field(default_factory=dict)

    @property
    def caption(self) -> str:
        # A file's path is shown as code (`shop/__init__.py`: bare, its underscores would be
        # read as Markdown's emphasis).
        return self.options.get("caption", "").strip("`")

    @property
    def name(self) -> str:
        return self.options.get("name", "")

    @property
    def kind(self) -> str:
        """``shell``, ``background``, ``file``, ``browser`` or ``shown``."""
        if self.language == "text":
            return "browser" if self.name else "shown"
        if self.caption.startswith(BACKGROUND):
            if self.language != "sh" or not self.name:
                raise ValueError(f"{self.where}: a background block is `sh` with a :name:")
            return "background"
        if self.caption:
            if not FILE_PATH.match(self.caption) or ".." in self.caption:
                raise ValueError(f"{self.where}: caption {self.caption!r} is not a file path")
            return "file"
        if self.language == "sh":
            return "shell"
        raise ValueError(f"{self.where}: a {self.language} block the tutorial test cannot run")

    @property
    def where(self) -> str:
        return f"docs/tutorial/{self.page}:{self.line}"


def pages_in_order(tutorial: Path) -> list[str]:
    """The pages the index's toctree lists, in its order."""
    lines = (tutorial / "index.md").read_text().splitlines()
    start = lines.index(FENCE + "{toctree}")
    names: list[str] = []
    for line in lines[start + 1 :]:
        if line == FENCE:
            break
        if TOCTREE_ENTRY.match(line):
            names.append(f"{line}.md")
    return names


def blocks_of(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith(FENCE):
            i += 1
            continue
        info = line[len(FENCE) :].strip()
        opened = i + 1
        end = lines.index(FENCE, i + 1)
        body = lines[i + 1 : end]
        i = end + 1
        if info == "{toctree}":
            continue
        directive = info.startswith("{code-block}")
        language = info.removeprefix("{code-block}").strip()
        options: dict[str, str] = {}
        if directive:
            while body and body[0].startswith(":"):
                key, _, value = body.pop(0)[1:].partition(":")
                options[key.strip()] = value.strip()
            if body and not body[0].strip():
                body.pop(0)
        if not language:
            raise ValueError(f"docs/tutorial/{page.name}:{opened}: a block without a language")
        found.append(Block(page.name, opened, language, "\n".join(body) + "\n", options))
    return found


def tutorial_blocks(tutorial: Path) -> list[Block]:
    blocks = [b for name in pages_in_order(tutorial) for b in blocks_of(tutorial / name)]
    blocks = blocks_of(tutorial / "index.md") + blocks
    for block in blocks:
        block.kind  # noqa: B018  (refuses a block of no known kind, naming where it is)
    return blocks
