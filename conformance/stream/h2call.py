"""One gRPC call spoken frame by frame over its own HTTP/2 connection (the ``h2`` package).

For what no gRPC library sends: a length prefix that lies, several messages on a unary call, a
request stream that never ends, a receive window the client never reopens (a client that does not
read, FLOW-1/FLOW-2). Plaintext or TLS; credentials go in as metadata.
"""

from __future__ import annotations

import asyncio
import ssl
import struct
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
from grpclib import Status


def frame(body: bytes, *, flag: int = 0, length: int | None = None) -> bytes:
    """One gRPC length-prefixed message; ``length`` overrides the declared size."""
    return struct.pack(">BI", flag, len(body) if length is None else length) + body


@dataclass
class H2Result:
    headers: dict[str, str] = field(default_factory=dict)
    data: bytes = b""
    trailers: dict[str, str] = field(default_factory=dict)
    reset: int | None = None  # RST_STREAM error code, if the server reset the stream

    @property
    def status(self) -> Status | None:
        value = self.trailers.get("grpc-status") or self.headers.get("grpc-status")
        return None if value is None else Status(int(value))

    @property
    def message(self) -> str:
        return self.trailers.get("grpc-message") or self.headers.get("grpc-message") or ""

    def messages(self) -> list[bytes]:
        """The complete length-prefixed messages received (a reset may cut the last one short)."""
        out, pos = [], 0
        while pos + 5 <= len(self.data):
            (length,) = struct.unpack(">I", self.data[pos + 1 : pos + 5])
            if pos + 5 + length > len(self.data):
                break
            out.append(self.data[pos + 5 : pos + 5 + length])
            pos += 5 + length
        return out


class H2Call:
    """One HTTP/2 connection with one gRPC call on it, driven frame by frame."""

    def __init__(
        self, host: str, port: int, *, window: int | None = None, tls: ssl.SSLContext | None = None
    ) -> None:
        self.host, self.port, self.tls = host, port, tls
        self.window = window  # our receive window for the stream: None keeps h2's default
        self.result = H2Result()
        self.ended = asyncio.Event()
        self.stream_id = 1
        self._conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pump: asyncio.Task[None] | None = None
        self.read_data = True  # False: never acknowledge received data (a client that does not read)

    async def __aenter__(self) -> H2Call:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port, ssl=self.tls)
        self._conn.initiate_connection()
        if self.window is not None:
            self._conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: self.window})
        self._flush()
        self._pump = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._pump is not None:
            self._pump.cancel()
        if self._writer is not None:
            self._writer.close()

    def start(self, path: str, *, metadata: dict[str, str] | None = None) -> None:
        headers = [
            (":method", "POST"), (":scheme", "https" if self.tls else "http"), (":path", path), (":authority", f"{self.host}:{self.port}"),
            ("content-type", "application/grpc"), ("te", "trailers"), *(metadata or {}).items(),
        ]  # fmt: skip
        self._conn.send_headers(self.stream_id, headers)
        self._flush()

    def send(self, data: bytes, *, end: bool = False) -> int:
        """Send as much of ``data`` as flow control allows now; returns the bytes sent."""
        sent = 0
        while sent < len(data):
            room = min(
                self._conn.local_flow_control_window(self.stream_id), self._conn.max_outbound_frame_size
            )
            if room <= 0:
                break
            chunk = data[sent : sent + room]
            sent += len(chunk)
            self._conn.send_data(self.stream_id, chunk, end_stream=end and sent == len(data))
        if end and not data:
            self._conn.end_stream(self.stream_id)
        self._flush()
        return sent

    def next_call(self) -> None:
        """Forget this call's result and make the next ``start`` open a new stream on the same
        connection (to show the connection outlived a refused call)."""
        self.stream_id += 2
        self.result = H2Result()
        self.ended = asyncio.Event()
        self._unacked = 0

    def end(self) -> None:
        self._conn.end_stream(self.stream_id)
        self._flush()

    def reset(self) -> None:
        """Cancel the call: RST_STREAM(CANCEL), what a client does when it gives up."""
        self._conn.reset_stream(self.stream_id, h2.errors.ErrorCodes.CANCEL)
        self._flush()

    def acknowledge(self) -> None:
        """Start reading: open the window for everything received so far and from now on."""
        self.read_data = True
        pending = self._unacked
        self._unacked = 0
        if pending:
            self._conn.acknowledge_received_data(pending, self.stream_id)
            self._flush()

    _unacked = 0

    async def wait(self, timeout: float) -> H2Result:
        await asyncio.wait_for(self.ended.wait(), timeout)
        return self.result

    def _flush(self) -> None:
        assert self._writer is not None
        self._writer.write(self._conn.data_to_send())

    async def _run(self) -> None:
        assert self._reader is not None
        while True:
            chunk = await self._reader.read(65536)
            if not chunk:
                self.ended.set()
                return
            for event in self._conn.receive_data(chunk):
                self._on_event(event)
            self._flush()

    def _on_event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.DataReceived):
            if self.read_data or event.stream_id != self.stream_id:
                self._conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            else:
                self._unacked += event.flow_controlled_length
        if getattr(event, "stream_id", self.stream_id) != self.stream_id:
            return  # an earlier call on this connection
        if isinstance(event, h2.events.ResponseReceived):
            self.result.headers = {_text(k): _text(v) for k, v in event.headers}
        elif isinstance(event, h2.events.DataReceived):
            self.result.data += event.data
        elif isinstance(event, h2.events.TrailersReceived):
            self.result.trailers = {_text(k): _text(v) for k, v in event.headers}
        elif isinstance(event, h2.events.StreamReset):
            self.result.reset = event.error_code
            self.ended.set()
        elif isinstance(event, h2.events.StreamEnded):
            self.ended.set()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
