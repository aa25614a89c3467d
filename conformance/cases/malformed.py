"""Malformed requests (MALFORMED-1..4): bytes that are not valid protobuf, unknown fields and groups,
length prefixes over the limit, and calls carrying the wrong number of messages. The bodies are
sent as raw bytes (``ctx.call_raw``) or frame by frame over HTTP/2 (``H2Call``)."""

from __future__ import annotations

import struct

from grpclib.const import Status

from conformance.harness.context import Ctx
from conformance.search.malformed import named_faults, unknown_group
from conformance.spec.descriptors import message_descriptor
from conformance.spec.registry import Variant, case
from conformance.stream.h2call import H2Call, H2Result, frame
from conformance.stream.wire import length_field, write_varint
from conformance.vocabulary import CaseSkipped
from lmrpc.v1 import (
    ChatInput,
    ChatMessage,
    GenerateRequest,
    GenerateResponse,
    ResponseOptions,
    StoppingCriteria,
    TokenIds,
    TokenizeRequest,
    TokenizeResponse,
)

GENERATE = "/lmrpc.v1.InferenceService/Generate"
GET_LOAD = "/lmrpc.v1.ControlService/GetLoad"
TOKENIZE = "/lmrpc.v1.ControlService/Tokenize"
ABORT = "/lmrpc.v1.ControlService/Abort"
RPCS = (  # request message type, method, capability it needs
    Variant({"type": "GenerateRequest", "path": GENERATE}, tag="GenerateRequest"),
    Variant({"type": "AbortRequest", "path": ABORT}, tag="AbortRequest"),
    Variant(
        {"type": "TokenizeRequest", "path": "/lmrpc.v1.ControlService/Tokenize"},
        tag="TokenizeRequest",
        requires=("tokenize",),
    ),
    Variant(
        {"type": "DetokenizeRequest", "path": "/lmrpc.v1.ControlService/Detokenize"},
        tag="DetokenizeRequest",
        requires=("tokenize",),
    ),
    Variant(
        {"type": "EmbedRequest", "path": "/lmrpc.v1.InferenceService/Embed"},
        tag="EmbedRequest",
        requires=("embed",),
    ),
)


@case("MALFORMED-1", variants=RPCS)
async def malformed_fields(ctx: Ctx) -> None:
    """Every way a field can be malformed is INVALID_ARGUMENT, no messages, naming the field."""
    type_name, path = str(ctx.params["type"]), str(ctx.params["path"])
    for fault in named_faults(message_descriptor(f"lmrpc.v1.{type_name}")):
        outcome = await ctx.call_raw(path, fault.body)
        what = f"{type_name} with {fault.name}"
        if not ctx.check.that(
            outcome.status is Status.INVALID_ARGUMENT and not outcome.replies,
            what,
            "INVALID_ARGUMENT and no messages",
            f"{outcome.code} after {len(outcome.replies)} messages: {outcome.message}",
        ):
            continue
        if fault.field is not None:
            ctx.check.that(
                fault.field in outcome.message,
                f"status message for {what}",
                f"names {fault.field!r}",
                outcome.message,
            )


@case("MALFORMED-2", requires=("token_ids_input",))
async def unknown_fields_and_groups(ctx: Ctx) -> None:
    """Unknown fields are ignored and an unknown group is skipped whole, never read as fields."""
    ids = [min(7, ctx.info.vocab_size - 1), min(11, ctx.info.vocab_size - 1)]
    valid = bytes(
        GenerateRequest(
            request_id=ctx.uid(),
            token_ids=TokenIds(ids=ids),
            stopping=StoppingCriteria(max_tokens=1),
            response=ResponseOptions(return_prompt_token_ids=True),
        )
    )
    injected = length_field(2, b"text that must not become the prompt")  # field 2 is `text`
    for label, body in (
        (
            "an unknown varint and an unknown string",
            valid + write_varint(3001 << 3) + b"\x01" + length_field(3002, b"?"),
        ),
        ("an unknown group wrapping a `text` field", valid + unknown_group(injected)),
    ):
        outcome = await ctx.call_raw(GENERATE, body)
        if not ctx.check.that(
            outcome.status is None and bool(outcome.replies),
            f"Generate with {label}",
            "accepted, OK",
            outcome.code,
        ):
            continue
        info = GenerateResponse.parse(outcome.replies[0]).prompt_info
        got = list(info.prompt_token_ids) if info is not None else None
        ctx.check.equal(f"prompt of the Generate with {label}", ids, got)


