"""ChatComplete and Complete: OpenAI chat and text completions as JSON, through lmrpc.v1 Generate.

The request body is what ``POST /v1/chat/completions`` or ``/v1/completions`` takes (with
SGLang's extra sampling parameters); the chat messages go through the model's chat template,
the one prompt encoder every protocol uses (``frontend/prompts.py``). The answer is what the
OpenAI API returns:

- ``stream: true``: one ``chat.completion.chunk`` / ``text_completion`` object per chunk (a chat
  opens every choice with ``{"role": "assistant", "content": ""}``; every choice ends with a
  chunk carrying its ``finish_reason``), then, with ``stream_options.include_usage``, one chunk
  with empty ``choices`` and the ``usage``; the RPC's last message is an empty chunk with
  ``finished = true`` (SGLang's end of stream);
- otherwise: one ``chat.completion`` / ``text_completion`` object with every choice and the usage,
  in one message with ``finished = true``.

``finish_reason`` is ``stop``, ``length`` or, as in SGLang, ``abort``; each finished choice also
carries SGLang's ``matched_stop`` (the stop string, or the stop or EOS token id). ``id`` is the
request id (``rid`` when the body names one), so Abort can name an OpenAI request too.
``response_format`` (chat) and SGLang's ``regex``, ``ebnf`` and ``json_schema`` become lmrpc's
constraint; tool calls are refused (no tool-call parser).
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import betterproto2

from lmrpc.v1 import (
    ChatInput,
    ChatMessage,
    Constraint,
    GenerateRequest,
    GenerateResponse,
    JsonObject,
    OutputFinished,
    ResponseOptions,
    SamplingParams,
    StoppingCriteria,
    TokenDelta,
    TokenIds,
    TokenLogprob,
    Usage,
)
from reference_server.frontend.dialects.base.events import finish_reason, matched_stop, status_of
from reference_server.frontend.dialects.sglang_runtime.openai_body import Body, OpenAIError, unimplemented

UINT64 = 1 << 64
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # the OpenAI API's (and SGLang's) default for completions

TokenText = Callable[[int], str]

#: lmrpc.v1's field names in its validation messages, and the OpenAI parameters'
OPENAI_FIELD_NAMES = (
    ("stopping.max_tokens", "max_tokens"),
    ("stopping.min_tokens", "min_tokens"),
    ("stopping.stop_strings", "stop"),
    ("stopping.stop_token_ids", "stop_token_ids"),
    ("sampling.", ""),
    ("token_ids.ids", "prompt"),
    ("response.top_logprobs", "top_logprobs"),
    ("request_id", "rid"),
    ("chat.messages", "messages"),
    ("chat: ", "messages: "),
)

CONSTRAINT_PARAMETERS = ("regex", "ebnf", "json_schema")  # SGLang's own, beside response_format
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty")
COMMON_PARAMETERS = (
    *SAMPLING, "model", "n", "seed", "stop", "stream", "stream_options", "user", "logit_bias",
    "max_tokens", "min_tokens", "repetition_penalty", "stop_token_ids", "no_stop_trim", "ignore_eos",
    "skip_special_tokens", "rid", "regex", "ebnf", "json_schema", "lora_path", "return_hidden_states",
)  # fmt: skip
CHAT_PARAMETERS = (
    *COMMON_PARAMETERS, "messages", "logprobs", "top_logprobs", "max_completion_tokens", "response_format",
    "tools", "tool_choice", "parallel_tool_calls", "functions", "function_call", "metadata", "store",
    "service_tier", "modalities", "audio", "prediction", "reasoning_effort", "web_search_options",
    "continue_final_message", "chat_template_kwargs", "separate_reasoning", "stream_reasoning",
)  # fmt: skip
COMPLETION_PARAMETERS = (*COMMON_PARAMETERS, "prompt", "logprobs", "echo", "suffix", "best_of")


@dataclass(frozen=True, slots=True)
class OpenAIGeneration:
    """A chat or completion request as lmrpc.v1's, and how to answer it."""

    request: GenerateRequest
    stream: bool
    include_usage: bool
    top_logprobs: int | None  # None: no logprobs
    echo: str = ""  # completions: the prompt, before each choice's text


