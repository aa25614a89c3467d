"""Discovery and load as SGLang's runtime protocol reports them: JSON documents in a string.

- GetModelInfo: SGLang's keys (model_path, tokenizer_path, is_generation, weight_version,
  model_type, architectures) and the model facts every dialect shares (``base/info.py``);
- GetServerInfo: a subset of SGLang's ``server_args`` and scheduler info that this server can
  fill truthfully, among them ``incremental_streaming_output: false`` (streams are cumulative);
- GetLoad: a list with one entry per data-parallel rank (one here), SGLang's
  ``GetLoadsReqOutput`` fields.
"""

from __future__ import annotations

import json
import time
from typing import Any

from lmrpc._gen.sglang.runtime import v1 as rt
from lmrpc.v1 import EmbeddingModelInfo, ModelInfo
from reference_server.frontend.context import SERVER_NAME
from reference_server.frontend.dialects.base.info import (
    SERVER_VERSION,
    ModelInfoFields,
    RatedLoad,
    model_path_label,
)
from reference_server.frontend.dialects.base.service import ServerFacts
from reference_server.frontend.dialects.sglang_runtime.meta import WEIGHT_VERSION
from reference_server.models.source import ModelSource


def model_info_json(fields: ModelInfoFields) -> str:
    values: dict[str, Any] = {
        **fields,
        "tokenizer_path": fields["model_path"],
        "weight_version": WEIGHT_VERSION,
    }
    return json.dumps(values, sort_keys=True)


def server_info_json(facts: ServerFacts, model: ModelInfo, source: ModelSource, dtype: str) -> str:
    path = model_path_label(source, model.model_id)
    values: dict[str, Any] = {
        "model_path": path,
        "tokenizer_path": path,
        "served_model_name": model.model_id,
        "context_length": model.max_context_tokens,
        "max_total_tokens": facts.load.kv_tokens_total,
        "max_total_num_tokens": facts.load.kv_tokens_total,
        "max_running_requests": facts.engine.max_running_sequences,
        "max_req_input_len": max(model.max_context_tokens - 1, 0),
        "dtype": dtype,
        "load_format": "auto",
        "tp_size": 1,
        "dp_size": 1,
        "pp_size": 1,
        "is_embedding": False,
        "skip_tokenizer_init": False,
        "incremental_streaming_output": False,
        "enable_lora": False,
        "disaggregation_mode": "null",
        "weight_version": WEIGHT_VERSION,
        "version": SERVER_VERSION,
        "server_type": SERVER_NAME,
        "uptime_seconds": facts.uptime_seconds,
        "last_receive_timestamp": facts.last_receive_timestamp,
        "is_paused": facts.load.paused,
    }
    return json.dumps(values, sort_keys=True)


def load_json(rated: RatedLoad) -> str:
    load = rated.load
    entry = {
        "dp_rank": 0,
        "timestamp": time.time(),
        "num_running_reqs": load.running_sequences,
        "num_waiting_reqs": load.waiting_sequences,
        "num_used_tokens": load.kv_tokens_in_use,
        "num_total_tokens": load.kv_tokens_in_use,  # waiting prompts' tokens are not known here
        "max_total_num_tokens": load.kv_tokens_total,
        "token_usage": rated.token_usage,
        "gen_throughput": rated.gen_throughput,
        "cache_hit_rate": rated.cache_hit_rate,
        "utilization": rated.utilization,
        "max_running_requests": rated.engine.max_running_sequences,
        "memory": None,
        "speculative": None,
        "lora": None,
        "disaggregation": None,
        "queues": {"waiting": load.waiting_sequences, "grammar": 0, "paused": 0, "retracted": 0},
    }
    return json.dumps([entry])


def model_cards(model: ModelInfo, embedding: EmbeddingModelInfo | None) -> list[rt.ModelCard]:
    """The generation model, then the embedding model that TextEmbed, Embed, OpenAIEmbed, Score
    and Rerank use (SGLang serves one model per process; this server serves two)."""
    cards = [rt.ModelCard(id=model.model_id, root=model.model_id, max_model_len=model.max_context_tokens)]
    if embedding is not None:
        cards.append(
            rt.ModelCard(
                id=embedding.model_id, root=embedding.model_id, max_model_len=embedding.max_input_tokens
            )
        )
    return cards
