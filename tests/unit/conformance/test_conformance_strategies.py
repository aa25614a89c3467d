"""The request strategies: valid draws stay inside SAMPLE-5 and the advertised capabilities;
invalid draws always carry one value out of range."""

from __future__ import annotations

import math
import re

from hypothesis import given, settings

from conformance.search.property import CI_PROFILE
from conformance.search.strategies import invalid_requests, valid_requests
from conformance.vocabulary import TargetInfo
from lmrpc.v1 import Capabilities, GenerateRequest, ModelInfo, ServerInfo

FULL = TargetInfo(
    ServerInfo(
        capabilities=Capabilities(
            text_input=True,
            token_ids_input=True,
            chat_input=True,
            max_outputs=4,
            truncation_sampling=True,
            penalties=True,
            seeded_sampling=True,
            deterministic_greedy=True,
            stop_strings=True,
            stop_token_ids=True,
            logprobs=True,
            max_top_logprobs=5,
            final_only=True,
            max_stop_strings=2,
        )
    ),
    ModelInfo(vocab_size=1000, max_context_tokens=512, eos_token_ids=[2]),
    None,
)
MINIMAL = TargetInfo(
    ServerInfo(capabilities=Capabilities(text_input=True, max_outputs=1)),
    ModelInfo(vocab_size=1000, max_context_tokens=512, eos_token_ids=[2]),
    None,
)


def in_range(r: GenerateRequest, info: TargetInfo) -> None:
    s, stop, resp = r.sampling, r.stopping, r.response
    assert s is not None and stop is not None and resp is not None
    assert sum(x is not None for x in (r.text, r.token_ids, r.chat)) == 1
    assert r.token_ids is None or all(t < info.vocab_size for t in r.token_ids.ids)
    assert s.temperature is None or (s.temperature >= 0 and math.isfinite(s.temperature))
    assert s.top_p is None or 0 < s.top_p <= 1
    assert s.min_p is None or 0 <= s.min_p <= 1
    for p in (s.frequency_penalty, s.presence_penalty):
        assert p is None or -2 <= p <= 2
    assert s.repetition_penalty is None or 0 < s.repetition_penalty <= 10
    assert s.n is None or 1 <= s.n <= info.caps.max_outputs
    assert stop.max_tokens is not None and stop.max_tokens >= 1
    assert stop.min_tokens is None or stop.min_tokens <= stop.max_tokens
    assert len(stop.stop_strings) <= info.caps.max_stop_strings and all(stop.stop_strings)
    assert all(t < info.vocab_size for t in stop.stop_token_ids)
    assert not (resp.return_text is False and resp.return_token_ids is False)
    assert resp.top_logprobs <= info.caps.max_top_logprobs


@settings(settings.get_profile(CI_PROFILE), max_examples=150)
@given(valid_requests(FULL, max_tokens=8))
def test_valid_requests_are_valid(request: GenerateRequest) -> None:
    in_range(request, FULL)


@settings(settings.get_profile(CI_PROFILE), max_examples=60)
@given(valid_requests(MINIMAL, max_tokens=8))
def test_only_advertised_options_are_used(request: GenerateRequest) -> None:
    s, stop, resp = request.sampling, request.stopping, request.response
    assert request.text is not None and s is not None and stop is not None and resp is not None
    assert (s.top_p, s.top_k, s.min_p, s.seed, s.presence_penalty) == (None,) * 5
    assert s.n in (None, 1) and not stop.stop_strings and not stop.stop_token_ids
    assert not resp.return_logprobs and not resp.final_only


@settings(settings.get_profile(CI_PROFILE), max_examples=150)
@given(invalid_requests(FULL, max_tokens=8))
def test_invalid_requests_are_invalid(drawn: tuple[GenerateRequest, str]) -> None:
    request, label = drawn
    try:
        in_range(request, FULL)
    except AssertionError:
        return
    assert label.startswith("request_id") and not re.fullmatch(
        r"[A-Za-z0-9._:/-]{1,128}", request.request_id
    ), label
