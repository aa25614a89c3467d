"""Configuration of the real model engine."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from reference_server.config import DEFAULT_MAX_BATCH_TOKENS, KERNELS, KV_CACHE_FORMATS, WEIGHT_FORMATS
from reference_server.cpu import bf16_gemm_native
from reference_server.engine.kv_events import KV_EVENT_BLOCK_SIZE
from reference_server.engine.native.kernels import ISAS, Isa, best_isa, missing_flags
from reference_server.models.source import ModelSource, resolve_model

DEVICES = ("auto", "cpu", "cuda")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
ATTENTION_BACKENDS = ("auto", "sdpa", "flashinfer")


@dataclass(frozen=True, slots=True)
class ModelEngineConfig:
    source: ModelSource = field(default_factory=lambda: resolve_model(None))
    device: str = "auto"  # auto: cuda when available, else cpu; "cuda:1" also works
    dtype: str = "auto"  # auto: bfloat16 (float16 on GPUs without bf16); or a DTYPES key
    kv_tokens: int = 32768  # KV slots (one token each) shared by all sequences and the prefix cache
    max_running_sequences: int = 64  # outputs decoding at once (n>1 requests count n)
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS  # tokens per forward pass: the chunked-prefill budget
    attention_backend: str = "auto"  # auto: flashinfer on CUDA when installed, else sdpa
    load_embedding_model: bool = True
    num_threads: int | None = None  # torch intra-op threads; None: torch's choice (OMP_NUM_THREADS or cores)
    kv_event_block_size: int = KV_EVENT_BLOCK_SIZE  # 0: no KV-cache events
    # dense: every weight in ``dtype``. q4_1: the layers' projections as 4-bit groups of 32 (a Q4_1
    # GGUF's own blocks), the LM head as the file has it in 4 or 8 bits (else 8); in the native
    # kernels, or torch's int4 kernel for the layers where they cannot run (CPU and bfloat16 only).
    # int8: every projection and the head as 8-bit groups of 32 (Q8_0; native kernels only).
    weights: str = "dense"
    # dense: keys and values in ``dtype``. int8: each token's K and V row of each KV head as 8-bit
    # codes of its largest value, with that scale beside them: half the memory, and half the bytes
    # a decode step reads at long context (native kernels only; a head_dim that is a multiple of 64).
    kv_cache: str = "dense"
    # native: every step in one compiled call (engine/native/; an x86-64 CPU with AVX512-BF16, or AVX2
    # with FMA and F16C, and a C compiler; bfloat16), in the best instruction set the CPU runs;
    # avx512 or avx2: in that one; torch: the torch model; auto: native where it runs
    kernels: str = "auto"
    context_length: int | None = None  # a shorter context window than the model's; None: the model's
    # decode steps on a GPU with flashinfer attention replay one CUDA graph per batch size
    # (engine/cuda_graphs.py); off: every step launches its kernels one by one
    cuda_graphs: bool = True

    def __post_init__(self) -> None:
        if self.device.split(":", 1)[0] not in DEVICES:
            raise ValueError(f"device={self.device!r} must be one of {', '.join(DEVICES)} (or cuda:N)")
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} must be 'auto' or one of {', '.join(DTYPES)}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend={self.attention_backend!r} must be one of {', '.join(ATTENTION_BACKENDS)}"
            )
        if self.weights not in WEIGHT_FORMATS:
            raise ValueError(f"weights={self.weights!r} must be one of {', '.join(WEIGHT_FORMATS)}")
        if self.kv_cache not in KV_CACHE_FORMATS:
            raise ValueError(f"kv_cache={self.kv_cache!r} must be one of {', '.join(KV_CACHE_FORMATS)}")
        if self.kernels not in KERNELS:
            raise ValueError(f"kernels={self.kernels!r} must be one of {', '.join(KERNELS)}")
        if self.kv_tokens < 1:
            raise ValueError(f"kv_tokens={self.kv_tokens} must be >= 1")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads={self.num_threads} must be >= 1")
        if self.max_running_sequences < 1:
            raise ValueError(f"max_running_sequences={self.max_running_sequences} must be >= 1")
        if self.max_batch_tokens < self.max_running_sequences:
            raise ValueError(
                f"max_batch_tokens={self.max_batch_tokens} must be >= max_running_sequences="
                f"{self.max_running_sequences} (every running output decodes one token per step)"
            )

    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        device = torch.device(self.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={self.device!r} but CUDA is not available")
        return device

    def torch_dtype(self, device: torch.device) -> torch.dtype:
        if self.dtype != "auto":
            return DTYPES[self.dtype]
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            return torch.float16
        if (
            device.type == "cpu"
            and self.weights == "dense"
            and not bf16_gemm_native()
            and not self.native_cpu()
        ):
            return (
                torch.float32
            )  # bf16 is emulated here: 2-7x slower than float32 (quantized weights need bf16)
        return torch.bfloat16

    def kernel_isa(self) -> Isa | None:
        """The instruction set ``kernels`` forces; None: the best this CPU runs (auto, native)."""
        return self.kernels if self.kernels in ISAS else None

    def native_cpu(self) -> bool:
        """Whether the native kernels may run on this CPU (its flags; the model's shape aside)."""
        if self.kernels == "torch":
            return False
        isa = self.kernel_isa()
        return best_isa() is not None if isa is None else not missing_flags(isa)
