"""Run the clause validators over a recorded stream, after fetching the facts they need."""

from __future__ import annotations

from collections.abc import Iterable

from grpclib.exceptions import GRPCError

import conformance.validate_finish
import conformance.validate_options  # noqa: F401
from conformance.context import Ctx
from conformance.results import Mismatch
from conformance.streams import StreamRecord
from conformance.validate_core import VALIDATORS, Facts
from lmrpc.v1 import TokenizeRequest

STREAM_CLAUSES: tuple[str, ...] = tuple(VALIDATORS)


async def gather_facts(ctx: Ctx, record: StreamRecord, others: Iterable[str] = ()) -> Facts:
    """Tokenize the input and detokenize each output (when the target serves Tokenize)."""
    facts = Facts(ctx.info, others=frozenset(others))
    request = record.request
    if request.token_ids is not None:
        facts.prompt_ids = list(request.token_ids.ids)
    if not ctx.info.has("tokenize"):
        return facts
    try:
        if request.text is not None:
            facts.prompt_ids = await ctx.tokenize(request.text)
        elif request.chat is not None:
            facts.prompt_ids = list((await ctx.rpc("tokenize", TokenizeRequest(chat=request.chat))).token_ids)
        eff = facts.eff(record)
        if eff.return_token_ids:
            for view in record.outputs().values():
                if view.finish is None or not view.text_is_utf8:
                    continue
                ids = view.token_ids
                facts.detok[view.index] = await ctx.detokenize(ids, eff.skip_special_tokens)
                facts.detok_but_last[view.index] = await ctx.detokenize(ids[:-1], eff.skip_special_tokens)
    except GRPCError as exc:
        ctx.note(f"could not gather Tokenize/Detokenize facts: {exc.status.name} {exc.message}")
    return facts


def validate(record: StreamRecord, facts: Facts, clauses: Iterable[str] | None = None) -> list[Mismatch]:
    found: list[Mismatch] = []
    for clause in clauses if clauses is not None else STREAM_CLAUSES:
        found.extend(VALIDATORS[clause](record, facts))
    return found