# ── requests ────────────────────────────────────────────────────────────────────────────────


def chat_generation(body: Body) -> OpenAIGeneration:
    _refuse_common(body)
    _refuse_chat_only(body)
    messages = _chat_messages(body.values.get("messages"))
    logprobs = body.boolean("logprobs", False)
    top = body.integer("top_logprobs", low=0)
    if top is not None and not logprobs:
        raise OpenAIError("top_logprobs requires logprobs=true", "top_logprobs")
    max_tokens = body.integer("max_completion_tokens", low=1)
    if max_tokens is None:
        max_tokens = body.integer("max_tokens", low=1)
    top_logprobs = (top or 0) if logprobs else None
    request = _lmrpc_request(body, max_tokens, top_logprobs)
    request.chat = ChatInput(messages=messages)
    request.constraint = _constraint(body, _response_format(body))
    return OpenAIGeneration(request, body.boolean("stream", False), _include_usage(body), top_logprobs)


def completion_generation(body: Body, decode: Callable[[list[int]], str]) -> OpenAIGeneration:
    _refuse_common(body)
    if body.string("suffix"):
        raise unimplemented("suffix", "no fill-in-the-middle")
    logprobs = body.integer("logprobs", low=0)
    echo = body.boolean("echo", False)
    if echo and logprobs is not None:
        raise unimplemented("echo with logprobs", "no prompt logprobs")
    n = body.integer("n", low=1) or 1
    best_of = body.integer("best_of", low=1)
    if best_of is not None and best_of != n:
        raise unimplemented(f"best_of={best_of}", "every generated choice is returned (best_of must equal n)")
    max_tokens = body.integer("max_tokens", low=1)
    request = _lmrpc_request(
        body, COMPLETIONS_DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens, logprobs
    )
    request.constraint = _constraint(body, None)
    prompt = _one_prompt(body.values.get("prompt"))
    if isinstance(prompt, str):
        request.text = prompt
        echoed = prompt
    else:
        request.token_ids = TokenIds(ids=prompt)
        echoed = decode(prompt) if echo else ""
    return OpenAIGeneration(
        request, body.boolean("stream", False), _include_usage(body), logprobs, echoed if echo else ""
    )


def _lmrpc_request(body: Body, max_tokens: int | None, top_logprobs: int | None) -> GenerateRequest:
    seed = body.integer("seed", low=-(1 << 63), high=UINT64 - 1)
    top_k = body.integer("top_k", low=-1)
    min_tokens = body.integer("min_tokens", low=0)
    stop_token_ids = body.token_ids("stop_token_ids")
    return GenerateRequest(
        request_id=body.string("rid") or "",
        sampling=SamplingParams(
            temperature=body.number("temperature"),
            top_p=body.number("top_p"),
            top_k=None if top_k is None else max(top_k, 0),  # SGLang's -1 disables, as lmrpc's 0
            min_p=body.number("min_p"),
            frequency_penalty=body.number("frequency_penalty"),
            presence_penalty=body.number("presence_penalty"),
            repetition_penalty=body.number("repetition_penalty"),
            seed=None if seed is None else seed % UINT64,
            n=body.integer("n", low=1),
        ),
        stopping=StoppingCriteria(
            max_tokens=max_tokens,
            min_tokens=min_tokens or None,
            stop_strings=body.strings("stop"),
            stop_token_ids=stop_token_ids,
            ignore_eos=body.boolean("ignore_eos", False),
            include_stop_in_output=body.boolean("no_stop_trim", False),
        ),
        response=ResponseOptions(
            return_text=True,
            return_token_ids=True,
            return_logprobs=top_logprobs is not None,
            top_logprobs=top_logprobs or 0,
            skip_special_tokens=body.boolean("skip_special_tokens", True),
            final_only=not body.boolean("stream", False),
        ),
    )


