"""Hypothesis strategies for lmrpc requests, built from what the target advertises.

``valid_requests`` only draws options whose capability is true and values inside the SAMPLE-5
ranges, so every draw must be accepted; ``invalid_requests`` draws from ``conformance.search.invalid``,
each with the status code the contract requires.
"""

from __future__ import annotations

import struct

from hypothesis import strategies as st

from conformance.vocabulary import GREEDY_N, TargetInfo
from lmrpc.v1 import (
    ChatInput,
    ChatMessage,
    GenerateRequest,
    ResponseOptions,
    SamplingParams,
    StoppingCriteria,
    TokenIds,
)

# Short prompts in several scripts: multi-byte characters exercise STREAM-4/5 holdback.
PROMPTS = (
    "Hello",
    "The capital of France is",
    "1, 2, 3, 4,",
    "Once upon a time",
    "def add(a, b):",
    "Réponds en français :",
    "日本語で答えてください。",
    "Emoji test 🙂🚀",
    "Ελληνικά κείμενα",
    "x",
)
# Stop strings likely to occur in generated text.
STOPS = (" ", "e", ".", ",", "\n", "the", "a", "ing", "🙂", "。")


def _to_f32(value: float) -> float:
    try:
        return float(struct.unpack("<f", struct.pack("<f", value))[0])
    except OverflowError:
        return float("inf") if value > 0 else float("-inf")


def _f32(min_value: float | None = None, max_value: float | None = None) -> st.SearchStrategy[float]:
    """Floats as the wire carries them (proto ``float`` is 32-bit)."""
    return st.floats(min_value, max_value, allow_nan=False).map(_to_f32)


# Assigned, printable characters: unassigned code points (Cn) are not text, and a byte-level vocabulary
# may lack the bytes they need (SmolLM2 has no tokens for lead bytes 0xF1/0xF2, planes 4-11).
_TEXT = st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Cn", "Co"), exclude_characters="<|>")


def prompt_texts() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(PROMPTS), st.text(_TEXT, min_size=1, max_size=24).filter(str.strip))


def inputs(info: TargetInfo) -> st.SearchStrategy[dict[str, object]]:
    choices: list[st.SearchStrategy[dict[str, object]]] = []
    if info.has("text_input"):
        choices.append(st.builds(lambda t: {"text": t}, prompt_texts()))
    if info.has("token_ids_input") and info.vocab_size > 0:
        ids = st.lists(st.integers(0, info.vocab_size - 1), min_size=1, max_size=12)
        choices.append(st.builds(lambda i: {"token_ids": TokenIds(ids=i)}, ids))
    if info.has("chat_input"):
        message = st.builds(ChatMessage, role=st.just("user"), content=prompt_texts())
        chat = st.builds(
            ChatInput,
            messages=st.lists(message, min_size=1, max_size=2),
            add_generation_prompt=st.sampled_from([None, True, False]),
        )
        choices.append(st.builds(lambda c: {"chat": c}, chat))
    if not choices:
        raise ValueError("the target advertises no input kind (text, token_ids or chat)")
    return st.one_of(choices)


def _maybe(strategy: st.SearchStrategy[object], enabled: bool = True) -> st.SearchStrategy[object]:
    return st.one_of(st.none(), strategy) if enabled else st.none()


def sampling(info: TargetInfo, *, max_n: int = 3) -> st.SearchStrategy[SamplingParams]:
    trunc, pen, seeded = info.has("truncation_sampling"), info.has("penalties"), info.has("seeded_sampling")
    params = st.builds(
        SamplingParams,
        temperature=_maybe(st.one_of(st.just(0.0), _f32(0.1, 1.5))),
        top_p=_maybe(_f32(0.05, 1.0), trunc),
        top_k=_maybe(st.integers(0, 50), trunc),
        min_p=_maybe(_f32(0.0, 0.5), trunc),
        frequency_penalty=_maybe(_f32(-2.0, 2.0), pen),
        presence_penalty=_maybe(_f32(-2.0, 2.0), pen),
        repetition_penalty=_maybe(_f32(0.5, 2.0), pen),
        seed=_maybe(st.integers(0, 2**63 - 1), seeded),
        n=_maybe(st.integers(1, max(1, min(info.caps.max_outputs, max_n)))),
    )
    if GREEDY_N not in info.refusals:
        return params
    return params.map(_sampled_when_several)


