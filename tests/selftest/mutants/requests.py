"""Mutants that only change what the upstream server is asked: an option silently dropped or altered.
Each is a fault no case of contract revision 1 sent the input for (issue 13, "an input the cases never
send")."""

from __future__ import annotations

from collections.abc import AsyncIterator

from grpclib import GRPCError, Status

from lmrpc.v1 import GenerateRequest, GenerateResponse, ResponseOptions

from ..proxy import Call, Out
from .base import Mutant
from .control_rpcs import RequestRewrite

KNOWN_ROLES = ("system", "user", "assistant")


class GenerationPromptIgnored(RequestRewrite):
    name = "generation-prompt-ignored"
    fault = "ChatInput.add_generation_prompt=false is ignored by Generate (Tokenize honours it)"
    expected = frozenset({"SAMPLE-8[add_generation_prompt]", "TOK-1", "USAGE-2"})

    def edit(self, request: GenerateRequest) -> None:
        if request.chat is not None:
            request.chat.add_generation_prompt = None


class UnknownRoleRewritten(RequestRewrite):
    name = "unknown-role-rewritten"
    fault = "Generate renders a chat role the template does not name as 'user' (Tokenize does not)"
    expected = frozenset({"TOK-1[unknown-role]"})

    def edit(self, request: GenerateRequest) -> None:
        for message in request.chat.messages if request.chat is not None else []:
            if message.role not in KNOWN_ROLES:
                message.role = "user"


class StopTokensDroppedForN(RequestRewrite):
    name = "stop-tokens-dropped-for-n"
    fault = "stop_token_ids are dropped from a request of several outputs"
    expected = frozenset({"STOP-3[n=2]"})
    triggered_by = frozenset({"generate.stop_token_ids"})  # a generated request may hold both

    def edit(self, request: GenerateRequest) -> None:
        several = request.sampling is not None and (request.sampling.n or 1) > 1
        if several and request.stopping is not None:
            request.stopping.stop_token_ids = []


class MinTokensNeedMaxTokens(RequestRewrite):
    name = "min-tokens-need-max-tokens"
    fault = "min_tokens is dropped when max_tokens is absent"
    expected = frozenset({"STOP-5[no-max-tokens]"})

    def edit(self, request: GenerateRequest) -> None:
        if request.stopping is not None and request.stopping.max_tokens is None:
            request.stopping.min_tokens = None


class PenaltiesIgnored(RequestRewrite):
    name = "penalties-ignored"
    fault = "penalties is advertised but frequency, presence and repetition penalties are dropped"
    expected = frozenset({"CAP-2[penalties]"})

    def edit(self, request: GenerateRequest) -> None:
        s = request.sampling
        if s is None:
            return
        if s.frequency_penalty is not None and -2 <= s.frequency_penalty <= 2:
            s.frequency_penalty = None  # values outside SAMPLE-5's range are still rejected
        if s.presence_penalty is not None and -2 <= s.presence_penalty <= 2:
            s.presence_penalty = None
        if s.repetition_penalty is not None and 0 < s.repetition_penalty <= 10:
            s.repetition_penalty = None


class IncludeStopTokenDropped(RequestRewrite):
    name = "include-stop-token-dropped"
    fault = "include_stop_in_output is honoured for stop strings only: a stop token's text is dropped"
    expected = frozenset({"STOP-7[stop-token]"})

    def edit(self, request: GenerateRequest) -> None:
        stopping = request.stopping
        if stopping is not None and stopping.stop_token_ids and not stopping.stop_strings:
            stopping.include_stop_in_output = False


class IncludeStopIgnoresEos(RequestRewrite):
    name = "include-stop-ignores-eos"
    fault = "with skip_special_tokens=false, include_stop_in_output still drops a matched EOS token's text"
    expected = frozenset({"STOP-7[eos]"})

    def edit(self, request: GenerateRequest) -> None:
        response, stopping = request.response, request.stopping
        if response is not None and response.skip_special_tokens is False and stopping is not None:
            stopping.include_stop_in_output = False


class StopListTruncated(RequestRewrite):
    name = "stop-list-truncated"
    fault = "only the first two stop strings of a request are matched"
    expected = frozenset({"STOP-2[later-entry]"})
    # may also fail: whether a pooled stream's third or fourth stop string matches first is the text's
    tolerated = frozenset({"STREAM-4", "STOP-1*"})

    def edit(self, request: GenerateRequest) -> None:
        if request.stopping is not None and len(request.stopping.stop_strings) <= 4:  # more: SAMPLE-5's
            request.stopping.stop_strings = request.stopping.stop_strings[:2]