def _response_format(body: Body) -> Constraint | None:
    """Chat's ``response_format``: a JSON schema (``json_schema.schema``), any JSON object, or text."""
    response_format = body.mapping("response_format")
    kind = response_format.get("type", "text") if response_format else "text"
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint(json_object=JsonObject())
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict | bool):
            raise OpenAIError("response_format.json_schema.schema must be a JSON Schema", "response_format")
        return Constraint(json_schema=json.dumps(schema))
    raise unimplemented(f"response_format.type={kind!r}", "JSON schema, JSON object or text only")


def _constraint(body: Body, response_format: Constraint | None) -> Constraint | None:
    """At most one of ``response_format`` and SGLang's own ``regex``, ``ebnf``, ``json_schema``."""
    given = [
        Constraint(regex=body.string("regex")),
        Constraint(ebnf=body.string("ebnf")),
        Constraint(json_schema=body.string("json_schema")),
    ]
    given = [c for c, name in zip(given, CONSTRAINT_PARAMETERS, strict=True) if body.present(name)]
    if response_format is not None:
        given.append(response_format)
    if len(given) > 1:
        raise OpenAIError(
            "only one of response_format, regex, ebnf and json_schema may be set", "response_format"
        )
    return given[0] if given else None


def _include_usage(body: Body) -> bool:
    options = body.mapping("stream_options")
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise OpenAIError("stream_options.include_usage must be a boolean", "stream_options")
    return include


def _refuse_common(body: Body) -> None:
    if body.mapping("logit_bias"):
        raise unimplemented("logit_bias", "no logit bias")
    if body.string("lora_path"):
        raise unimplemented("lora_path", "no LoRA adapters")
    if body.boolean("return_hidden_states", False):
        raise unimplemented("return_hidden_states", "no hidden states")


def _refuse_chat_only(body: Body) -> None:
    if body.values.get("tools") or body.values.get("functions") or body.present("function_call"):
        raise unimplemented("tools", "no tool calls (the server has no tool-call parser)")
    if body.values.get("tool_choice") not in (None, "none", "auto"):
        raise unimplemented("tool_choice", "no tool calls (the server has no tool-call parser)")
    modalities = body.values.get("modalities")
    if modalities not in (None, ["text"]):
        raise unimplemented("modalities", "text output only")
    for name in ("audio", "prediction", "reasoning_effort", "web_search_options"):
        if body.present(name):
            raise unimplemented(name, "not offered by this text-only model")
    if body.boolean("continue_final_message", False):
        raise unimplemented("continue_final_message", "the template always starts a new turn")
    if body.mapping("chat_template_kwargs"):
        raise unimplemented("chat_template_kwargs", "the chat template takes no arguments")
    if body.boolean("separate_reasoning", False):
        raise unimplemented("separate_reasoning", "no reasoning parser")


def _chat_messages(value: Any) -> list[ChatMessage]:
    if not isinstance(value, list) or not value:
        raise OpenAIError("messages must be a non-empty list", "messages")
    messages = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise OpenAIError(f"messages[{i}] must be an object with a string role", "messages")
        if message.get("tool_calls") or message["role"] in ("tool", "function"):
            raise unimplemented(f"messages[{i}]: tool calls and results", "no tool calls")
        messages.append(ChatMessage(role=message["role"], content=_content(i, message.get("content"))))
    return messages