def _sampled_when_several(params: SamplingParams) -> SamplingParams:
    """A server that refuses several greedy outputs (TargetInfo.refusals) gets them sampled."""
    if (params.n or 1) > 1 and params.temperature == 0:
        params.temperature = 1.0
    return params


def stopping(info: TargetInfo, max_tokens: int) -> st.SearchStrategy[StoppingCriteria]:
    def build(
        max_t: int, min_t: int | None, strings: list[str], ids: list[int], ignore: bool, include: bool
    ) -> StoppingCriteria:
        return StoppingCriteria(
            max_tokens=max_t,
            min_tokens=None if min_t is None else min(min_t, max_t),
            stop_strings=strings,
            stop_token_ids=ids,
            ignore_eos=ignore,
            include_stop_in_output=include,
        )

    max_strings = min(info.caps.max_stop_strings, 3) if info.has("stop_strings") else 0
    id_limit = max(info.vocab_size - 1, 0)
    stop_ids = st.lists(st.one_of(st.sampled_from(info.eos_ids or [0]), st.integers(0, id_limit)), max_size=2)
    return st.builds(
        build,
        st.integers(1, max_tokens),
        _maybe(st.integers(0, max_tokens)),
        st.lists(st.sampled_from(STOPS), max_size=max_strings, unique=True),
        stop_ids if info.has("stop_token_ids") else st.just([]),
        st.booleans(),
        st.booleans(),
    )


def response_options(info: TargetInfo) -> st.SearchStrategy[ResponseOptions]:
    def build(
        text: bool | None,
        ids: bool | None,
        logprobs: bool,
        top: int,
        skip: bool | None,
        prompt_ids: bool,
        final: bool,
    ) -> ResponseOptions:
        if text is False and ids is False:
            ids = None
        return ResponseOptions(
            return_text=text,
            return_token_ids=ids,
            return_logprobs=logprobs,
            top_logprobs=top if logprobs else 0,
            skip_special_tokens=skip,
            return_prompt_token_ids=prompt_ids,
            final_only=final,
        )

    has_lp = info.has("logprobs")
    flag = st.one_of(st.none(), st.booleans())
    return st.builds(
        build,
        flag,
        flag,
        st.booleans() if has_lp else st.just(False),
        st.integers(0, min(info.caps.max_top_logprobs, 5)) if has_lp else st.just(0),
        flag,
        st.booleans(),
        st.booleans() if info.has("final_only") else st.just(False),
    )


def valid_requests(
    info: TargetInfo, *, max_tokens: int, max_n: int = 3
) -> st.SearchStrategy[GenerateRequest]:
    """Requests every conformant server with these capabilities must accept (request_id left empty)."""

    def build(
        inp: dict[str, object],
        s: SamplingParams,
        stop: StoppingCriteria,
        r: ResponseOptions,
    ) -> GenerateRequest:
        return GenerateRequest(sampling=s, stopping=stop, response=r, **inp)  # type: ignore[arg-type]

    return st.builds(
        build, inputs(info), sampling(info, max_n=max_n), stopping(info, max_tokens), response_options(info)
    )