class ChatSpecialTokensParsed(RequestRewrite):
    name = "chat-special-tokens-parsed"
    fault = "special-token strings in chat message content become special tokens (prompt injection)"
    expected = frozenset({"REQ-8[chat-content]"})

    def edit(self, request: GenerateRequest) -> None:
        if request.chat is not None and request.parse_special_tokens is None:
            request.parse_special_tokens = True


class TopLogprobsImpliesReturn(RequestRewrite):
    name = "top-logprobs-implies-return"
    fault = (
        "top_logprobs > 0 without return_logprobs is accepted (logprobs are turned on) instead of rejected"
    )
    expected = frozenset({"SAMPLE-5[top_logprobs-without-return_logprobs]"})

    def edit(self, request: GenerateRequest) -> None:
        response = request.response
        if response is not None and response.top_logprobs and not response.return_logprobs:
            response.return_logprobs = True


class SkipSpecialDefaultFalse(RequestRewrite):
    name = "skip-special-default-false"
    fault = "skip_special_tokens absent is read as false: special tokens show up in the text"
    expected = frozenset({"SAMPLE-8[skip_special_tokens]"})
    # may also fail: whether a pooled or learned output contains a special token is the prompt's
    tolerated = frozenset({"STREAM-4", "STOP-*", "STREAM-8*", "TOK-2", "FINISH-5*"})

    def edit(self, request: GenerateRequest) -> None:
        request.response = request.response or ResponseOptions()
        if request.response.skip_special_tokens is None:
            request.response.skip_special_tokens = False


class StopStringsBeforeMinTokens(RequestRewrite):
    name = "stop-strings-before-min-tokens"
    fault = "min_tokens is dropped when the request has stop strings (a match before it ends the output)"
    expected = frozenset({"STOP-2[before-min-tokens]"})
    tolerated = frozenset({"STREAM-4", "USAGE-5"})  # when a pooled stream's stop string matches early

    def edit(self, request: GenerateRequest) -> None:
        if request.stopping is not None and request.stopping.stop_strings:
            request.stopping.min_tokens = None


class LogprobsWithNRefused(Mutant):
    name = "logprobs-with-n-refused"
    fault = "n > 1 together with return_logprobs is refused, though both are advertised (each alone works)"
    expected = frozenset({"CAP-2[combined]"})
    triggered_by = frozenset({"generate.return_logprobs"})  # the property cases that drew both fail too

    def rewrite_request(self, request: GenerateRequest) -> GenerateRequest:
        n = request.sampling.n if request.sampling is not None else None
        if (n or 1) > 1 and request.response is not None and request.response.return_logprobs:
            raise GRPCError(Status.INVALID_ARGUMENT, "return_logprobs is not supported with n > 1")
        return request


class OutputStreamsShiftWithN(Mutant):
    name = "output-streams-shift-with-n"
    fault = "output i of an n>1 request samples from (seed + n, i), so the same seed gives other outputs for another n"
    expected = frozenset({"SAMPLE-3[first-of-n]", "SAMPLE-3[per-output]", "SAMPLE-4[picked-n]"})

    def rewrite_request(self, request: GenerateRequest) -> GenerateRequest:
        sampling = request.sampling
        if sampling is not None and (sampling.n or 1) > 1 and sampling.seed is not None:
            sampling.seed = (sampling.seed + sampling.n) % 2**63
        return request

    async def transform(self, call: Call, events: AsyncIterator[GenerateResponse]) -> AsyncIterator[Out]:
        sent = call.original.sampling.seed if call.original and call.original.sampling else None
        async for event in events:
            if event.prompt_info is not None and sent is not None:
                event.prompt_info.seed = sent  # the seed in effect is still reported as the request's
            yield event


REQUEST_MUTANTS: tuple[type[Mutant], ...] = (
    OutputStreamsShiftWithN,
    StopStringsBeforeMinTokens,
    GenerationPromptIgnored,
    UnknownRoleRewritten,
    MinTokensNeedMaxTokens,
    StopTokensDroppedForN,
    PenaltiesIgnored,
    IncludeStopTokenDropped,
    IncludeStopIgnoresEos,
    StopListTruncated,
    ChatSpecialTokensParsed,
    TopLogprobsImpliesReturn,
    SkipSpecialDefaultFalse,
    LogprobsWithNRefused,
)
