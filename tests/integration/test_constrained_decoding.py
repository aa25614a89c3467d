"""Constrained decoding over real loopback gRPC with the fake engine (CONSTRAIN-1..4).

The fake engine echoes its prompt where the grammar allows it and otherwise samples what the
grammar allows (engine/fake.py), so a prompt that is itself a text of the constraint comes back
whole, and any other prompt still gives outputs the constraint accepts. Each output is judged by
an llguidance matcher of the test's own, fed its text's tokens: a sentence of the grammar when it
ends at its EOS, a prefix of one when it ends LENGTH or at a stop string or stop token; and, where
one exists, by a recognizer that is not llguidance (jsonschema, ``regex``, the choices).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from functools import partial

import jsonschema
import pytest
import regex
from grpclib import GRPCError, Status
from llguidance import LLMatcher, LLTokenizer
from streams import collect, run, wait_idle

from lmrpc.client import GenerateResult, LmrpcClient, StreamAggregator
from lmrpc.v1 import (
    Choices,
    Constraint,
    FinishReason,
    GenerateRequest,
    GenerateResponse,
    JsonObject,
    ResponseOptions,
    SamplingParams,
    StoppingCriteria,
)
from reference_server.engine.constraints import GrammarCompiler
from reference_server.ipc import Constraint as Spec
from reference_server.models.tokenizer import TokenizerBundle
from reference_server.testing import ServerProcess

PERSON = json.dumps(
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
)
Judge = Callable[[Spec, GenerateResult], None]
ANN = '{"name": "Ann", "age": 37}'
PHONE = r"[0-9]{3}-[0-9]{4}"
SUM = 'root ::= "(" num (" + " num)* ")"\nnum ::= [1-9] [0-9]*'
# (the constraint as sent, as the server reads it, a prompt that is a text of it)
KINDS = {
    "json_schema": (Constraint(json_schema=PERSON), Spec("json_schema", PERSON), ANN),
    "json_object": (Constraint(json_object=JsonObject()), Spec("json_object"), '{"a": [1, 2]}'),
    "regex": (Constraint(regex=PHONE), Spec("regex", PHONE), "555-0123"),
    "ebnf": (Constraint(ebnf=SUM), Spec("ebnf", SUM), "(12 + 30 + 7)"),
    "choice": (
        Constraint(choice=Choices(choices=["yes", "no", "not sure"])),
        Spec("choice", choices=("yes", "no", "not sure")),
        "not sure",
    ),
}


@pytest.fixture(scope="module")
def grammars(tokenizer: TokenizerBundle) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, tokenizer.vocab_size)


@pytest.fixture(scope="module")
def own_tokenizer(tokenizer: TokenizerBundle) -> LLTokenizer:
    return LLTokenizer(tokenizer.tokenizer.to_str(), n_vocab=tokenizer.vocab_size, eos_token=[2])


@pytest.fixture
def judge(grammars: GrammarCompiler, own_tokenizer: LLTokenizer, tokenizer: TokenizerBundle) -> Judge:
    return partial(judged, grammars, own_tokenizer, tokenizer)


def aggregate(responses: list[GenerateResponse]) -> GenerateResult:
    aggregator = StreamAggregator()
    for response in responses:
        aggregator.feed(response)
    return aggregator.result


def generate(server: ServerProcess, request: GenerateRequest) -> GenerateResult:
    return aggregate(run(server.target, lambda client: collect(client, request)))


def judged(
    grammars: GrammarCompiler,
    own_tokenizer: LLTokenizer,
    tokenizer: TokenizerBundle,
    spec: Spec,
    result: GenerateResult,
) -> None:
    """CONSTRAIN-1 for every output of ``result``."""
    assert result.error is None and result.outputs
    for out in result.outputs:
        matcher = LLMatcher(own_tokenizer, grammars.compile(spec).definition, log_level=0)
        taken = matcher.consume_tokens(tokenizer.encode(out.text, parse_special_tokens=False))
        assert taken, f"output {out.index} {out.text!r} leaves {spec}"
        if (
            out.finish_reason == FinishReason.STOP
            and out.stop is not None
            and out.stop.eos_token_id is not None
        ):
            assert matcher.is_accepting(), f"output {out.index} {out.text!r} ended at EOS incomplete"
            assert out.stop.eos_token_id in tokenizer.eos_token_ids
            assert out.token_ids[-1] == out.stop.eos_token_id
            match spec.kind:  # and by a recognizer that is not llguidance
                case "json_schema":
                    jsonschema.validate(json.loads(out.text), json.loads(spec.definition))
                case "json_object":
                    assert isinstance(json.loads(out.text), dict)
                case "regex":
                    assert regex.fullmatch(spec.definition, out.text), out.text
                case "choice":
                    assert out.text in spec.choices, out.text
        else:
            assert out.finish_reason in (FinishReason.LENGTH, FinishReason.STOP), out


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_prompt_that_fits_the_constraint_comes_back_whole(
    fake_server: ServerProcess, judge: Judge, tokenizer: TokenizerBundle, kind: str
) -> None:
    constraint, spec, text = KINDS[kind]
    request = GenerateRequest(
        text=text, constraint=constraint, sampling=SamplingParams(temperature=0.0, n=2),
        stopping=StoppingCriteria(max_tokens=64),
    )  # fmt: skip
    result = generate(fake_server, request)
    judge(spec, result)
    for out in result.outputs:
        assert out.text == text and out.finish_reason == FinishReason.STOP
        assert out.stop is not None and out.stop.eos_token_id == tokenizer.eos_token_ids[0]


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("final_only", [False, True])
def test_every_sampled_output_is_accepted_or_a_prefix(
    fake_server: ServerProcess, judge: Judge, kind: str, final_only: bool
) -> None:
    constraint, spec, _ = KINDS[kind]
    request = GenerateRequest(
        text="Tell me something about the sea.", constraint=constraint,
        sampling=SamplingParams(temperature=1.0, seed=7, n=3), stopping=StoppingCriteria(max_tokens=40),
        response=ResponseOptions(final_only=final_only),
    )  # fmt: skip
    result = generate(fake_server, request)
    judge(spec, result)
    if kind in ("regex", "choice"):  # short languages: every output completes
        assert all(out.stop is not None and out.stop.eos_token_id is not None for out in result.outputs)
    if kind == "regex":
        assert all(re.fullmatch(PHONE, out.text) for out in result.outputs)


def test_streamed_and_final_only_agree(fake_server: ServerProcess) -> None:
    constraint = KINDS["ebnf"][0]

    def request(final_only: bool) -> GenerateRequest:
        return GenerateRequest(
            text="(1 + 1)", constraint=constraint, sampling=SamplingParams(temperature=0.9, seed=3, n=2),
            stopping=StoppingCriteria(max_tokens=24), response=ResponseOptions(final_only=final_only),
        )  # fmt: skip

    streamed, final = generate(fake_server, request(False)), generate(fake_server, request(True))
    assert [(o.token_ids, o.text) for o in streamed.outputs] == [(o.token_ids, o.text) for o in final.outputs]


def test_max_tokens_cuts_a_constrained_output_to_a_prefix(fake_server: ServerProcess, judge: Judge) -> None:
    constraint, spec, text = KINDS["json_schema"]
    request = GenerateRequest(
        text=text, constraint=constraint, sampling=SamplingParams(temperature=0.0),
        stopping=StoppingCriteria(max_tokens=4),
    )  # fmt: skip
    result = generate(fake_server, request)
    out = result.outputs[0]
    assert out.finish_reason == FinishReason.LENGTH and len(out.token_ids) == 4
    assert text.startswith(out.text) and out.text != text
    judge(spec, result)


def test_stop_strings_and_stop_tokens_still_end_a_constrained_output(
    fake_server: ServerProcess, tokenizer: TokenizerBundle
) -> None:
    constraint, _, text = KINDS["json_schema"]
    by_string = generate(
        fake_server,
        GenerateRequest(
            text=text, constraint=constraint, sampling=SamplingParams(temperature=0.0),
            stopping=StoppingCriteria(max_tokens=64, stop_strings=['"age"']),
        ),
    )  # fmt: skip
    out = by_string.outputs[0]
    assert out.stop is not None and out.stop.stop_string == '"age"'
    assert out.text == '{"name": "Ann", '
    ids = tokenizer.encode(text)
    at = next(i for i, token_id in enumerate(ids) if "," in tokenizer.decode([token_id]))
    by_token = generate(
        fake_server,
        GenerateRequest(
            text=text, constraint=constraint, sampling=SamplingParams(temperature=0.0),
            stopping=StoppingCriteria(max_tokens=64, stop_token_ids=[ids[at]]),
        ),
    )  # fmt: skip
    out = by_token.outputs[0]
    assert out.stop is not None and out.stop.stop_token_id == ids[at]
    assert out.text == tokenizer.decode(ids[:at]) and text.startswith(out.text)


def test_a_complete_output_ends_at_once_whatever_ignore_eos_and_min_tokens_say(
    fake_server: ServerProcess, tokenizer: TokenizerBundle
) -> None:
    constraint, _, text = KINDS["choice"]
    request = GenerateRequest(
        text=text, constraint=constraint, sampling=SamplingParams(temperature=0.0),
        stopping=StoppingCriteria(max_tokens=32, min_tokens=20, ignore_eos=True),
    )  # fmt: skip
    out = generate(fake_server, request).outputs[0]
    assert out.text == text and out.finish_reason == FinishReason.STOP
    assert out.stop is not None and out.stop.eos_token_id is not None
    assert out.completion_tokens == len(tokenizer.encode(text)) + 1


def test_unconstrained_requests_beside_constrained_ones_are_unchanged(fake_server: ServerProcess) -> None:
    """CONSTRAIN-4 through the whole pipeline: the same seeded request, alone and among
    constrained ones of every kind."""
    plain = GenerateRequest(
        text="The quick brown fox", sampling=SamplingParams(temperature=0.8, seed=5, n=2),
        stopping=StoppingCriteria(max_tokens=24),
    )  # fmt: skip

    async def body(client: LmrpcClient) -> tuple[GenerateResult, GenerateResult]:
        alone = aggregate(await collect(client, plain))
        constrained = [
            GenerateRequest(
                text=text,
                constraint=constraint,
                sampling=SamplingParams(temperature=1.0, seed=1),
                stopping=StoppingCriteria(max_tokens=24),
            )
            for constraint, _, text in KINDS.values()
        ]
        results = await asyncio.gather(collect(client, plain), *(collect(client, r) for r in constrained))
        await wait_idle(client)
        return alone, aggregate(results[0])

    alone, beside = run(fake_server.target, body)
    assert [o.token_ids for o in alone.outputs] == [o.token_ids for o in beside.outputs]


def test_the_capability_is_announced(fake_server: ServerProcess) -> None:
    info = run(fake_server.target, lambda client: client.server_info())
    assert info.capabilities.constrained_decoding


BAD = {
    "no member": (Constraint(), "constraint:"),
    "json_schema not JSON": (Constraint(json_schema="{not json"), "constraint.json_schema='{not json'"),
    "json_schema empty": (Constraint(json_schema=""), "constraint.json_schema"),
    "json_schema not a schema": (Constraint(json_schema='{"type": "frobnicate"}'), "constraint.json_schema"),
    "json_schema unknown format": (  # CONSTRAIN-4: refused by name, not dropped
        Constraint(json_schema='{"type": "string", "format": "frob"}'),
        "uses 'format': 'frob', which this server cannot enforce",
    ),
    "json_schema overlapping oneOf": (
        Constraint(json_schema='{"oneOf": [{"type": "integer"}, {"type": "number"}]}'),
        "uses 'oneOf'",
    ),
    "regex": (Constraint(regex="a(b"), "constraint.regex='a(b'"),
    "ebnf": (Constraint(ebnf='root ::= "a'), "constraint.ebnf"),
    "ebnf without root": (Constraint(ebnf='start ::= "a"'), "constraint.ebnf"),
    "no choices": (Constraint(choice=Choices()), "constraint.choice"),
    "empty choice": (Constraint(choice=Choices(choices=["a", ""])), "constraint.choice.choices[1]"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_constraint_that_does_not_parse_is_invalid_argument_before_any_message(
    fake_server: ServerProcess, case: str
) -> None:
    constraint, field = BAD[case]
    seen: list[GenerateResponse] = []

    async def body(client: LmrpcClient) -> None:
        async for response in client.stream(GenerateRequest(text="x", constraint=constraint), timeout=30):
            seen.append(response)

    with pytest.raises(GRPCError) as refused:
        run(fake_server.target, body)
    assert refused.value.status == Status.INVALID_ARGUMENT and not seen
    message = refused.value.message or ""
    assert field in message, message
    assert "\n" not in message and "<state>" not in message, message  # no engine log noise
