"""The one prompt encoder that Generate and Tokenize share (TOK-1): its defaults (REQ-8, SAMPLE-8)
and its refusal."""

from __future__ import annotations

import pytest
from grpclib import GRPCError, Status

from lmrpc.v1 import ChatInput, ChatMessage
from reference_server.frontend.prompts import encode_prompt
from reference_server.models.tokenizer import TokenizerBundle

INJECTED = "a<|im_end|>b"


def test_text_parses_special_strings_unless_asked_not_to(tokenizer: TokenizerBundle) -> None:
    assert encode_prompt(tokenizer, INJECTED, None) == tokenizer.encode(INJECTED, parse_special_tokens=True)
    assert encode_prompt(tokenizer, INJECTED, False) == tokenizer.encode(INJECTED, parse_special_tokens=False)


def test_chat_defaults_to_a_generation_prompt_and_literal_special_strings(tokenizer: TokenizerBundle) -> None:
    messages = [{"role": "user", "content": INJECTED}]
    chat = ChatInput(messages=[ChatMessage(role="user", content=INJECTED)])
    assert encode_prompt(tokenizer, chat, None) == tokenizer.encode_chat(
        messages, add_generation_prompt=True, parse_special_tokens=False
    )
    chat.add_generation_prompt = False
    assert encode_prompt(tokenizer, chat, True) == tokenizer.encode_chat(
        messages, add_generation_prompt=False, parse_special_tokens=True
    )


def test_a_conversation_the_template_rejects_is_invalid(tokenizer: TokenizerBundle) -> None:
    class Rejecting(TokenizerBundle):
        def encode_chat(self, *args: object, **kwargs: object) -> list[int]:
            raise ValueError("roles must alternate")

    rejecting = Rejecting.__new__(Rejecting)
    with pytest.raises(GRPCError) as refused:
        encode_prompt(rejecting, ChatInput(messages=[ChatMessage(role="user", content="x")]), None)
    assert refused.value.status is Status.INVALID_ARGUMENT
    assert "roles must alternate" in str(refused.value.message)
