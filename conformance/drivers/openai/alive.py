"""Is an OpenAI-compatible server still serving? Its model list and a one-token completion."""

from __future__ import annotations

from conformance.drivers.openai.discover import list_models
from conformance.drivers.openai.exchange import End
from conformance.drivers.openai.support import base_probe
from conformance.drivers.openai.target import HttpTarget
from conformance.drivers.openai.view import view_of


async def http_alive(target: HttpTarget, budget_s: float) -> tuple[bool, str]:
    try:
        await list_models(target.client, budget_s)
    except Exception as exc:
        return False, f"GET /models: {type(exc).__name__}: {exc}"
    api = target.support.apis()[0] if target.support.apis() else "chat"
    exchange = await target.client.send(
        base_probe(api).with_body(max_tokens=1), total_s=budget_s, idle_s=budget_s
    )
    if exchange.status != 200 or exchange.end is not End.OK or not view_of(exchange).choices:
        return False, f"a one-token {api} request: {exchange.summary()}"
    return True, "serving"
