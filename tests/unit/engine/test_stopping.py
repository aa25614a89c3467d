"""The token-level stop rules both engines share (reference_server/engine/stopping.py)."""

from __future__ import annotations

from reference_server.engine.stopping import finish_after, suppressed_ids
from reference_server.ipc import Finish, StoppingConfig

EOS = frozenset({2, 7})


def stopping(**kw: object) -> StoppingConfig:
    fields: dict[str, object] = {"max_tokens": 4, "min_tokens": 0, "stop_token_ids": (), "ignore_eos": False}
    return StoppingConfig(**(fields | kw))  # type: ignore[arg-type]


def finish(config: StoppingConfig, token_id: int, n: int, *, context: int = 100) -> Finish | None:
    return finish_after(
        config, EOS, token_id, num_output_tokens=n, num_tokens=10 + n, max_context_tokens=context
    )


def test_a_stop_token_that_is_also_eos_reports_the_stop_token() -> None:
    assert finish(stopping(stop_token_ids=(7,)), 7, 1) == Finish("stop", stop_token_id=7)
    assert finish(stopping(), 7, 1) == Finish("stop", eos_token_id=7)


def test_ignore_eos_makes_eos_an_ordinary_token() -> None:
    assert finish(stopping(ignore_eos=True), 2, 1) is None
    assert finish(stopping(ignore_eos=True, stop_token_ids=(2,)), 2, 1) == Finish("stop", stop_token_id=2)


def test_a_stop_condition_beats_length_on_the_same_token() -> None:
    assert finish(stopping(max_tokens=3), 2, 3) == Finish("stop", eos_token_id=2)
    assert finish(stopping(max_tokens=3), 5, 3) == Finish("length")
    assert finish(stopping(max_tokens=3), 5, 2) is None


def test_a_full_context_window_ends_with_length() -> None:
    assert finish(stopping(max_tokens=50), 5, 2, context=12) == Finish("length")
    assert finish(stopping(max_tokens=50), 5, 1, context=12) is None


def test_min_tokens_suppresses_stop_tokens_and_eos_unless_ignored() -> None:
    config = stopping(min_tokens=3, stop_token_ids=(9,))
    assert suppressed_ids(config, EOS, 0) == (9, 2, 7)
    assert suppressed_ids(config, EOS, 2) == (9, 2, 7)
    assert suppressed_ids(config, EOS, 3) == ()
    assert suppressed_ids(stopping(min_tokens=3, stop_token_ids=(9,), ignore_eos=True), EOS, 1) == (9,)


def test_a_complete_constraint_ends_with_its_eos_whatever_ignore_eos_says() -> None:
    def done(config: StoppingConfig, token_id: int) -> Finish | None:
        return finish_after(
            config, EOS, token_id, num_output_tokens=1, num_tokens=11, max_context_tokens=100,
            constraint_complete=True,
        )  # fmt: skip

    assert done(stopping(ignore_eos=True), 2) == Finish("stop", eos_token_id=2)
    assert done(stopping(ignore_eos=True, min_tokens=3), 7) == Finish("stop", eos_token_id=7)
    assert done(stopping(stop_token_ids=(2,)), 2) == Finish("stop", stop_token_id=2)  # FINISH-5 still
