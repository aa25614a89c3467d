"""What the stream validators need from outside the stream: the prompt's token ids and each
output's detokenized text, fetched with the case's own Tokenize and Detokenize calls."""

from __future__ import annotations

from collections.abc import Iterable

from grpclib.exceptions import GRPCError

from conformance.harness.context import Ctx
from conformance.stream.record import StreamRecord
from conformance.validators.base import Facts
from lmrpc.v1 import TokenizeRequest


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
