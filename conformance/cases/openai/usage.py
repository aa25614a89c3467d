"""Usage counts: where the usage comes (USAGE-1), the prompt counted once (USAGE-2), the choices'
tokens summed (N-2), the prompt counted as the server's own tokenizer counts it (TOK-1), and a
repeated prompt found in the cache (USAGE-6, when promised)."""

from __future__ import annotations

from conformance.cases.openai._common import LONG_PROMPT, answered, apis, make, openai_case, support
from conformance.drivers.openai.discover import count_tokens
from conformance.harness.context import Ctx
from conformance.validators.openai import CHECKS, usage_numbers
from conformance.vocabulary import CaseSkipped

LONGEST_PROBE = 1024  # the longest prompt tried for USAGE-6

N2_PROMPTS = (LONG_PROMPT, "List the days of the week, then the months of the year:", "1, 2, 3, 4, 5,")
N2_MAX_TOKENS = 8


@openai_case("USAGE-1", tag="stream")
async def usage_chunk(ctx: Ctx) -> None:
    """With stream_options.include_usage exactly one chunk carries usage: the last before [DONE],
    with empty choices (for n = 1 and n = 2)."""
    for api in apis(ctx, "stream", "include_usage"):
        for n in (1, 2) if support(ctx).has(api, "n") else (1,):
            request = make(
                api,
                max_tokens=ctx.tuning.max_tokens,
                n=n,
                stream=True,
                stream_options={"include_usage": True},
            )
            ctx.check.extend(CHECKS["USAGE-1"](await answered(ctx, request)))


@openai_case("USAGE-2")
async def prompt_counted_once(ctx: Ctx) -> None:
    """prompt_tokens is the same for n = 1 and n = 2, streamed and not: the prompt counted once.
    Only the counts the server sent are compared: an answer without usage is USAGE-1's finding."""
    for api in support(ctx).apis():
        base = make(api, max_tokens=4, temperature=0)
        variants = {"n=1": base}
        if support(ctx).has(api, "n"):
            variants["n=2"] = base.with_body(n=2, temperature=1.0)
        if support(ctx).has(api, "include_usage"):
            variants["n=1 streamed"] = base.with_body(stream=True, stream_options={"include_usage": True})
            if support(ctx).has(api, "n"):
                variants["n=2 streamed"] = base.with_body(
                    n=2, temperature=1.0, stream=True, stream_options={"include_usage": True}
                )
        counts = {}
        for what, request in variants.items():
            numbers = usage_numbers((await answered(ctx, request)).view.usage)
            counts[what] = numbers[0] if numbers else None
        missing = sorted(what for what, count in counts.items() if count is None)
        if missing:
            ctx.note(f"{api}: no usage on {', '.join(missing)} (USAGE-1 judges that), so not compared")
        sent = {what: count for what, count in counts.items() if count is not None}
        ctx.check.that(
            len(set(sent.values())) <= 1,
            f"{api} prompt_tokens of the same prompt",
            "the same integer every time",
            sent,
        )


@openai_case("N-2")
async def n_charges_every_choice(ctx: Ctx) -> None:
    """n = 2 charges both choices: two choices that ended length at max_tokens report 2 · max_tokens
    completion tokens, and one choice alone max_tokens (streamed with usage too)."""
    judged = 0
    for api in apis(ctx, "n"):
        for prompt in N2_PROMPTS:
            for stream in (False, True) if support(ctx).has(api, "include_usage") else (False,):
                extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
                for n in (1, 2):
                    # several greedy choices (equal, so both run to max_tokens) where the server takes them
                    greedy = n == 1 or support(ctx).has(api, "greedy_n")
                    temperature = 0 if greedy else 1.0
                    request = make(
                        api, prompt, max_tokens=N2_MAX_TOKENS, temperature=temperature, n=n, **extra
                    )
                    answer = await answered(ctx, request)
                    finishes = [c.finish for _, c in sorted(answer.view.choices.items())]
                    numbers = usage_numbers(answer.view.usage)
                    if finishes != ["length"] * n or numbers is None:
                        continue
                    judged += 1
                    ctx.check.equal(
                        f"{api}{' stream' if stream else ''} n={n} completion_tokens ({n} choices that ended length "
                        f"at max_tokens={N2_MAX_TOKENS})",
                        n * N2_MAX_TOKENS,
                        numbers[1],
                    )
            if judged:
                break
    if not judged:
        raise CaseSkipped(f"no prompt of {N2_PROMPTS} ran {N2_MAX_TOKENS} tokens without stopping")


@openai_case("TOK-1")
async def prompt_tokens_as_tokenized(ctx: Ctx) -> None:
    """A completion's prompt_tokens is what the server's own tokenizer endpoint counts for its prompt
    (with or without the special tokens it adds)."""
    tokenizer = ctx.http.target.tokenizer
    if tokenizer is None:
        raise CaseSkipped("the server has no tokenizer endpoint the harness knows (/tokenize, /v1/tokenize)")
    support(ctx).need("completions")
    client = ctx.http.target.client
    for prompt in ("Hello", LONG_PROMPT, "日本語で答えてください。🙂"):
        counts = {
            await count_tokens(client, tokenizer, ctx.http.model, prompt, special, ctx.budgets.rpc_s)
            for special in (False, True)
        }
        numbers = usage_numbers((await answered(ctx, make("completions", prompt, max_tokens=1))).view.usage)
        ctx.check.that(
            numbers is not None and numbers[0] in counts,
            f"prompt_tokens of {prompt!r}",
            f"one of {sorted(c for c in counts if c is not None)} ({tokenizer})",
            numbers[0] if numbers else None,
        )


@openai_case("USAGE-6", exclusive=True)
async def repeated_prompt_cached(ctx: Ctx) -> None:
    """With --assume prefix_cache: the same prompt again reports cached_tokens > 0. The API does not
    say how the cache keeps prompts (vLLM keeps whole blocks: 16 tokens on a GPU, 128 on a CPU), so a
    prompt not found again is repeated fourfold until one is, up to LONGEST_PROBE tokens."""
    if not ctx.info.caps.prefix_cache:
        raise CaseSkipped("the API cannot show a prefix cache: --assume prefix_cache promises one")
    api = support(ctx).apis()[0]
    copies, tried = 3, []
    while True:
        request = make(api, " ".join([LONG_PROMPT] * copies), max_tokens=2, temperature=0)
        await answered(ctx, request, "the first request")
        usage = (await answered(ctx, request, "the same request again")).view.usage
        numbers = usage_numbers(usage)
        details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        tried.append((numbers[0] if numbers else None, cached))
        if isinstance(cached, int) and cached > 0:
            if len(tried) > 1:
                ctx.note(f"(prompt tokens, cached tokens) of each length tried: {tried}")
            return
        if cached is None:
            raise CaseSkipped(
                f"the {api} answer carries no usage.prompt_tokens_details.cached_tokens, so nothing shows a "
                "prefix cache (vLLM reports it with --enable-prompt-tokens-details)"
            )
        prompt = numbers[0] if numbers else LONGEST_PROBE
        if prompt * 4 > LONGEST_PROBE:
            break
        copies *= 4
    ctx.check.add(
        f"{api} cached_tokens of a repeated prompt (prompt tokens, cached tokens) of each length tried",
        "> 0 for one of them",
        tried,
    )
