"""Is an OpenAI-compatible server still serving? Its model list answers: a cheap request, never a
generation, so a slow or busy server is not taken for a dead one."""

from __future__ import annotations

from conformance.drivers.openai.discover import list_models
from conformance.drivers.openai.target import HttpTarget


async def http_alive(target: HttpTarget, budget_s: float) -> tuple[bool, str]:
    try:
        models, _ = await list_models(target.client, budget_s)
    except Exception as exc:
        return False, f"GET /models: {type(exc).__name__}: {exc}"
    return True, f"serving (GET /models lists {models})"
