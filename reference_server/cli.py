"""Command line: ``lmrpc-server`` / ``python -m reference_server``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from reference_server.config import EngineOptions, Limits, ServerConfig, TlsFiles
from reference_server.models.source import ModelNotFoundError


def parse_args(argv: list[str] | None = None) -> ServerConfig:
    parser = argparse.ArgumentParser(
        prog="lmrpc-server",
        description="The lmrpc.v1 reference server (gRPC frontend + scheduler + detokenizer).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=50051, help="0 picks a free port (see --ready-file)")
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
    parser.add_argument("--max-running", type=int, default=None, help="max sequences decoded together")
    parser.add_argument(
        "--max-batch-tokens", type=int, default=None, help="token budget of one step (chunked prefill)"
    )
    parser.add_argument("--attention", default="auto", choices=("auto", "sdpa", "flashinfer"))
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: all cores but two)"
    )
    parser.add_argument("--no-embedding", action="store_true", help="do not load the embedding model")
    parser.add_argument(
        "--max-message-bytes",
        type=int,
        default=Limits().max_message_bytes,
        help="larger request messages get RESOURCE_EXHAUSTED (default: 4 MiB)",
    )
    parser.add_argument(
        "--max-waiting-requests",
        type=int,
        default=Limits().max_waiting_requests,
        help="requests in flight at once; more get RESOURCE_EXHAUSTED (reported in ServerInfo.limits)",
    )
    parser.add_argument("--drain-timeout", type=float, default=30.0)
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--ready-file", default=None, help="write the bound port here once serving")
    parser.add_argument("--log-level", default="INFO")
    tls = parser.add_argument_group("TLS (plaintext HTTP/2 without these)")
    tls.add_argument("--tls-cert", metavar="FILE", help="server certificate chain (PEM)")
    tls.add_argument("--tls-key", metavar="FILE", help="private key of --tls-cert (PEM)")
    tls.add_argument(
        "--tls-client-ca", metavar="FILE", help="require client certificates signed by this CA (mutual TLS)"
    )
    args = parser.parse_args(argv)
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key go together")
    if args.tls_client_ca and not args.tls_cert:
        parser.error("--tls-client-ca needs --tls-cert and --tls-key")
    try:
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
                max_running_sequences=args.max_running,
                max_batch_tokens=args.max_batch_tokens,
                attention_backend=args.attention,
                embedding=not args.no_embedding,
                num_threads=args.threads,
            ),
            limits=Limits(
                max_message_bytes=args.max_message_bytes, max_waiting_requests=args.max_waiting_requests
            ),
            startup_timeout_s=args.startup_timeout,
            drain_timeout_s=args.drain_timeout,
            ready_file=args.ready_file,
            log_level=args.log_level.upper(),
            tls=TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None,
        )
    except ValueError as exc:
        parser.error(str(exc))


async def serve(config: ServerConfig) -> int:
    from reference_server.frontend.app import Frontend, StartupError

    try:
        frontend = Frontend(config)
    except ModelNotFoundError as exc:
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
    return 0


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    logging.basicConfig(level=config.log_level, format="%(asctime)s lmrpc-frontend %(levelname)s %(message)s")
    sys.exit(asyncio.run(serve(config)))
