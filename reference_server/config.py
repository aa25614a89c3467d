"""Configuration of the reference server: one frozen dataclass per concern, validated on creation."""

from __future__ import annotations

import os
import secrets
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

# the model engine's weight formats (reference_server/engine/config.py says what each one is)
WEIGHT_FORMATS = ("dense", "q4_1", "int8")
# the KV cache's formats: dense (in the model's dtype) or int8 (8-bit codes and a scale per token and KV head)
KV_CACHE_FORMATS = ("dense", "int8")
# native: the native kernels in the best instruction set this CPU runs; avx512 or avx2: in that one
# (to test or measure either on one host); torch: the torch model; auto: native where it runs
KERNELS = ("auto", "native", "avx512", "avx2", "torch")
DEFAULT_MAX_BATCH_TOKENS = 512  # tokens one model engine step takes in (the chunked-prefill budget)

EngineKind = Literal["model", "fake"]


@dataclass(frozen=True, slots=True)
class IpcAddresses:
    """ZMQ endpoints of one server launch; unique per launch so two servers never share one."""

    folder: str

    @classmethod
    def create(cls) -> IpcAddresses:
        folder = Path(tempfile.gettempdir()) / f"lmrpc-{os.getpid()}-{secrets.token_hex(4)}"
        folder.mkdir(mode=0o700)
        return cls(str(folder))

    @property
    def scheduler(self) -> str:
        return f"ipc://{self.folder}/scheduler.sock"

    @property
    def detokenizer(self) -> str:
        return f"ipc://{self.folder}/detokenizer.sock"

    @property
    def frontend(self) -> str:
        return f"ipc://{self.folder}/frontend.sock"