def _unknown_varint_and_string() -> bytes:
    return write_varint(3001 << 3) + b"\x01" + length_field(3002, b"?")


@case("MALFORMED-2", tag="nested", requires=("tokenize", "chat_input"))
async def unknown_fields_in_nested_messages(ctx: Ctx) -> None:
    """Unknown fields and groups are ignored inside nested messages and on unary calls too: a Tokenize of
    a chat whose message carries unknown fields and a group wrapping a `content` field, beside a
    top-level group wrapping a `text` field, tokenizes exactly as the clean chat."""
    said = ChatMessage(role="user", content="Say hi.")
    clean = TokenizeRequest(chat=ChatInput(messages=[said], add_generation_prompt=True))
    message = (  # ChatMessage field 2 is `content`
        bytes(said) + _unknown_varint_and_string() + unknown_group(length_field(2, b"content never said"))
    )
    chat = length_field(1, message) + bytes(ChatInput(add_generation_prompt=True))
    body = (  # TokenizeRequest field 2 is `chat`, field 1 `text`
        length_field(2, chat)
        + _unknown_varint_and_string()
        + unknown_group(length_field(1, b"text never sent"))
    )
    want = list((await ctx.call(ctx.control.tokenize, clean)).token_ids)
    outcome = await ctx.call_raw(TOKENIZE, body)
    if ctx.check.that(
        outcome.status is None and len(outcome.replies) == 1,
        "Tokenize with unknown fields and groups in a chat message and around it",
        "OK, one reply",
        f"{outcome.code} after {len(outcome.replies)} messages: {outcome.message}",
    ):
        got = list(TokenizeResponse.parse(outcome.replies[0]).token_ids)
        ctx.check.equal("its token ids against the clean chat's", want, got)


def _limits_or_skip(ctx: Ctx) -> None:
    if ctx.info.server.limits is None:
        raise CaseSkipped("the server reports no ServerInfo.limits (contract revision 1)")


async def _h2(ctx: Ctx) -> H2Call:
    endpoint = ctx.session.target.endpoint
    call = H2Call(endpoint.host, endpoint.port, tls=endpoint.ssl_context())
    await call.__aenter__()
    return call


def _metadata(ctx: Ctx) -> dict[str, str]:
    token = ctx.session.target.endpoint.credentials.token
    return {"authorization": f"Bearer {token}"} if token else {}


def _status(result: H2Result) -> str:
    """The call's gRPC status; a server may follow it with RST_STREAM(NO_ERROR) to stop the upload."""
    if result.status is not None:
        return f"{result.status.name}: {result.message}"
    return f"stream reset (error code {result.reset})" if result.reset is not None else "no status"


async def _connection_lives_on(ctx: Ctx, call: H2Call) -> None:
    """A GetLoad on the same HTTP/2 connection as the refused call is answered OK."""
    call.next_call()
    call.start(GET_LOAD, metadata=_metadata(ctx))
    call.send(frame(b""), end=True)
    try:
        after = await call.wait(ctx.budgets.rpc_s)
        ctx.check.equal("GetLoad on the same connection afterwards", "OK", _status(after).split(":")[0])
    except TimeoutError:
        ctx.check.fail("GetLoad on the same connection afterwards", "OK", "no answer")


