"""Builds the scheduler's engine from the server's EngineOptions."""

from __future__ import annotations

from reference_server.config import DEFAULT_MAX_BATCH_TOKENS, EngineOptions
from reference_server.engine.base import Engine
from reference_server.engine.fake import FakeEngine, FakeEngineConfig
from reference_server.engine.kv_events import KV_EVENT_BLOCK_SIZE
from reference_server.models.source import resolve_model
from reference_server.models.tokenizer import load_tokenizer, whole_character_tokens


def create_engine(options: EngineOptions) -> Engine:
    source = resolve_model(options.model_path)
    if options.kind == "fake":
        tokenizer = load_tokenizer(source)
        config = FakeEngineConfig(
            model_id=f"fake-{source.model_id}",
            vocab_size=tokenizer.vocab_size,
            eos_token_ids=tokenizer.eos_token_ids,
            bos_token_id=tokenizer.bos_token_id,
            sampleable_token_ids=whole_character_tokens(tokenizer),
            token_delay_s=options.fake_token_delay_s,
            kv_event_block_size=KV_EVENT_BLOCK_SIZE if options.kv_events else 0,
            **_optional(
                kv_tokens=options.kv_tokens,
                max_running_sequences=options.max_running_sequences,
                max_context_tokens=options.context_length,
            ),
        )
        return FakeEngine(config, tokenize=tokenizer.encode if options.embedding else None)
    from reference_server.engine.config import ModelEngineConfig
    from reference_server.engine.model_engine import ModelEngine

    return ModelEngine(
        ModelEngineConfig(
            source=source,
            device=options.device,
            dtype=options.dtype,
            attention_backend=options.attention_backend,
            load_embedding_model=options.embedding,
            num_threads=options.torch_threads,
            kv_event_block_size=KV_EVENT_BLOCK_SIZE if options.kv_events else 0,
            weights=options.weights,
            kv_cache=options.kv_cache,
            kernels=options.kernels,
            cuda_graphs=options.cuda_graphs,
            context_length=options.context_length,
            **_optional(
                kv_tokens=options.kv_tokens,
                max_running_sequences=options.max_running_sequences,
                max_batch_tokens=_batch_tokens(options),
            ),
        )
    )


def _batch_tokens(options: EngineOptions) -> int | None:
    """Every running output decodes one token per step, so the budget must cover them all."""
    if options.max_batch_tokens is None and options.max_running_sequences is not None:
        return max(DEFAULT_MAX_BATCH_TOKENS, options.max_running_sequences)
    return options.max_batch_tokens


def _optional(**values: int | None) -> dict[str, int]:
    return {k: v for k, v in values.items() if v is not None}
