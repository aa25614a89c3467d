"""What an OpenAI-compatible server supports, learned by asking it (nothing in the API advertises it).

Each optional parameter is sent once in a small request and its answer sorted into one of:

- ``honoured``: it visibly took effect (two choices for ``n=2``, logprobs when asked, ...);
- ``refused``: a 4xx with an OpenAI error object: the cases that need it skip, quoting the refusal;
- ``ignored``: accepted with no effect: capability honesty fails (CAP-1) and its cases run anyway,
  so they meet what the server does;
- ``broken``: a 5xx, no answer, or an answer that is not OpenAI's shape: its cases run and meet it.

A parameter whose effect one small request cannot show (``seed``, ``stop``) is ``honoured`` when it
is accepted; its own cases judge the effect.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from conformance.drivers.openai.exchange import Api, Exchange, OpenAIRequest
from conformance.drivers.openai.view import CompletionView, view_of
from conformance.vocabulary import CaseSkipped

CHAT_PROBE: dict[str, Any] = {
    "messages": [{"role": "user", "content": "Count from one to ten in words."}],
    "max_tokens": 6,
    "temperature": 0,
}
COMPLETIONS_PROBE: dict[str, Any] = {"prompt": "One, two, three,", "max_tokens": 6, "temperature": 0}
DETERMINISM_RUNS = 3

Send = Callable[[OpenAIRequest], Awaitable[Exchange]]


class State(StrEnum):
    HONOURED = "honoured"
    REFUSED = "refused"
    IGNORED = "ignored"
    BROKEN = "broken"


@dataclass(frozen=True, slots=True)
class Feature:
    state: State
    detail: str = ""

    @property
    def usable(self) -> bool:
        """Its cases run: they judge what an honoured or a broken feature does. A refused one is
        out of the profile; an ignored one is one finding, CAP-1's, and the cases that need it are
        n/a with that reason (one cause, one verdict)."""
        return self.state in (State.HONOURED, State.BROKEN)


@dataclass(frozen=True, slots=True)
class Support:
    features: Mapping[str, Feature] = field(default_factory=dict)  # "chat", "chat.n", "completions.echo", ...
    deterministic: bool = False  # the same greedy request gave the same text every time
    determinism: str = ""  # what the runs gave

    def feature(self, api: Api, name: str = "") -> Feature:
        key = f"{api}.{name}" if name else api
        return self.features.get(key, Feature(State.REFUSED, f"{key} was not probed"))

    def has(self, api: Api, name: str = "") -> bool:
        return self.feature(api).usable and (not name or self.feature(api, name).usable)

    def need(self, api: Api, *names: str) -> None:
        """Skip the case unless the endpoint and every named parameter are usable."""
        endpoint = self.feature(api)
        if not endpoint.usable:
            raise CaseSkipped(f"the server does not serve {api}: {endpoint.detail}")
        for name in names:
            found = self.feature(api, name)
            if found.state is State.IGNORED:
                raise CaseSkipped(
                    f"{api} {name} is accepted and ignored ({found.detail}): CAP-1[openai,{name}] holds the finding"
                )
            if not found.usable:
                raise CaseSkipped(f"the server refuses {api} {name}: {found.detail}")

    def apis(self) -> list[Api]:
        return [api for api in ("chat", "completions") if self.feature(api).usable]

    def need_determinism(self) -> None:
        if not self.deterministic:
            raise CaseSkipped(
                "greedy decoding is not deterministic on this server, so two calls cannot be compared "
                f"(OpenAI's API leaves it open; SAMPLE-2 reports it): {self.determinism}"
            )

    def to_json(self) -> dict[str, object]:
        return {
            "features": {
                k: {"state": v.state.value, "detail": v.detail} for k, v in sorted(self.features.items())
            },
            "deterministic_greedy": self.deterministic,
            "determinism": self.determinism,
        }


def base_probe(api: Api) -> OpenAIRequest:
    return OpenAIRequest(api, CHAT_PROBE if api == "chat" else COMPLETIONS_PROBE)


def refusal(exchange: Exchange) -> Feature | None:
    """A 4xx with an error object is a refusal, a 5xx or no answer is broken; else None."""
    error = exchange.error_object()
    if 400 <= exchange.status < 500 and error is not None:
        return Feature(State.REFUSED, f"HTTP {exchange.status}: {str(error.get('message'))[:200]}")
    if exchange.status != 200:
        return Feature(State.BROKEN, exchange.summary())
    return None


async def learn(send: Send, *, token_prompt: list[int] | None) -> Support:
    features: dict[str, Feature] = {}
    for api in ("chat", "completions"):
        base = base_probe(api)
        answer = await send(base)
        features[api] = refusal(answer) or _shaped(view_of(answer), answer)
        if not features[api].usable:
            continue
        for name, probe in PROBES.items():
            if "." in name and not name.startswith(f"{api}."):
                continue  # a parameter of the other API
            feature_name = name.split(".", 1)[-1]
            request, judge = probe(base, token_prompt)
            if request is None:
                features[f"{api}.{feature_name}"] = Feature(
                    State.REFUSED, "no tokenizer endpoint to make token ids"
                )
                continue
            exchange = await send(request)
            features[f"{api}.{feature_name}"] = refusal(exchange) or judge(view_of(exchange), exchange)
    deterministic, determinism = await _determinism(send, features)
    return Support(features, deterministic, determinism)


def _shaped(view: CompletionView, exchange: Exchange) -> Feature:
    if view.choices:
        return Feature(State.HONOURED, "answers")
    return Feature(State.BROKEN, f"no choices in the answer: {exchange.text[:200]!r}")


Judge = Callable[[CompletionView, Exchange], Feature]
Probe = Callable[[OpenAIRequest, list[int] | None], tuple[OpenAIRequest | None, Judge]]


def _choices(view: CompletionView, exchange: Exchange) -> Feature:
    if sorted(view.choices) == [0, 1]:
        return Feature(State.HONOURED, "n=2 gives choices 0 and 1")
    if len(view.choices) == 1 and _choice_objects(exchange) == 1:
        return Feature(State.IGNORED, "n=2 was accepted and gave one choice")
    if len(view.choices) == 1:  # two answers under one index: n is honoured, its indexes are N-1's
        return Feature(
            State.BROKEN,
            f"n=2 gave {_choice_objects(exchange)} choices, all index {next(iter(view.choices))}",
        )
    return Feature(State.BROKEN, f"n=2 gave choices {sorted(view.choices)}")


def _choice_objects(exchange: Exchange) -> int:
    """How many choice objects a JSON answer holds, whatever their indexes say."""
    body = exchange.json() if not exchange.is_event_stream else None
    found = body.get("choices") if isinstance(body, dict) else None
    return len(found) if isinstance(found, list) else 0


def _n(base: OpenAIRequest, _: list[int] | None) -> tuple[OpenAIRequest | None, Judge]:
    """Several choices, sampled: greedy ones are an option of their own (``greedy_n``)."""
    return base.with_body(n=2, temperature=1.0), _choices


def _greedy_n(base: OpenAIRequest, _: list[int] | None) -> tuple[OpenAIRequest | None, Judge]:
    """Several choices at temperature 0, which a server may refuse by design (vLLM does)."""
    return base.with_body(n=2, temperature=0), _choices


def _logprobs(base: OpenAIRequest, _: list[int] | None) -> tuple[OpenAIRequest | None, Judge]:
    request = (
        base.with_body(logprobs=True, top_logprobs=2) if base.api == "chat" else base.with_body(logprobs=2)
    )

    def judge(view: CompletionView, exchange: Exchange) -> Feature:
        if any(c.entries for c in view.choices.values()):
            return Feature(State.HONOURED, "logprobs come with the tokens")
        return Feature(State.IGNORED, "logprobs were asked, accepted, and none came")

    return request, judge


def _stream(base: OpenAIRequest, _: list[int] | None) -> tuple[OpenAIRequest | None, Judge]:
    def judge(view: CompletionView, exchange: Exchange) -> Feature:
        if view.streamed:
            return Feature(State.HONOURED, "an event stream")
        return Feature(State.IGNORED, f"stream=true answered {exchange.content_type or 'no content-type'}")

    return base.with_body(stream=True), judge


def _include_usage(base: OpenAIRequest, _: list[int] | None) -> tuple[OpenAIRequest | None, Judge]:
    def judge(view: CompletionView, exchange: Exchange) -> Feature:
        if view.usages:
            return Feature(State.HONOURED, "a usage chunk comes")
        if not view.streamed:
            return Feature(State.BROKEN, "stream=true did not stream")
        return Feature(State.IGNORED, "stream_options.include_usage was accepted and no usage came")

    return base.with_body(stream=True, stream_options={"include_usage": True}), judge


def _accepted(**fields: Any) -> Probe:
    def probe(base: OpenAIRequest, _: list[int] | None) -> tuple[OpenAIRequest | None, Judge]:
        return base.with_body(**fields), lambda view, exchange: Feature(State.HONOURED, "accepted")

    return probe


def _echo(base: OpenAIRequest, _: list[int] | None) -> tuple[OpenAIRequest | None, Judge]:
    prompt = str(base.body["prompt"])

    def judge(view: CompletionView, exchange: Exchange) -> Feature:
        texts = view.texts()
        if texts and all(t.startswith(prompt) for t in texts.values()):
            return Feature(State.HONOURED, "the text starts with the prompt")
        return Feature(
            State.IGNORED, f"echo=true was accepted and the text does not start with the prompt: {texts}"
        )

    return base.with_body(echo=True), judge


MAX_COMPLETION_TOKENS = 2  # fewer than the probe's answer: "Count from one to ten" goes on


def _max_completion_tokens(base: OpenAIRequest, _: list[int] | None) -> tuple[OpenAIRequest | None, Judge]:
    """``max_completion_tokens``, which replaced ``max_tokens`` in OpenAI's chat API, alone."""
    body = {k: v for k, v in base.body.items() if k != "max_tokens"}
    request = OpenAIRequest(base.api, {**body, "max_completion_tokens": MAX_COMPLETION_TOKENS})

    def judge(view: CompletionView, exchange: Exchange) -> Feature:
        usage = view.usage
        counted = usage.get("completion_tokens") if isinstance(usage, dict) else None
        finishes = {c.finish for c in view.choices.values()}
        if isinstance(counted, int) and counted > MAX_COMPLETION_TOKENS:
            return Feature(
                State.IGNORED,
                f"max_completion_tokens={MAX_COMPLETION_TOKENS} was accepted and {counted} tokens came",
            )
        if finishes == {"length"}:
            return Feature(
                State.HONOURED, f"cut at {counted if counted is not None else 'its'} tokens, length"
            )
        return Feature(
            State.BROKEN,
            f"max_completion_tokens={MAX_COMPLETION_TOKENS}: finishes {sorted(map(str, finishes))}",
        )

    return request, judge


