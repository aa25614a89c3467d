"""The model's tokenizer and chat template, from GGUF metadata or a Hugging Face directory.

For GGUF (gpt2-style byte-level BPE, pre-tokenizer "smollm") the HF ``tokenizers`` Tokenizer is
built from the vocabulary and merges: every digit is split off on its own, then the GPT-2
byte-level regex. Building needs the GGUF header (about 2 s to open), so the result is cached
under ``$LMRPC_CACHE_DIR`` (default ``~/.cache/lmrpc``), keyed by the file's path, size and mtime.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2.sandbox
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from reference_server.cache_dir import cache_dir
from reference_server.models.source import ModelSource

GGUF_CONTROL_TOKEN_TYPE = 3
GGUF_TOKENIZER_KEYS = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.chat_template",
)


@dataclass(frozen=True)
class TokenizerBundle:
    tokenizer: Tokenizer
    vocab_size: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    special_token_ids: frozenset[int]
    chat_template: str | None
    bos_token: str
    eos_token: str
    # No token covers more characters of text than this; None if the tokenizer normalizes text
    # (normalizing may shorten it, so then no such bound holds).
    max_token_chars: int | None
    literal: Tokenizer  # the same tokenizer, encoding special-token strings as ordinary text
    added_strings: tuple[str, ...]  # the text of every added (special) token

    def encode(self, text: str, *, parse_special_tokens: bool = True) -> list[int]:
        """Token ids of raw text; no BOS/EOS is added. Special-token strings map to their ids, or,
        with ``parse_special_tokens=False``, are encoded as ordinary text (REQ-8)."""
        tokenizer = self.tokenizer if parse_special_tokens else self.literal
        return list(tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens))

    def render_chat(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True) -> str:
        if self.chat_template is None:
            raise ValueError("the model has no chat template")
        return _compile_template(self.chat_template).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )

    def encode_chat(
        self,
        messages: list[dict[str, str]],
        *,
        add_generation_prompt: bool = True,
        parse_special_tokens: bool = False,
    ) -> list[int]:
        """The rendered conversation's ids. Only the template adds special tokens: special-token
        strings inside a message's role or content are encoded as text (REQ-8), unless
        ``parse_special_tokens``."""
        rendered = self.render_chat(messages, add_generation_prompt=add_generation_prompt)
        spans = [] if parse_special_tokens else self._literal_spans(rendered, messages)
        ids: list[int] = []
        start = 0
        for begin, end in spans:
            ids += self.encode(rendered[start:begin])
            ids += self.encode(rendered[begin:end], parse_special_tokens=False)
            start = end
        return ids + self.encode(rendered[start:])

    def _literal_spans(self, rendered: str, messages: list[dict[str, str]]) -> list[tuple[int, int]]:
        """Where the rendered template holds message text that contains a special-token string,
        found in message order."""
        spans, position = [], 0
        for message in messages:
            for text in (message["role"], message["content"]):
                found = rendered.find(text, position) if text else -1
                if found < 0:
                    continue
                if any(special in text for special in self.added_strings):
                    spans.append((found, found + len(text)))
                position = found + len(text)
        return spans


_templates: dict[str, jinja2.Template] = {}


def _raise_exception(message: str) -> None:
    raise ValueError(message)


def _compile_template(source: str) -> jinja2.Template:
    template = _templates.get(source)
    if template is None:
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_exception
        template = _templates[source] = env.from_string(source)
    return template


def load_tokenizer(source: ModelSource) -> TokenizerBundle:
    if source.kind == "gguf":
        return _load_gguf_tokenizer(source.path)
    return _load_hf_tokenizer(source.path)


# ── GGUF ────────────────────────────────────────────────────────────────────────────────────


def _cache_key(path: Path) -> str:
    stat = path.stat()
    return hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:v1".encode()).hexdigest()[:24]


def _load_gguf_tokenizer(path: Path) -> TokenizerBundle:
    folder = cache_dir() / "tokenizers" / _cache_key(path)
    tokenizer_file, meta_file = folder / "tokenizer.json", folder / "meta.json"
    if tokenizer_file.is_file() and meta_file.is_file():
        return _bundle(Tokenizer.from_file(str(tokenizer_file)), json.loads(meta_file.read_text()))
    tokenizer, meta = _build_gguf_tokenizer(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".tmp-{os.getpid()}"
        tokenizer.save(str(tmp))
        os.replace(tmp, tokenizer_file)
        meta_file.write_text(json.dumps(meta))
    except OSError:
        pass  # a read-only home only costs the cache
    return _bundle(tokenizer, meta)


def _build_gguf_tokenizer(path: Path) -> tuple[Tokenizer, dict[str, Any]]:
    from gguf import GGUFReader

    reader = GGUFReader(path)

    def strings(key: str) -> list[str]:
        field = reader.fields[key]
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

    def scalar(key: str) -> Any:
        return reader.fields[key].contents() if key in reader.fields else None

    model_kind = scalar("tokenizer.ggml.model")
    if model_kind != "gpt2":
        raise ValueError(f"{path}: tokenizer model {model_kind!r} is not supported (only byte-level BPE)")
    tokens = strings("tokenizer.ggml.tokens")
    merges = strings("tokenizer.ggml.merges")
    token_types = list(reader.fields["tokenizer.ggml.token_type"].contents())
    bpe = models.BPE(
        vocab={token: i for i, token in enumerate(tokens)},
        merges=[tuple(m.split(" ", 1)) for m in merges],  # type: ignore[misc]
        fuse_unk=False,
        byte_fallback=False,
    )
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    specials = [t for t, kind in zip(tokens, token_types, strict=True) if kind == GGUF_CONTROL_TOKEN_TYPE]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    bos = scalar("tokenizer.ggml.bos_token_id")
    eos = scalar("tokenizer.ggml.eos_token_id")
    meta = {
        "vocab_size": len(tokens),
        "bos_token_id": None if bos is None else int(bos),
        "eos_token_ids": [] if eos is None else [int(eos)],
        "chat_template": scalar("tokenizer.chat_template"),
    }
    return tokenizer, meta


# ── Hugging Face directory ──────────────────────────────────────────────────────────────────


def _load_hf_tokenizer(folder: Path) -> TokenizerBundle:
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    config = _read_json(folder / "config.json")
    tok_config = _read_json(folder / "tokenizer_config.json")
    gen_config = _read_json(folder / "generation_config.json")
    eos: Any = gen_config.get("eos_token_id", config.get("eos_token_id"))
    if eos is None and isinstance(tok_config.get("eos_token"), str):
        eos = tokenizer.token_to_id(tok_config["eos_token"])
    eos_ids = [int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None]
    bos = config.get("bos_token_id")
    template = tok_config.get("chat_template")
    meta = {
        "vocab_size": int(config.get("vocab_size", tokenizer.get_vocab_size(with_added_tokens=True))),
        "bos_token_id": None if bos is None else int(bos),
        "eos_token_ids": eos_ids,
        "chat_template": template if isinstance(template, str) else None,
    }
    return _bundle(tokenizer, meta)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}


def _bundle(tokenizer: Tokenizer, meta: dict[str, Any]) -> TokenizerBundle:
    special_ids = frozenset(
        token_id for token_id, added in tokenizer.get_added_tokens_decoder().items() if added.special
    )
    bos_id = meta["bos_token_id"]
    eos_ids = tuple(meta["eos_token_ids"])
    literal = Tokenizer.from_str(tokenizer.to_str())
    literal.encode_special_tokens = True
    return TokenizerBundle(
        tokenizer=tokenizer,
        vocab_size=int(meta["vocab_size"]),
        bos_token_id=bos_id,
        eos_token_ids=eos_ids,
        special_token_ids=special_ids,
        chat_template=meta["chat_template"],
        bos_token=(tokenizer.id_to_token(bos_id) or "") if bos_id is not None else "",
        eos_token=(tokenizer.id_to_token(eos_ids[0]) or "") if eos_ids else "",
        max_token_chars=(
            None
            if tokenizer.normalizer is not None
            else max((len(t) for t in tokenizer.get_vocab(with_added_tokens=True)), default=1)
        ),
        literal=literal,
        added_strings=tuple(added.content for added in tokenizer.get_added_tokens_decoder().values()),
    )


def byte_level_pieces(tokenizer: Tokenizer, vocab_size: int) -> list[bytes] | None:
    """The bytes each regular token stands for, where the vocabulary is byte-level (GPT-2's
    printable stand-ins for bytes): ``b""`` for added tokens and ids the tokenizer lacks. None for
    any other kind of vocabulary, whose tokens are not fixed byte strings."""
    if not isinstance(tokenizer.decoder, decoders.ByteLevel):
        return None
    added = tokenizer.get_added_tokens_decoder()
    char_to_byte = {char: byte for byte, char in _byte_to_char().items()}
    pieces = []
    for token_id in range(vocab_size):
        piece = tokenizer.id_to_token(token_id)
        if piece is None or token_id in added:
            pieces.append(b"")
        else:
            pieces.append(bytes(char_to_byte.get(ch, 0x3F) for ch in piece))
    return pieces


def whole_character_tokens(bundle: TokenizerBundle) -> tuple[int, ...]:
    """Regular tokens whose bytes are complete UTF-8 text (what the fake engine samples from)."""
    added = bundle.tokenizer.get_added_tokens_decoder()
    pieces = byte_level_pieces(bundle.tokenizer, bundle.vocab_size)
    result = []
    for token_id in range(bundle.vocab_size):
        if token_id in added:
            continue
        if pieces is None:
            result.append(token_id)
            continue
        try:
            if pieces[token_id].decode("utf-8"):
                result.append(token_id)
        except UnicodeDecodeError:
            pass
    return tuple(result)


def _byte_to_char() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    )
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping
