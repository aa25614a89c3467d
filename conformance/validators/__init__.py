"""Pure functions from a recorded stream (and the facts around it) to the mismatches of one clause.

``validate`` runs them; ``gather_facts`` fetches what they need from outside the stream (Tokenize and
Detokenize answers). Importing this package registers every validator, in report order.
"""

from __future__ import annotations

from collections.abc import Iterable

from grpclib.exceptions import GRPCError

from conformance.harness.context import Ctx
from conformance.harness.outcome import Mismatch
from conformance.stream.record import StreamRecord
from conformance.validators.base import VALIDATORS, Facts
from lmrpc.v1 import TokenizeRequest

# isort: off
# Registration order is the order of the pool cases in every report.
import conformance.validators.structure
import conformance.validators.finish
import conformance.validators.usage
import conformance.validators.options  # noqa: F401

# isort: on

STREAM_CLAUSES: tuple[str, ...] = tuple(VALIDATORS)


async def gather_facts(
    ctx: Ctx, record: StreamRecord, others: Iterable[str] = (), *, aborted: bool = False
) -> Facts:
    """Tokenize the input and detokenize each output (when the target serves Tokenize). ``aborted``:
    the caller aborted or cancelled the request (an ABORTED finish then has a cause, FINISH-7)."""
    facts = Facts(ctx.info, others=frozenset(others), aborted=aborted)
    request = record.request
    if request.token_ids is not None:
        facts.prompt_ids = list(request.token_ids.ids)
    if not ctx.info.has("tokenize"):
        return facts
    try:
        parse = request.parse_special_tokens
        if request.text is not None:
            facts.prompt_ids = await ctx.tokenize(request.text, parse_special_tokens=parse)
        elif request.chat is not None:
            tokenize = TokenizeRequest(chat=request.chat, parse_special_tokens=parse)
            facts.prompt_ids = list((await ctx.call(ctx.control.tokenize, tokenize)).token_ids)
        eff = facts.eff(record)
        if eff.return_token_ids:
            for view in record.outputs().values():
                if view.finish is None or not view.text_is_utf8:
                    continue
                ids = view.token_ids
                facts.detok[view.index] = await ctx.detokenize(ids, eff.skip_special_tokens)
                facts.detok_but_last[view.index] = await ctx.detokenize(ids[:-1], eff.skip_special_tokens)
                if eff.stop_strings and eff.min_tokens > 1:
                    facts.detok_before_min[view.index] = await ctx.detokenize(
                        ids[: eff.min_tokens - 1], eff.skip_special_tokens
                    )
    except GRPCError as exc:
        ctx.note(f"could not gather Tokenize/Detokenize facts: {exc.status.name} {exc.message}")
    return facts


def validate(record: StreamRecord, facts: Facts, clauses: Iterable[str] | None = None) -> list[Mismatch]:
    """The mismatches of ``clauses``: each validator's, and the protocol driver's findings filed
    under that clause (breaks of an engine protocol's own semantics, ``conformance.drivers``)."""
    found: list[Mismatch] = []
    for clause in clauses if clauses is not None else STREAM_CLAUSES:
        found.extend(VALIDATORS[clause](record, facts))
        found.extend(Mismatch(f.what, f.want, f.got) for f in record.findings if f.clause == clause)
    return found