def _content_parts(base: OpenAIRequest, _: list[int] | None) -> tuple[OpenAIRequest | None, Judge]:
    """The probe's message with its content as a list of text parts, which the chat API takes as
    the same text (the CAP-1 case compares the two answers under greedy decoding)."""
    messages = [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in base.body["messages"]]
    return OpenAIRequest(base.api, {**base.body, "messages": messages}), _shaped


def _token_prompt(base: OpenAIRequest, ids: list[int] | None) -> tuple[OpenAIRequest | None, Judge]:
    if not ids:
        return None, lambda view, exchange: Feature(State.REFUSED, "")
    return base.with_body(prompt=ids), lambda view, exchange: _shaped(view, exchange)


PROBES: Mapping[str, Probe] = {
    "n": _n,
    "greedy_n": _greedy_n,
    "logprobs": _logprobs,
    "stream": _stream,
    "include_usage": _include_usage,
    "stop": _accepted(stop=["\n\n\n\n"]),
    "seed": _accepted(seed=1234, temperature=1.0),
    "completions.echo": _echo,
    "completions.token_prompt": _token_prompt,
    "chat.max_completion_tokens": _max_completion_tokens,
    "chat.content_parts": _content_parts,
}


async def _determinism(send: Send, features: Mapping[str, Feature]) -> tuple[bool, str]:
    api: Api = "chat" if features.get("chat", Feature(State.REFUSED)).usable else "completions"
    request = base_probe(api).with_body(max_tokens=16)
    texts = []
    for _ in range(DETERMINISM_RUNS):
        texts.append(view_of(await send(request)).texts())
    if all(t == texts[0] for t in texts):
        return True, f"{DETERMINISM_RUNS} greedy {api} runs gave the same text"
    return False, f"{DETERMINISM_RUNS} greedy {api} runs of {request!r} gave {texts}"
