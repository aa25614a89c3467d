"""Incremental, UTF-8-safe detokenization of one output.

Two strategies, picked once per tokenizer:

- ``ByteStreamDecoder`` for byte-level BPE (GPT-2 style) tokenizers: every token is a fixed byte
  string, so the output is one byte stream fed through an incremental UTF-8 decoder. An
  incomplete character stays buffered until its last byte arrives; an invalid byte sequence
  becomes U+FFFD exactly where a full decode would put one. Added (special) tokens are inserted
  as their text and split the byte stream, as the tokenizer's own decode does.
- ``WindowDecoder`` for any other tokenizer: decode a short window of recent ids and emit the
  new suffix, holding back while the window ends in U+FFFD (an incomplete character).

Both guarantee: the concatenated pieces equal ``tokenizer.decode(all_ids)``; no piece ends
inside a character; no character is emitted twice.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Protocol

from tokenizers import Tokenizer

from reference_server.models.tokenizer import byte_level_pieces

REPLACEMENT_CHARACTER = "\ufffd"


class OutputDecoder(Protocol):
    def feed(self, token_id: int) -> str:
        """Text that token completes (possibly empty)."""
        ...

    def flush(self) -> str:
        """Whatever is still buffered, at the end of the output."""
        ...

    def inside_character(self) -> bool:
        """The last token fed ended inside a character (its bytes are buffered)."""
        ...


@dataclass(frozen=True)
class DecodeTable:
    """Per-tokenizer data shared by all outputs."""

    tokenizer: Tokenizer
    token_bytes: list[bytes] | None  # byte string of each regular token; None: not byte-level
    added_text: dict[int, str]  # added tokens: id -> text
    special_ids: frozenset[int]

    @classmethod
    def build(cls, tokenizer: Tokenizer, vocab_size: int) -> DecodeTable:
        added = tokenizer.get_added_tokens_decoder()
        added_text = {token_id: token.content for token_id, token in added.items()}
        special_ids = frozenset(token_id for token_id, token in added.items() if token.special)
        return cls(tokenizer, byte_level_pieces(tokenizer, vocab_size), added_text, special_ids)

    def decoder(self, *, skip_special_tokens: bool, whole_tokens: bool = False) -> OutputDecoder:
        decoder: OutputDecoder
        if self.token_bytes is not None:
            decoder = ByteStreamDecoder(self, skip_special_tokens)
        else:
            decoder = WindowDecoder(self.tokenizer, skip_special_tokens)
        return WholeTokenDecoder(decoder) if whole_tokens else decoder


class ByteStreamDecoder:
    def __init__(self, table: DecodeTable, skip_special_tokens: bool) -> None:
        assert table.token_bytes is not None
        self._bytes = table.token_bytes
        self._added = table.added_text
        self._skipped = table.special_ids if skip_special_tokens else frozenset()
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        if token_id in self._skipped:
            return ""
        text = self._added.get(token_id)
        if text is not None:
            return self.flush() + text
        return self._utf8.decode(self._bytes[token_id])

    def flush(self) -> str:
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text

    def inside_character(self) -> bool:
        return bool(self._utf8.getstate()[0])


class WindowDecoder:
    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0  # start of the decoding window
        self._read_offset = 0  # ids before this are already emitted

    def _decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=self._skip))

    def feed(self, token_id: int) -> str:
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        window_text = self._decode(self._ids[self._prefix_offset :])
        if window_text.endswith(REPLACEMENT_CHARACTER) or len(window_text) <= len(prefix_text):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return window_text[len(prefix_text) :]

    def flush(self) -> str:
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        window_text = self._decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        return window_text[len(prefix_text) :]

    def inside_character(self) -> bool:
        return self._read_offset < len(self._ids)  # the window holds its tokens whole already


class WholeTokenDecoder:
    """Text a whole token at a time: what a token completes is held with the rest of its text while
    the token ends inside a character (vLLM's detokenizer), so text never shows part of a token."""

    def __init__(self, inner: OutputDecoder) -> None:
        self._inner = inner
        self._held = ""

    def feed(self, token_id: int) -> str:
        self._held += self._inner.feed(token_id)
        if self._inner.inside_character():
            return ""
        text, self._held = self._held, ""
        return text

    def flush(self) -> str:
        text, self._held = self._held + self._inner.flush(), ""
        return text

    def inside_character(self) -> bool:
        return self._inner.inside_character()
