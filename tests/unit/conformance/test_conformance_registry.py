"""Case selection: globs, levels, pattern files."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.cases import all_cases
from conformance.spec.registry import case, check_requirement, expand_patterns, matches, select


def ids(**kw: object) -> set[str]:
    return {c.id for c in select(all_cases(), **kw)}  # type: ignore[arg-type]


def test_brackets_are_literal_and_clause_ids_match_their_permutations() -> None:
    by_id = {c.id: c for c in all_cases()}
    assert matches("ABORT-4[n=2]", by_id["ABORT-4[n=2]"])
    assert not matches("ABORT-4[n=2]", by_id["ABORT-4[n=4]"])
    assert matches("ABORT-4", by_id["ABORT-4[n=4]"])  # a bare clause ID selects all its cases
    assert matches("abort-*", by_id["ABORT-1[unknown]"])
    assert not matches("ABORT-4", by_id["ABORT-1[unknown]"])


def test_levels() -> None:
    should = ids(level="should")
    must = ids(level="must")
    assert should and must and not should & must
    assert ids(level="all") == should | must


def test_run_and_skip() -> None:
    assert ids(level="all", run=["STREAM-8*"], skip=["*[seeded]"]) == {"STREAM-8", "STREAM-8[greedy]"}


def test_pattern_file(tmp_path: Path) -> None:
    listing = tmp_path / "cases.txt"
    listing.write_text("# known flaky on our GPU\nCANCEL-2*  # deadlines\n\nSTOP-4[eos]\n")
    assert expand_patterns([f"@{listing}", "A,B"]) == ["CANCEL-2*", "STOP-4[eos]", "A", "B"]


def test_case_ids_are_unique_and_stable_prefixes() -> None:
    cases = all_cases()
    assert len({c.id for c in cases}) == len(cases)
    with pytest.raises(ValueError):
        case("NO-SUCH-1")


@pytest.mark.parametrize(
    "typo", ["tokenise", "!stop_string", "max_output>=2", "logprobs|finalonly", "embed>2"]
)
def test_a_misspelt_requirement_is_an_error_at_registration(typo: str) -> None:
    with pytest.raises(ValueError, match="names no Capabilities field"):
        case("TOK-2", tag="typo", requires=(typo,))


def test_every_shipped_requirement_names_a_capability() -> None:
    for c in all_cases():
        for requirement in c.requires:
            assert check_requirement(requirement) == requirement
