"""The tokenizer bundle of smg's engine protocols (``GetTokenizer``): collected and checked the way
smg does (``crates/grpc_client/src/tokenizer_bundle.rs``), then loaded.

smg concatenates the chunks, wants a SHA-256 on the last one and checks it against the bytes,
then opens the zip (at most 50 entries, none outside the archive, at most 500 MB unpacked) and
loads ``tokenizer.json``; the end-of-sequence ids it strips come from ``generation_config.json``
(else ``config.json``, else the ``eos_token`` of ``tokenizer_config.json``). The driver tokenizes
text prompts with this tokenizer, as the gateway does.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from tokenizers import Tokenizer

MAX_ENTRIES = 50
MAX_UNPACKED_BYTES = 500 * 1024 * 1024


class BundleError(Exception):
    """The bundle cannot be used: what smg would refuse, or no tokenizer in it."""


@dataclass(frozen=True, slots=True)
class Bundle:
    chunks: tuple[tuple[bytes, str], ...]  # (data, sha256) of each GetTokenizerChunk, in order

    @property
    def data(self) -> bytes:
        return b"".join(data for data, _ in self.chunks)

    @property
    def sha256(self) -> str:
        return self.chunks[-1][1] if self.chunks else ""

    def problems(self) -> list[str]:
        """What smg refuses: no chunks, no digest on the last chunk, a digest that does not match,
        an empty or unsafe zip, no loadable ``tokenizer.json``."""
        if not self.chunks:
            return ["no chunks (an empty stream)"]
        out = []
        if not self.sha256:
            out.append("the last chunk carries no sha256")
        elif hashlib.sha256(self.data).hexdigest() != self.sha256.lower():
            out.append(
                f"sha256 {self.sha256} does not match the bytes ({hashlib.sha256(self.data).hexdigest()})"
            )
        try:
            self.tokenizer()
        except BundleError as exc:
            out.append(str(exc))
        return out

    def archive(self) -> zipfile.ZipFile:
        if not self.data:
            raise BundleError("the bundle is empty")
        try:
            archive = zipfile.ZipFile(io.BytesIO(self.data))
        except zipfile.BadZipFile as exc:
            raise BundleError(f"not a zip archive: {exc}") from None
        entries = archive.infolist()
        if len(entries) > MAX_ENTRIES:
            raise BundleError(f"{len(entries)} zip entries (smg accepts at most {MAX_ENTRIES})")
        if sum(e.file_size for e in entries) > MAX_UNPACKED_BYTES:
            raise BundleError(f"more than {MAX_UNPACKED_BYTES} bytes unpacked")
        for entry in entries:
            path = PurePosixPath(entry.filename)
            if path.is_absolute() or ".." in path.parts or ":" in entry.filename:
                raise BundleError(f"zip entry {entry.filename!r} points outside the archive")
        return archive

    def tokenizer(self) -> Tokenizer:
        archive = self.archive()
        try:
            text = archive.read(_member(archive, "tokenizer.json")).decode("utf-8")
        except (KeyError, UnicodeDecodeError) as exc:
            raise BundleError(f"no readable tokenizer.json: {exc}") from None
        try:
            return Tokenizer.from_str(text)
        except Exception as exc:  # tokenizers raises its own exception types
            raise BundleError(f"tokenizer.json does not load: {exc}") from None

    def eos_ids(self) -> list[int]:
        """The end-of-sequence ids the gateway takes from the bundle (empty when it names none)."""
        archive = self.archive()
        for name in ("generation_config.json", "config.json"):
            found = _json(archive, name).get("eos_token_id")
            if isinstance(found, int):
                return [found]
            if isinstance(found, list) and all(isinstance(i, int) for i in found):
                return list(found)
        token = _json(archive, "tokenizer_config.json").get("eos_token")
        if isinstance(token, dict):
            token = token.get("content")
        if isinstance(token, str) and (token_id := self.tokenizer().token_to_id(token)) is not None:
            return [token_id]
        return []


def _member(archive: zipfile.ZipFile, name: str) -> str:
    """The entry named ``name`` at the top or inside one folder (bundles of a model directory)."""
    for entry in archive.namelist():
        if entry == name or entry.endswith("/" + name):
            return entry
    raise KeyError(name)


def _json(archive: zipfile.ZipFile, name: str) -> dict[str, Any]:
    try:
        value = json.loads(archive.read(_member(archive, name)))
    except (KeyError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
