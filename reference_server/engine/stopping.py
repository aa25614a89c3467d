"""When an output ends, and which tokens it may not sample yet: the token-level stop rules of
docs/contract.md (STOP-3, STOP-4, STOP-5, FINISH-5, FINISH-6, CONSTRAIN-1), written once for every
engine.

The fake engine, which the integration tests and the conformance zoo run on, uses these rules too,
so the tests exercise the rules the model engine serves. Stop strings are text and are matched by
the detokenizer (``detokenizer/stops.py``).
"""

from __future__ import annotations

from collections.abc import Collection

from reference_server.ipc import Finish, StoppingConfig


def suppressed_ids(
    stopping: StoppingConfig, eos_ids: Collection[int], num_output_tokens: int
) -> tuple[int, ...]:
    """Token ids an output may not sample now (STOP-5): while it has fewer than ``min_tokens`` tokens,
    its stop tokens and, unless ``ignore_eos``, the EOS tokens. With ``ignore_eos`` an EOS token is an
    ordinary token, so it is not suppressed."""
    if num_output_tokens >= stopping.min_tokens:
        return ()
    eos = () if stopping.ignore_eos else tuple(sorted(eos_ids))
    return (*stopping.stop_token_ids, *eos)


def finish_after(
    stopping: StoppingConfig,
    eos_ids: Collection[int],
    token_id: int,
    *,
    num_output_tokens: int,
    num_tokens: int,
    max_context_tokens: int,
    constraint_complete: bool = False,
) -> Finish | None:
    """Whether the token just appended (the output now has ``num_output_tokens`` tokens, prompt and
    output ``num_tokens``) ends the output. A requested stop token beats EOS (FINISH-5), and a stop
    condition beats LENGTH when one token meets both. ``constraint_complete``: the output's grammar
    took this token as its EOS, which ends the output whatever ``ignore_eos`` says (CONSTRAIN-1)."""
    if token_id in stopping.stop_token_ids:
        return Finish("stop", stop_token_id=token_id)
    if constraint_complete or (token_id in eos_ids and not stopping.ignore_eos):
        return Finish("stop", eos_token_id=token_id)
    if num_output_tokens >= stopping.max_tokens or num_tokens >= max_context_tokens:
        return Finish("length")
    return None