def deterministic_requests(info: TargetInfo, *, max_tokens: int) -> st.SearchStrategy[GenerateRequest]:
    """Valid requests whose tokens are reproducible: greedy, or seeded where the target supports it."""

    def pin(request: GenerateRequest, seed: int, greedy: bool) -> GenerateRequest:
        sampling = request.sampling or SamplingParams()
        if GREEDY_N in info.refusals and (sampling.n or 1) > 1:
            sampling.n = 1  # a server that refuses several greedy outputs: one, reproducible
        if greedy or not info.has("seeded_sampling"):
            sampling.temperature = 0.0
        else:
            sampling.seed = seed
        request.sampling = sampling
        return request

    return st.builds(
        pin,
        valid_requests(info, max_tokens=max_tokens),
        st.integers(0, 2**32),
        st.booleans() if info.has("seeded_sampling") else st.just(True),
    )


_BAD_ID_CHARS = st.sampled_from(list(" !@#$%^&*()+=,;'\"é\u00a0\t"))


def invalid_requests(info: TargetInfo, *, max_tokens: int) -> st.SearchStrategy[tuple[GenerateRequest, str]]:
    """A valid request with exactly one value pushed out of its range; pairs it with a label.

    Every draw must fail with INVALID_ARGUMENT and no messages (ERR-1, SAMPLE-5, REQ-4, REQ-5).
    """
    mutations: list[st.SearchStrategy[tuple[str, str, object]]] = [
        st.tuples(
            st.just("sampling"),
            st.just("temperature"),
            st.one_of(_f32(max_value=-0.0009765625), st.just(float("nan")), st.just(float("inf"))),
        ),
        st.tuples(st.just("sampling"), st.just("n"), st.just(0)),
        st.tuples(st.just("stopping"), st.just("max_tokens"), st.just(0)),
        st.tuples(
            st.just("request_id"),
            st.just("request_id"),
            st.tuples(st.text(st.characters(min_codepoint=48, max_codepoint=122), max_size=8), _BAD_ID_CHARS),
        ),
    ]
    if info.has("truncation_sampling"):
        mutations += [
            st.tuples(
                st.just("sampling"),
                st.just("top_p"),
                st.one_of(
                    st.just(0.0), _f32(max_value=-0.0009765625), _f32(min_value=1.0078125, max_value=1e6)
                ),
            ),
            st.tuples(
                st.just("sampling"),
                st.just("min_p"),
                st.one_of(_f32(max_value=-0.0009765625), _f32(min_value=1.0078125, max_value=1e6)),
            ),
        ]
    if info.has("penalties"):
        outside = st.one_of(
            _f32(min_value=-1e6, max_value=-2.015625), _f32(min_value=2.015625, max_value=1e6)
        )
        mutations += [
            st.tuples(
                st.just("sampling"), st.sampled_from(["frequency_penalty", "presence_penalty"]), outside
            ),
            st.tuples(
                st.just("sampling"),
                st.just("repetition_penalty"),
                st.one_of(_f32(min_value=-1e6, max_value=0.0), _f32(min_value=10.0625, max_value=1e6)),
            ),
        ]
    if info.has("token_ids_input") and info.vocab_size:
        mutations.append(
            st.tuples(
                st.just("token_ids"),
                st.just("token_ids"),
                st.integers(info.vocab_size, info.vocab_size + 10**6),
            )
        )

    def apply(base: GenerateRequest, mutation: tuple[str, str, object]) -> tuple[GenerateRequest, str]:
        where, name, value = mutation
        request = GenerateRequest.parse(bytes(base))
        if where == "sampling":
            request.sampling = request.sampling or SamplingParams()
            setattr(request.sampling, name, value)
        elif where == "stopping":
            request.stopping = request.stopping or StoppingCriteria()
            setattr(request.stopping, name, value)
        elif where == "request_id":
            assert isinstance(value, tuple)
            request.request_id = f"{value[0]}{value[1]}"
        else:
            request.token_ids = TokenIds(ids=[1, int(value)])  # type: ignore[call-overload]
            request.text = request.chat = None
        return request, f"{name}={value!r}"

    return st.builds(apply, valid_requests(info, max_tokens=max_tokens), st.one_of(mutations))
