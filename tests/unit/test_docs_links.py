"""The README and docs/ link only to what exists: every relative Markdown link names a file or
folder of the repository, and every anchor into a Markdown file names one of its headings (GitHub's
slugs). The README stays short and keeps the two set-up commands CI looks for."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
README_MAX_LINES = 220
SETUP_COMMANDS = ("bash scripts/run-reference.sh", "bash scripts/test.sh")

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target) or [text](target "title"); images too. Link texts hold no brackets once code
# spans are gone, except one level of nesting, as in [`ABORT-4[n=4]`](...).
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, …
INLINE_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")


def markdown_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans removed."""
    lines: list[str] = []
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(CODE_SPAN.sub("", line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its visible text, lowercase, punctuation other than '-' and
    '_' dropped, each space a '-'."""
    text = INLINE_LINK.sub(r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in ``path``; a repeated heading gets -1, -2, … as on GitHub."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    targets = []
    for line in prose_lines(path.read_text(encoding="utf-8")):
        for match in LINK.finditer(line):
            target = match.group(1)
            if not EXTERNAL.match(target):
                targets.append(target)
    return targets


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def broken_links(path: Path) -> list[str]:
    """``target: why`` for each relative link of ``path`` that names nothing."""
    path = path.resolve()
    broken = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        file_part = unquote(file_part)
        if file_part.startswith("/"):  # GitHub reads these from the repository's root
            linked = ROOT / file_part.lstrip("/")
        else:
            linked = path.parent / file_part if file_part else path
        linked = linked.resolve()
        if not linked.exists():
            broken.append(f"{target}: {shown(linked)} does not exist")
        elif (
            anchor and linked.suffix == ".md" and linked.is_file() and unquote(anchor) not in anchors(linked)
        ):
            broken.append(f"{target}: no heading of {shown(linked)} has the anchor #{anchor}")
    return broken


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(path: Path) -> None:
    assert broken_links(path) == []


def test_the_link_checker_sees_links_and_headings() -> None:
    """The checker is not vacuous: the README links into docs/ and docs/ into itself."""
    assert any(target.startswith("docs/") for target in relative_links(README))
    assert "clause-profiles" in anchors(ROOT / "docs" / "conformance.md")
    assert slug("What the `vllm-engine` dialect costs") == "what-the-vllm-engine-dialect-costs"
    assert slug("GenerateRequest → lmrpc.v1 GenerateRequest") == "generaterequest--lmrpcv1-generaterequest"
    assert slug("The reference server's [dialect](x.md)") == "the-reference-servers-dialect"


def test_the_readme_is_short_and_keeps_the_setup_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    for command in SETUP_COMMANDS:
        assert command in text, f"README.md lost {command!r}, which CI looks for"