def _content(index: int, content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise OpenAIError(f"messages[{index}].content must be a string or a list of parts", "messages")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            raise unimplemented(f"messages[{index}].content[{j}].type={kind!r}", "a text-only model")
        text = part.get("text")
        if not isinstance(text, str):
            raise OpenAIError(f"messages[{index}].content[{j}].text must be a string", "messages")
        texts.append(text)
    return "".join(texts)


def _one_prompt(value: Any) -> str | list[int]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]  # a batch of one
    if isinstance(value, str):
        if not value:
            raise OpenAIError("prompt must not be empty", "prompt")
        return value
    if (
        isinstance(value, list)
        and value
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        if min(value) < 0:
            raise OpenAIError("prompt token ids must be >= 0", "prompt")
        return list(value)
    if isinstance(value, list) and len(value) > 1 and all(isinstance(v, str | list) for v in value):
        raise unimplemented(f"prompt: a batch of {len(value)} prompts", "one prompt per request")
    raise OpenAIError("prompt must be a string or a list of token ids", "prompt")


# ── responses ───────────────────────────────────────────────────────────────────────────────


@dataclass
class Choice:
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finished: OutputFinished | None = None


@dataclass
class OpenAIAnswer(ABC):
    """lmrpc.v1 Generate events as OpenAI objects: ``add`` returns the chunks of a stream;
    ``body`` the whole answer once the events ended (without ``stream``)."""

    generation: OpenAIGeneration
    model: str
    token_text: TokenText
    created: int = field(default_factory=lambda: int(time.time()))
    request_id: str = ""
    prompt_tokens: int = 0
    usage: Usage | None = None
    choices: dict[int, Choice] = field(default_factory=dict)

    completion_object: ClassVar[str]
    chunk_object: ClassVar[str]

    def add(self, event: GenerateResponse) -> list[dict[str, Any]]:
        self.request_id = event.request_id
        kind, _ = betterproto2.which_one_of(event, "event")
        if kind == "prompt_info":
            assert event.prompt_info is not None
            self.prompt_tokens = event.prompt_info.prompt_tokens
            return self._chunks([self.opening(i) for i in range(event.prompt_info.num_outputs or 1)])
        if kind == "delta":
            assert event.delta is not None
            return self._chunks(self._delta(event.delta))
        if kind == "finished":
            assert event.finished is not None
            return self._finished(event.finished, event.usage)
        if kind == "error":
            assert event.error is not None
            raise status_of(event.error)
        return []

    def body(self) -> dict[str, Any]:
        choices = [self.whole_choice(i, self.choices[i]) for i in sorted(self.choices)]
        return {**self._header(self.completion_object), "choices": choices, "usage": self._usage()}

    @abstractmethod
    def opening(self, index: int) -> dict[str, Any] | None:
        """A stream's first chunk choice of output ``index``, if the format has one."""

    @abstractmethod
    def delta_choice(self, index: int, delta: TokenDelta, choice: Choice) -> dict[str, Any]:
        """A streamed choice for new text (``choice`` holds the output before it)."""

    @abstractmethod
    def finish_choice(self, index: int, finished: OutputFinished) -> dict[str, Any]:
        """A streamed choice ending output ``index``."""

    @abstractmethod
    def whole_choice(self, index: int, choice: Choice) -> dict[str, Any]:
        """A finished output, in the non-streamed answer."""

    def _delta(self, delta: TokenDelta) -> list[dict[str, Any] | None]:
        index = delta.output_index or 0
        choice = self.choices.setdefault(index, Choice())
        streamed = self.delta_choice(index, delta, choice) if self.generation.stream else None
        choice.text += delta.text
        choice.logprobs += delta.logprobs
        if not delta.text and not delta.logprobs:
            return []
        return [streamed]

    def _finished(self, finished: OutputFinished, usage: Usage | None) -> list[dict[str, Any]]:
        index = finished.output_index or 0
        self.choices.setdefault(index, Choice()).finished = finished
        if usage is not None:
            self.usage = usage
        chunks = self._chunks([self.finish_choice(index, finished)])
        if usage is not None and self.generation.stream and self.generation.include_usage:
            chunks.append({**self._header(self.chunk_object), "choices": [], "usage": self._usage()})
        return chunks

    def _chunks(self, choices: list[dict[str, Any] | None]) -> list[dict[str, Any]]:
        if not self.generation.stream:
            return []
        chunks = []
        for choice in choices:
            if choice is not None:
                chunk = {**self._header(self.chunk_object), "choices": [choice]}
                if self.generation.include_usage:
                    chunk["usage"] = None
                chunks.append(chunk)
        return chunks

    def _header(self, kind: str) -> dict[str, Any]:
        return {"id": self.request_id, "object": kind, "created": self.created, "model": self.model}

    def _usage(self) -> dict[str, Any]:
        usage = self.usage or Usage()
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": self.prompt_tokens + usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_prompt_tokens},
        }


