"""The tokenizer files a gateway needs to tokenize, template and detokenize for this server.

smg's engine dialects run the tokenizer in the gateway: it fetches a zip over ``GetTokenizer``
(``smg.grpc.common.GetTokenizerChunk``, SHA-256 of the whole zip on the last chunk). The files
are written from what the server itself loaded (``models/tokenizer.py``), for a GGUF model as
for a Hugging Face directory, so the gateway's tokenization is exactly the server's:

- ``tokenizer.json``: the ``tokenizers`` Tokenizer the server encodes and decodes with;
- ``tokenizer_config.json``: chat template, BOS/EOS tokens, context length;
- ``generation_config.json`` and ``config.json``: BOS/EOS ids, vocabulary, architecture.

The zip is deterministic (fixed timestamps, sorted names): the same model gives the same digest.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from grpclib import GRPCError, Status

from reference_server.frontend.context import FrontendContext
from reference_server.ipc import EngineInfo
from reference_server.models.tokenizer import TokenizerBundle

CHUNK_BYTES = 64 * 1024
ZIP_TIMESTAMP = (1980, 1, 1, 0, 0, 0)
ARCHITECTURES = {"llama": "LlamaForCausalLM"}


@dataclass(frozen=True, slots=True)
class TokenizerZip:
    data: bytes
    sha256: str

    def chunks(self) -> Iterator[tuple[bytes, str]]:
        """``(bytes, sha256)`` pieces in order; the digest rides on the last piece only."""
        for start in range(0, len(self.data), CHUNK_BYTES):
            end = start + CHUNK_BYTES
            yield self.data[start:end], self.sha256 if end >= len(self.data) else ""


class TokenizerZipSource:
    """The tokenizer zip, built once (in a thread) by the first caller of any dialect; later
    callers share it. A build that failed is tried again by the next caller."""

    def __init__(self, ctx: FrontendContext) -> None:
        self.ctx = ctx
        self._zip: asyncio.Future[TokenizerZip] | None = None

    async def get(self) -> TokenizerZip:
        if self._zip is None:
            engine = self.ctx.ready_engine()
            self._zip = asyncio.ensure_future(
                asyncio.to_thread(build_tokenizer_zip, engine.tokenizer, engine.info)
            )
        try:
            return await asyncio.shield(self._zip)
        except Exception as exc:
            self._zip = None
            raise GRPCError(Status.INTERNAL, f"cannot build the tokenizer bundle: {exc}") from exc


def architecture_names(info: EngineInfo) -> list[str]:
    return [ARCHITECTURES.get(info.architecture, info.architecture)]


def tokenizer_files(tokenizer: TokenizerBundle, info: EngineInfo) -> dict[str, str]:
    eos_ids: int | list[int] = list(tokenizer.eos_token_ids)
    if len(tokenizer.eos_token_ids) == 1:
        eos_ids = tokenizer.eos_token_ids[0]
    tokenizer_config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tokenizer.bos_token or None,
        "eos_token": tokenizer.eos_token or None,
        "add_bos_token": False,  # the server adds no BOS; a chat template writes its own
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": info.max_context_tokens,
    }
    if tokenizer.chat_template is not None:
        tokenizer_config["chat_template"] = tokenizer.chat_template
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": eos_ids}
    config = {
        "architectures": architecture_names(info),
        "model_type": info.architecture,
        "vocab_size": info.vocab_size,
        "max_position_embeddings": info.max_context_tokens,
        **ids,
    }
    return {
        "tokenizer.json": tokenizer.tokenizer.to_str(),
        "tokenizer_config.json": _json(tokenizer_config),
        "generation_config.json": _json(ids),
        "config.json": _json(config),
    }


def build_tokenizer_zip(tokenizer: TokenizerBundle, info: EngineInfo) -> TokenizerZip:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, text in sorted(tokenizer_files(tokenizer, info).items()):
            entry = zipfile.ZipInfo(name, date_time=ZIP_TIMESTAMP)
            entry.compress_type = zipfile.ZIP_DEFLATED
            entry.external_attr = 0o644 << 16
            archive.writestr(entry, text)
    data = buffer.getvalue()
    return TokenizerZip(data, hashlib.sha256(data).hexdigest())


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
