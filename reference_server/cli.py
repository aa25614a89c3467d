"""Command line: ``lmrpc-server`` / ``python -m reference_server``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from reference_server.config import (
    KERNELS,
    KV_CACHE_FORMATS,
    WEIGHT_FORMATS,
    EngineOptions,
    Limits,
    ServerConfig,
    TlsFiles,
)
from reference_server.models.source import ModelNotFoundError


def parse_args(argv: list[str] | None = None) -> ServerConfig:
    parser = argparse.ArgumentParser(
        prog="lmrpc-server",
        description="The lmrpc.v1 reference server (gRPC frontend + scheduler + detokenizer).",
    )
    for add_arguments in (
        _server_arguments,
        _engine_arguments,
        _limit_arguments,
        _process_arguments,
        _edge_arguments,
        _protocol_arguments,
        _observability_arguments,
    ):
        add_arguments(parser)
    args = parser.parse_args(argv)
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key go together")
    if args.tls_client_ca and not args.tls_cert:
        parser.error("--tls-client-ca needs --tls-cert and --tls-key")
    try:
        return _config(args)
    except ValueError as exc:
        parser.error(str(exc))


def _server_arguments(parser: argparse.ArgumentParser) -> None:
    """Where it listens."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=50051, help="0 picks a free port (see --ready-file)")


