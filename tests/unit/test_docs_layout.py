"""One place per fact: every protocol the harness speaks has its page, docs/protocols/<id>.md, which
docs/protocols/README.md links, and docs/conformance.md (the harness as a whole) has no section of
one protocol's own, a heading naming its id in backticks, so per-protocol text does not grow back
there."""

from __future__ import annotations

import re
from pathlib import Path

from conformance.spec.protocols import PROTOCOLS

ROOT = Path(__file__).resolve().parents[2]
PAGES = ROOT / "docs" / "protocols"
HARNESS_DOC = ROOT / "docs" / "conformance.md"
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s")
CODE_SPAN = re.compile(r"`([^`]+)`")


def headings(text: str) -> list[str]:
    """The Markdown headings of ``text`` outside fenced code blocks."""
    found, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and HEADING.match(line):
            found.append(line)
    return found


def protocols_named(heading: str) -> set[str]:
    """The protocol ids that a code span of ``heading`` names as a word (`openai`, `--protocol openai`)."""
    words = {w for span in CODE_SPAN.findall(heading) for w in re.split(r"[\s=]+", span)}
    return words & set(PROTOCOLS)


def test_every_protocol_has_a_page_that_the_index_links() -> None:
    index = (PAGES / "README.md").read_text(encoding="utf-8")
    assert PROTOCOLS
    for protocol in PROTOCOLS:
        assert (PAGES / f"{protocol}.md").is_file(), f"docs/protocols/{protocol}.md is missing"
        link = re.compile(rf"\]\(\s*{re.escape(protocol)}\.md(#[^)\s]*)?\s*\)")
        assert link.search(index), f"docs/protocols/README.md does not link {protocol}.md"


def test_the_harness_doc_has_no_section_of_one_protocol() -> None:
    assert protocols_named("## OpenAI-compatible servers (`--protocol openai`)") == {"openai"}
    found = headings(HARNESS_DOC.read_text(encoding="utf-8"))
    assert found, "docs/conformance.md has no headings"
    named = {h: protocols_named(h) for h in found if protocols_named(h)}
    assert named == {}, "per-protocol sections belong in docs/protocols/<id>.md"