@case("MALFORMED-3")
async def length_prefix_over_the_limit(ctx: Ctx) -> None:
    """A length prefix over max_message_bytes is RESOURCE_EXHAUSTED before the body; the connection lives on."""
    _limits_or_skip(ctx)
    limit = int(ctx.info.server.limits.max_message_bytes) if ctx.info.server.limits else 0
    if not 0 < limit < 0xFFFFFFFF:
        raise CaseSkipped(f"ServerInfo.limits.max_message_bytes={limit} leaves no length to go over")
    call = await _h2(ctx)
    try:
        call.start(GENERATE, metadata=_metadata(ctx))
        call.send(struct.pack(">BI", 0, limit + 1) + b"\x00" * 1024)  # the body never comes
        ctx.note(f"sent a prefix declaring {limit + 1} bytes, then 1024 bytes, and waited")
        try:
            result = await call.wait(ctx.budgets.rpc_s)
        except TimeoutError:
            ctx.check.fail(
                "a prefix over the limit, body not sent", "RESOURCE_EXHAUSTED at once", "no answer"
            )
            return
        ctx.check.equal(
            "a prefix over the limit, body not sent", "RESOURCE_EXHAUSTED", _status(result).split(":")[0]
        )
        await _connection_lives_on(ctx, call)
    finally:
        await call.__aexit__()


@case("MALFORMED-3", tag="unary")
async def length_prefix_over_the_limit_unary(ctx: Ctx) -> None:
    """A unary call (Abort) whose length prefix declares the most a prefix can (4 GiB - 1) and is followed
    by no byte at all is RESOURCE_EXHAUSTED at once; the connection lives on."""
    _limits_or_skip(ctx)
    limit = int(ctx.info.server.limits.max_message_bytes) if ctx.info.server.limits else 0
    if not 0 < limit < 0xFFFFFFFF:
        raise CaseSkipped(f"ServerInfo.limits.max_message_bytes={limit} leaves no length to go over")
    call = await _h2(ctx)
    what = "an Abort whose prefix declares 4 GiB - 1 bytes, nothing after it"
    try:
        call.start(ABORT, metadata=_metadata(ctx))
        call.send(struct.pack(">BI", 0, 0xFFFFFFFF))
        try:
            result = await call.wait(ctx.budgets.rpc_s)
        except TimeoutError:
            ctx.check.fail(what, "RESOURCE_EXHAUSTED at once", "no answer")
            return
        ctx.check.equal(what, "RESOURCE_EXHAUSTED", _status(result).split(":")[0])
        await _connection_lives_on(ctx, call)
    finally:
        await call.__aexit__()


FRAMINGS = (
    Variant({"body": frame(b"") * 2, "end": True, "want": "INVALID_ARGUMENT"}, tag="two-messages"),
    Variant({"body": b"", "end": True, "want": "INVALID_ARGUMENT"}, tag="no-message"),
    Variant(
        {"body": frame(b"\x08\x01", length=12), "end": True, "want": "INVALID_ARGUMENT"}, tag="ends-inside"
    ),
    Variant({"body": frame(b"", flag=1), "end": True, "want": "UNIMPLEMENTED"}, tag="compressed"),
)


@case("MALFORMED-4", variants=FRAMINGS)
async def framing(ctx: Ctx) -> None:
    """A unary call with no message, two, one cut short, or a compressed one: the contract's status."""
    call = await _h2(ctx)
    try:
        call.start(GET_LOAD, metadata=_metadata(ctx))
        body = ctx.params["body"]
        assert isinstance(body, bytes)
        call.send(body, end=bool(ctx.params["end"]))
        try:
            result = await call.wait(ctx.budgets.rpc_s)
        except TimeoutError:
            ctx.check.fail(f"GetLoad framed as {ctx.case_id}", ctx.params["want"], "no answer")
            return
        got = _status(result)
        ctx.check.equal(f"GetLoad framed as {ctx.case_id} ({got})", ctx.params["want"], got.split(":")[0])
        ctx.check.equal("messages in reply", 0, len(result.messages()))
    finally:
        await call.__aexit__()