def _engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The engine: which one, its model, its kernels and its sizes."""
    parser.add_argument("--engine", choices=("model", "fake"), default="model")
    parser.add_argument(
        "--model",
        default=None,
        help="a .gguf file or a Hugging Face Llama directory (default: embedded SmolLM2-135M-Instruct)",
    )
    parser.add_argument(
        "--fake-token-delay", type=float, default=0.0, metavar="SECONDS", help="fake engine: sleep per step"
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--kv-tokens", type=int, default=None, help="KV-cache capacity in tokens")
    parser.add_argument(
        "--context-length",
        type=int,
        default=None,
        metavar="TOKENS",
        help="serve a context window this long (at most the model's own; default: the model's)",
    )
    parser.add_argument("--max-running", type=int, default=None, help="max sequences decoded together")
    parser.add_argument(
        "--max-batch-tokens", type=int, default=None, help="token budget of one step (chunked prefill)"
    )
    parser.add_argument("--attention", default="auto", choices=("auto", "sdpa", "flashinfer"))
    parser.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="on a GPU with flashinfer attention, replay each decode step from a CUDA graph of its "
        "batch size (default: on)",
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: all cores but two)"
    )
    parser.add_argument(
        "--weights",
        choices=WEIGHT_FORMATS,
        default="dense",
        help="dense: all weights in --dtype; q4_1: layer projections as 4-bit groups of 32 (a Q4_1 "
        "GGUF's own blocks) and the LM head in the file's 4 or 8 bits; int8: every projection and the "
        "head as 8-bit groups of 32 (native kernels only). CPU and bfloat16",
    )
    parser.add_argument(
        "--kv-cache",
        choices=KV_CACHE_FORMATS,
        default="dense",
        help="dense: keys and values in --dtype; int8: 8-bit codes and a scale per token and KV head, "
        "half the memory and half the bytes a long-context decode step reads (native kernels only)",
    )
    parser.add_argument(
        "--kernels",
        choices=KERNELS,
        default="auto",
        help="native: every engine step in one compiled call (an x86-64 CPU with AVX512-BF16, or AVX2 "
        "with FMA and F16C, and a C compiler; bfloat16) in the best instruction set the CPU runs; "
        "avx512 or avx2: in that one (avx2 runs on an AVX-512 host too); torch: the torch model; "
        "auto (default): native where it runs",
    )
    parser.add_argument("--no-embedding", action="store_true", help="do not load the embedding model")


def _limit_arguments(parser: argparse.ArgumentParser) -> None:
    """What one request, one client and the server may use (ServerInfo.limits)."""
    parser.add_argument(
        "--max-message-bytes",
        type=int,
        default=Limits().max_message_bytes,
        help="larger request messages get RESOURCE_EXHAUSTED (default: 4 MiB)",
    )
    parser.add_argument(
        "--max-abort-ids",
        type=int,
        default=Limits().max_abort_request_ids,
        help="the most request ids one Abort may name",
    )
    parser.add_argument(
        "--max-parked-tokens",
        type=int,
        default=Limits().max_parked_tokens,
        help="tokens kept for a stream whose client does not read before its generation is held",
    )
    parser.add_argument(
        "--stall-timeout",
        type=float,
        default=Limits().stall_timeout_s,
        metavar="SECONDS",
        help="abort a request whose client read nothing for this long (0: never; default 30)",
    )
    parser.add_argument(
        "--default-max-tokens",
        type=int,
        default=Limits().default_max_tokens,
        metavar="TOKENS",
        help="max_tokens of a request that sets none (reported in ServerInfo.limits; default 256)",
    )
    parser.add_argument(
        "--abort-grace",
        type=float,
        default=Limits().abort_grace_s,
        metavar="SECONDS",
        help="how long an Abort for an id not yet in flight is remembered (ABORT-6; default 5)",
    )
    parser.add_argument(
        "--max-worker-restarts",
        type=int,
        default=ServerConfig().max_worker_restarts,
        help="restart the workers this many times in a row after one dies (0: exit non-zero instead)",
    )
    parser.add_argument(
        "--max-waiting-requests",
        type=int,
        default=Limits().max_waiting_requests,
        help="requests in flight at once; more get RESOURCE_EXHAUSTED (reported in ServerInfo.limits)",
    )


def _process_arguments(parser: argparse.ArgumentParser) -> None:
    """Start-up, drain, the ready file and the log."""
    parser.add_argument("--drain-timeout", type=float, default=30.0)
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--ready-file", default=None, help="write the bound port here once serving")
    parser.add_argument("--log-level", default="INFO")


def _edge_arguments(parser: argparse.ArgumentParser) -> None:
    """TLS and credentials."""
    tls = parser.add_argument_group("TLS (plaintext HTTP/2 without these)")
    tls.add_argument("--tls-cert", metavar="FILE", help="server certificate chain (PEM)")
    tls.add_argument("--tls-key", metavar="FILE", help="private key of --tls-cert (PEM)")
    tls.add_argument(
        "--tls-client-ca", metavar="FILE", help="require client certificates signed by this CA (mutual TLS)"
    )
    parser.add_argument(
        "--auth",
        metavar="FILE",
        help="require credentials: a file of 'CREDENTIAL ROLE' lines (bearer tokens or cert:COMMON_NAME; "
        "roles client, admin)",
    )


def _protocol_arguments(parser: argparse.ArgumentParser) -> None:
    """The foreign protocols served beside lmrpc.v1, each by its harness id."""
    parser.add_argument(
        "--no-vllm-engine",
        "--no-vllm-dialect",  # the old name, still accepted
        dest="no_vllm_engine",
        action="store_true",
        help="serve lmrpc.v1 only, not also the vllm-engine protocol (vllm.grpc.engine.VllmEngine, smg's "
        "vLLM worker protocol); --no-vllm-dialect is its old name",
    )
    parser.add_argument(
        "--sglang-scheduler-port",
        "--sglang-port",  # the old name, still accepted
        dest="sglang_scheduler_port",
        type=int,
        default=None,
        help="also serve the sglang-scheduler protocol (sglang.grpc.scheduler.SglangScheduler, smg's SGLang "
        "worker protocol) on this port (0 picks a free one, written to --ready-file as "
        "'sglang-scheduler PORT'); --sglang-port is its old name",
    )
    parser.add_argument(
        "--sglang-runtime-port",
        type=int,
        default=None,
        help="also serve the sglang-runtime protocol (sglang.runtime.v1.SglangService, SGLang's native gRPC "
        "server: generate, embed, "
        "OpenAI JSON pass-through, profiling, weight updates) on this port (0 picks a free one, written "
        "to --ready-file as 'sglang-runtime PORT')",
    )


def _observability_arguments(parser: argparse.ArgumentParser) -> None:
    """Metrics and traces."""
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics over HTTP on this port (on --host)",
    )
    parser.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        help="export a span of every Generate call from the frontend and the scheduler to this OTLP/HTTP "
        "traces endpoint (e.g. http://127.0.0.1:4318/v1/traces), continuing the caller's W3C traceparent",
    )


def _config(args: argparse.Namespace) -> ServerConfig:
    """The configuration the parsed flags name (ValueError for values out of range)."""
    return ServerConfig(
        host=args.host,
        port=args.port,
        engine=EngineOptions(
            kind=args.engine,
            model_path=args.model,
            fake_token_delay_s=args.fake_token_delay,
            device=args.device,
            dtype=args.dtype,
            kv_tokens=args.kv_tokens,
            context_length=args.context_length,
            max_running_sequences=args.max_running,
            max_batch_tokens=args.max_batch_tokens,
            attention_backend=args.attention,
            embedding=not args.no_embedding,
            num_threads=args.threads,
            kv_events=not args.no_vllm_engine or args.sglang_scheduler_port is not None,  # for smg only
            weights=args.weights,
            kv_cache=args.kv_cache,
            kernels=args.kernels,
            cuda_graphs=args.cuda_graphs,
        ),
        limits=Limits(
            max_message_bytes=args.max_message_bytes,
            max_abort_request_ids=args.max_abort_ids,
            max_parked_tokens=args.max_parked_tokens,
            stall_timeout_s=args.stall_timeout,
            abort_grace_s=args.abort_grace,
            default_max_tokens=args.default_max_tokens,
            max_waiting_requests=args.max_waiting_requests,
        ),
        startup_timeout_s=args.startup_timeout,
        drain_timeout_s=args.drain_timeout,
        ready_file=args.ready_file,
        log_level=args.log_level.upper(),
        tls=TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None,
        auth_file=args.auth,
        max_worker_restarts=args.max_worker_restarts,
        vllm_engine=not args.no_vllm_engine,
        sglang_scheduler_port=args.sglang_scheduler_port,
        sglang_runtime_port=args.sglang_runtime_port,
        metrics_port=args.metrics_port,
        otlp_endpoint=args.otlp_endpoint,
    )


async def serve(config: ServerConfig) -> int:
    from reference_server.frontend.app import Frontend, StartupError

    try:
        frontend = Frontend(config)
    except (ModelNotFoundError, StartupError) as exc:
        logging.getLogger("lmrpc").error("%s", exc)
        return 2
    try:
        await frontend.start()
    except StartupError as exc:
        logging.getLogger("lmrpc").error("startup failed: %s", exc)
        await frontend.close()
        return 2
    try:
        await frontend.run_until_stopped()
    finally:
        await frontend.close()
    return frontend.exit_code


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    logging.basicConfig(level=config.log_level, format="%(asctime)s lmrpc-frontend %(levelname)s %(message)s")
    sys.exit(asyncio.run(serve(config)))