@dataclass(frozen=True, slots=True)
class Limits:
    """What the server accepts; advertised through Capabilities and ModelInfo.defaults."""

    max_outputs: int = 16
    max_top_logprobs: int = 20
    max_stop_strings: int = 16
    max_stop_string_bytes: int = 256  # longer stop strings: INVALID_ARGUMENT (reported in ServerLimits)
    default_max_tokens: int = 256
    default_temperature: float = 1.0
    max_waiting_requests: int = 4096
    abort_grace_s: float = 5.0  # how long an Abort for a not-yet-seen id is remembered
    max_message_bytes: int = 4 * 1024 * 1024  # larger request messages: RESOURCE_EXHAUSTED
    max_abort_request_ids: int = 4096  # ids one Abort may name
    # Backpressure (FLOW-1/FLOW-2): tokens kept for a client that does not read before its
    # request is held in the engine, and how long a response may wait before the request is
    # aborted (0: never). Parked memory is at most max_waiting_requests * max_parked_tokens tokens.
    max_parked_tokens: int = 256
    stall_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for name in (
            "max_outputs", "max_stop_strings", "max_stop_string_bytes", "default_max_tokens",
            "max_waiting_requests", "max_message_bytes", "max_abort_request_ids", "max_parked_tokens",
        ):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.max_top_logprobs < 0:
            raise ValueError(f"max_top_logprobs={self.max_top_logprobs} must be >= 0")
        if self.stall_timeout_s < 0 or self.abort_grace_s < 0:
            raise ValueError("stall_timeout_s and abort_grace_s must be >= 0")


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """Options of the scheduler process's engine."""

    kind: EngineKind = "model"
    model_path: str | None = None  # None: the embedded default model
    fake_token_delay_s: float = 0.0
    device: str = "auto"
    dtype: str = "auto"
    kv_tokens: int | None = None  # None: the engine's default
    context_length: int | None = None  # None: the model's own context window
    max_running_sequences: int | None = None
    max_batch_tokens: int | None = None
    attention_backend: str = "auto"
    embedding: bool = True
    num_threads: int | None = None  # torch threads; None: all cores but two (at least one)
    kv_events: bool = True  # report the prefix cache as KV-cache events (for smg's routing)
    weights: str = "dense"  # dense, q4_1 or int8 (reference_server/engine/config.py)
    kv_cache: str = "dense"  # dense or int8 (reference_server/engine/config.py)
    kernels: str = "auto"  # one of KERNELS (reference_server/engine/native/)
    cuda_graphs: bool = True  # decode steps on a GPU replay CUDA graphs (engine/cuda_graphs.py)

    def __post_init__(self) -> None:
        if self.kind not in ("model", "fake"):
            raise ValueError(f"engine={self.kind!r} must be 'model' or 'fake'")
        if self.fake_token_delay_s < 0:
            raise ValueError(f"fake_token_delay_s={self.fake_token_delay_s} must be >= 0")
        if self.context_length is not None and self.context_length < 2:
            raise ValueError(
                f"context_length={self.context_length} must be >= 2 (a prompt token and one to generate)"
            )
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads={self.num_threads} must be >= 1")
        if self.weights not in WEIGHT_FORMATS:
            raise ValueError(f"weights={self.weights!r} must be one of {', '.join(WEIGHT_FORMATS)}")
        if self.kv_cache not in KV_CACHE_FORMATS:
            raise ValueError(f"kv_cache={self.kv_cache!r} must be one of {', '.join(KV_CACHE_FORMATS)}")
        if self.kernels not in KERNELS:
            raise ValueError(f"kernels={self.kernels!r} must be one of {', '.join(KERNELS)}")

    @property
    def torch_threads(self) -> int:
        """Leave two cores to the frontend and detokenizer: on a small machine an OpenMP team
        that competes with them for cores stalls (each thread waits for the slowest)."""
        return self.num_threads or max(1, (os.cpu_count() or 1) - 2)


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files for serving over TLS; with ``client_ca_file`` clients must present a certificate."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 50051  # 0: pick a free port (see ready_file)
    engine: EngineOptions = field(default_factory=EngineOptions)
    limits: Limits = field(default_factory=Limits)
    startup_timeout_s: float = 300.0
    drain_timeout_s: float = 30.0
    ready_file: str | None = None  # written with the bound port once the server is serving
    log_level: str = "INFO"
    tls: TlsFiles | None = None  # None: plaintext HTTP/2
    auth_file: str | None = None  # None: no authentication (see frontend/edge/auth.py)
    max_worker_restarts: int = 3  # consecutive restarts after a worker dies; 0: exit instead
    vllm_engine: bool = True  # also serve vllm.grpc.engine.VllmEngine (smg's vLLM worker protocol)
    sglang_scheduler_port: int | None = (
        None  # serve sglang.grpc.scheduler.SglangScheduler here (0: a free one)
    )
    sglang_runtime_port: int | None = None  # serve sglang.runtime.v1.SglangService here (0: a free one)
    metrics_port: int | None = None  # Prometheus metrics over HTTP on this port (0: a free one)
    otlp_endpoint: str | None = None  # export OTLP/HTTP spans of each request there (TRACE-1)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port={self.port} must be in [0, 65535]")
        if self.max_worker_restarts < 0:
            raise ValueError(f"max_worker_restarts={self.max_worker_restarts} must be >= 0")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port={self.metrics_port} must be in [0, 65535]")
        if self.sglang_scheduler_port is not None and not 0 <= self.sglang_scheduler_port <= 65535:
            raise ValueError(f"sglang_scheduler_port={self.sglang_scheduler_port} must be in [0, 65535]")
        if self.sglang_scheduler_port and self.sglang_scheduler_port == self.port:
            raise ValueError(
                f"sglang_scheduler_port={self.sglang_scheduler_port} must differ from port={self.port}"
            )
        if self.sglang_runtime_port is not None and not 0 <= self.sglang_runtime_port <= 65535:
            raise ValueError(f"sglang_runtime_port={self.sglang_runtime_port} must be in [0, 65535]")
        if self.sglang_runtime_port and self.sglang_runtime_port in (self.port, self.sglang_scheduler_port):
            raise ValueError(
                f"sglang_runtime_port={self.sglang_runtime_port} must differ from port={self.port} "
                f"and sglang_scheduler_port={self.sglang_scheduler_port}"
            )
        if self.startup_timeout_s <= 0 or self.drain_timeout_s < 0:
            raise ValueError("startup_timeout_s must be > 0 and drain_timeout_s >= 0")
