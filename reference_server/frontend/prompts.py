"""The one prompt encoder: the token ids of a text or chat prompt.

Generate and Tokenize both encode through ``encode_prompt``, so Tokenize returns exactly the ids
Generate would run (TOK-1); every dialect reaches it through Generate. ``parse_special_tokens``
absent parses special-token strings in text and not in chat content (REQ-8); a chat prompt's
``add_generation_prompt`` absent appends the assistant prefix (SAMPLE-8).
"""

from __future__ import annotations

from lmrpc.v1 import ChatInput
from reference_server.frontend.validation import invalid
from reference_server.models.tokenizer import TokenizerBundle

Prompt = str | ChatInput  # text, or a conversation for the model's chat template


def encode_prompt(tokenizer: TokenizerBundle, prompt: Prompt, parse_special_tokens: bool | None) -> list[int]:
    """Blocking (run it in a thread); a conversation the template rejects is INVALID_ARGUMENT."""
    if isinstance(prompt, str):
        return tokenizer.encode(prompt, parse_special_tokens=parse_special_tokens is not False)
    messages = [{"role": m.role, "content": m.content} for m in prompt.messages]
    try:
        return tokenizer.encode_chat(
            messages,
            add_generation_prompt=prompt.add_generation_prompt is not False,
            parse_special_tokens=parse_special_tokens is True,
        )
    except Exception as exc:  # the template rejected the conversation
        raise invalid(f"chat: the model's chat template rejected the messages: {exc}") from None
