"""Options a server refuses by design, learned before the cases where its protocol leaves them open.

vLLM refuses several outputs at temperature 0 ("n must be 1 when using greedy sampling"), with a
clean INVALID_ARGUMENT. lmrpc.v1's contract accepts them (SAMPLE-1, SAMPLE-2), so an lmrpc.v1
server is never asked; in the engine protocols the refusal is learned once, the cases that need the
option skip with the server's answer, and generated requests sample when they ask for several outputs.
The OpenAI profile learns the same with its other options (drivers/openai/support.py).
"""

from __future__ import annotations

from conformance.harness.context import Ctx
from conformance.harness.requests import request
from conformance.harness.session import Session
from conformance.stream.record import End
from conformance.vocabulary import GREEDY_N


async def learn_refusals(session: Session) -> None:
    if not session.wire.learns_refusals or session.info.caps.max_outputs < 2:
        return
    ctx = Ctx(session, "refusals", {})
    try:
        record = await ctx.answer(request(ctx, max_tokens=1, n=2, temperature=0.0))
    finally:
        await ctx.close()
    if record.end is End.STATUS and not record.events and record.status is not None:
        session.info.refusals[GREEDY_N] = f"{record.status.name}: {record.status_message}"