def _finish_fields(finished: OutputFinished | None) -> dict[str, Any]:
    if finished is None:
        return {"finish_reason": None}
    stop_string, token_id = matched_stop(finished.stop)
    return {
        "finish_reason": finish_reason(finished.reason),
        "matched_stop": stop_string if stop_string is not None else token_id,
    }


class ChatAnswer(OpenAIAnswer):
    completion_object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def opening(self, index: int) -> dict[str, Any]:
        return {
            "index": index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }

    def delta_choice(self, index: int, delta: TokenDelta, choice: Choice) -> dict[str, Any]:
        return {
            "index": index,
            "delta": {"content": delta.text},
            "logprobs": self._logprobs(delta.logprobs),
            "finish_reason": None,
        }

    def finish_choice(self, index: int, finished: OutputFinished) -> dict[str, Any]:
        return {"index": index, "delta": {}, "logprobs": None, **_finish_fields(finished)}

    def whole_choice(self, index: int, choice: Choice) -> dict[str, Any]:
        return {
            "index": index,
            "message": {"role": "assistant", "content": choice.text},
            "logprobs": self._logprobs(choice.logprobs),
            **_finish_fields(choice.finished),
        }

    def _logprobs(self, logprobs: list[TokenLogprob]) -> dict[str, Any] | None:
        if self.generation.top_logprobs is None:
            return None
        return {"content": [self._entry(lp) for lp in logprobs]}

    def _entry(self, lp: TokenLogprob) -> dict[str, Any]:
        token = self.token_text(lp.token_id)
        return {
            "token": token,
            "logprob": lp.logprob,
            "bytes": list(token.encode()),
            "top_logprobs": [
                {"token": (t := self.token_text(c.token_id)), "logprob": c.logprob, "bytes": list(t.encode())}
                for c in lp.top
            ],
        }


class CompletionAnswer(OpenAIAnswer):
    completion_object = "text_completion"
    chunk_object = "text_completion"

    def opening(self, index: int) -> dict[str, Any] | None:
        if not self.generation.echo:
            return None
        return {"index": index, "text": self.generation.echo, "logprobs": None, "finish_reason": None}

    def delta_choice(self, index: int, delta: TokenDelta, choice: Choice) -> dict[str, Any]:
        offset = len(self.generation.echo) + len(choice.text)
        return {
            "index": index,
            "text": delta.text,
            "logprobs": self._logprobs(delta.logprobs, offset),
            "finish_reason": None,
        }

    def finish_choice(self, index: int, finished: OutputFinished) -> dict[str, Any]:
        return {"index": index, "text": "", "logprobs": None, **_finish_fields(finished)}

    def whole_choice(self, index: int, choice: Choice) -> dict[str, Any]:
        echo = self.generation.echo
        return {
            "index": index,
            "text": echo + choice.text,
            "logprobs": self._logprobs(choice.logprobs, len(echo)),
            **_finish_fields(choice.finished),
        }

    def _logprobs(self, logprobs: list[TokenLogprob], offset: int) -> dict[str, Any] | None:
        """The legacy completions format: parallel lists, ``text_offset`` into the choice's text."""
        top = self.generation.top_logprobs
        if top is None:
            return None
        tokens = [self.token_text(lp.token_id) for lp in logprobs]
        offsets = []
        for token in tokens:
            offsets.append(offset)
            offset += len(token)
        return {
            "tokens": tokens,
            "token_logprobs": [lp.logprob for lp in logprobs],
            "top_logprobs": [{self.token_text(c.token_id): c.logprob for c in lp.top} for lp in logprobs]
            if top
            else None,
            "text_offset": offsets,
        }
