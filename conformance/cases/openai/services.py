"""The server as a whole: it lists its model (SVC-1), answers an unknown path or model with a 404
(ERR-4), asks for its API key when it has one (AUTH-1), and either honours or refuses each
optional parameter, never ignoring one (CAP-1)."""

from __future__ import annotations

from conformance.cases.openai._common import answered, expect_refused, openai_case, support
from conformance.drivers.openai.discover import list_models
from conformance.drivers.openai.exchange import Api
from conformance.drivers.openai.support import PROBES, State, base_probe
from conformance.drivers.openai.view import CompletionView, view_of
from conformance.harness.context import Ctx
from conformance.spec.registry import Variant
from conformance.vocabulary import CaseSkipped


@openai_case("SVC-1")
async def models_listed(ctx: Ctx) -> None:
    """GET /v1/models is a list of model objects naming the model, and the model answers on the
    endpoints the server serves."""
    exchange = await ctx.http.request("GET", "/models")
    body = exchange.json()
    ctx.check.equal("GET /models status", 200, exchange.status)
    if not isinstance(body, dict):
        ctx.check.fail("GET /models body", "a JSON object", exchange.text[:200])
    ctx.check.equal("GET /models object", "list", body.get("object"))
    entries = body.get("data") if isinstance(body.get("data"), list) else []
    ctx.check.that(
        all(
            isinstance(m, dict) and m.get("object") == "model" and isinstance(m.get("id"), str)
            for m in entries
        ),
        "GET /models entries",
        'objects with object "model" and a string id',
        entries[:3],
    )
    models, _ = await list_models(ctx.http.target.client, ctx.budgets.rpc_s)
    ctx.check.that(ctx.http.model in models, "the models listed", f"include {ctx.http.model!r}", models)
    for api in support(ctx).apis():
        await answered(ctx, base_probe(api), f"{api} with the listed model")


@openai_case("ERR-4", tag="unknown-path")
async def unknown_path(ctx: Ctx) -> None:
    """A path the API does not have is a 404 with an error object."""
    exchange = await ctx.http.request("POST", "/lmrpc-no-such-endpoint", json_body={"model": ctx.http.model})
    expect_refused(ctx, exchange, "POST /v1/lmrpc-no-such-endpoint", (404,))


@openai_case("ERR-4", tag="unknown-model")
async def unknown_model(ctx: Ctx) -> None:
    """A model the server does not list is a 404 with an error object (OpenAI's model_not_found),
    never an answer from another model."""
    if ctx.http.target.endpoint.base_url.startswith("sglang-runtime:"):
        raise CaseSkipped(
            "SGLang's native service serves one model and answers whatever model a request names "
            "(its servicer echoes it): a 404 is a rule of OpenAI's HTTP API this transport does not carry"
        )
    for api in support(ctx).apis():
        exchange = await ctx.http.send(base_probe(api).with_body(model="lmrpc-no-such-model"))
        expect_refused(ctx, exchange, f"{api} with model lmrpc-no-such-model", (404,))


@openai_case("AUTH-1")
async def api_key_required(ctx: Ctx) -> None:
    """With --api-key: a call without the key, or with another key, is a 401 with an error object."""
    if not ctx.http.target.endpoint.api_key:
        raise CaseSkipped("no --api-key given: the server is taken to need none")
    api = support(ctx).apis()[0]
    for what, header in (("no key", ""), ("another key", "Bearer lmrpc-wrong-key")):
        exchange = await ctx.http.send(base_probe(api), headers={"authorization": header})
        expect_refused(ctx, exchange, f"{api} with {what}", (401,))


CAPABILITY_VARIANTS = [
    Variant({"feature": name}, tag=name)
    for name in ("n", "logprobs", "stream", "include_usage", "echo", "max_completion_tokens", "content_parts")
]
ONE_API = {"echo": "completions", "max_completion_tokens": "chat", "content_parts": "chat"}
# Input forms the API defines as the same request: honoured means the same greedy answer.
SAME_AS_THE_PROBE = frozenset({"content_parts"})


@openai_case("CAP-1", variants=CAPABILITY_VARIANTS)
async def honoured_or_refused(ctx: Ctx) -> None:
    """An optional parameter is honoured (two choices for n=2, logprobs when asked, an event
    stream, a usage chunk, the prompt echoed, a completion cut at max_completion_tokens, content
    parts read as the same text) or refused with a 4xx: never accepted and ignored."""
    name = str(ctx.params["feature"])
    only = ONE_API.get(name)
    served = [a for a in support(ctx).apis() if only is None or a == only]
    if not served:
        raise CaseSkipped(f"{name} is a {only} parameter and the server does not serve {only}")
    probe = PROBES[f"{only}.{name}" if only else name]
    for api in served:
        request, judge = probe(base_probe(api), None)
        assert request is not None
        exchange = await ctx.http.send(request)
        found = support(ctx).feature(api, name)
        if 400 <= exchange.status < 500:
            expect_refused(ctx, exchange, f"{api} {name}, refused")
            continue
        if exchange.status != 200:
            ctx.check.add(f"{api} {name}", "honoured, or a 4xx with an error object", exchange.summary())
            continue
        verdict = judge(view_of(exchange), exchange)
        ctx.check.that(
            verdict.state is State.HONOURED,
            f"{api} {name}",
            "honoured, or refused with a 4xx",
            verdict.detail,
        )
        if name in SAME_AS_THE_PROBE and verdict.state is State.HONOURED:
            await _same_as_the_probe(ctx, api, name, view_of(exchange))
        ctx.note(f"{api} {name}: {verdict.state.value} ({verdict.detail}); at connect: {found.state.value}")


async def _same_as_the_probe(ctx: Ctx, api: Api, name: str, answer: CompletionView) -> None:
    """The same request in another form: the same prompt tokens, and under greedy decoding the same
    text, as the probe's plain form."""
    plain = view_of(await ctx.http.send(base_probe(api)))
    counts = [_prompt_tokens(v) for v in (plain, answer)]
    if None not in counts:
        ctx.check.that(
            counts[0] == counts[1],
            f"{api} {name}: usage.prompt_tokens",
            f"{counts[0]}, as for the same text as a string",
            str(counts[1]),
        )
    if support(ctx).deterministic:
        ctx.check.that(
            answer.texts() == plain.texts(),
            f"{api} {name} (greedy)",
            f"the answer to the same text as a string: {plain.texts()!r}",
            repr(answer.texts()),
        )


def _prompt_tokens(view: CompletionView) -> int | None:
    usage = view.usage
    count = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return count if isinstance(count, int) else None
