"""lmrpc.v1 discovery and load answers as the vLLM dialect's GetModelInfo, GetServerInfo, GetLoads.

smg turns these into worker labels and routing inputs:

- ``served_model_name`` is the OpenAI ``model`` id;
- ``default_sampling_params_json`` holds lmrpc's EffectiveDefaults (smg reads temperature, top_p,
  top_k, min_p and repetition_penalty from it);
- ``model_path`` is where smg looks for the tokenizer first: the model directory for a Hugging
  Face checkpoint (smg loads it when it shares the filesystem), else the model id, which is no
  path, so smg fetches the tokenizer over GetTokenizer;
- int32 ids the model lacks (pad, and BOS for some models) are -1;
- GetLoads reports one data-parallel rank; running and waiting count sequences (an n > 1
  request counts n), ``token_usage`` is the KV share held by requests (reusable cached prefixes
  excluded).
"""

from __future__ import annotations

import datetime

from lmrpc import __version__
from lmrpc._gen.vllm.grpc import engine as vllm
from lmrpc.v1 import Load, ModelInfo
from reference_server.engine.kv_events import KV_EVENT_BLOCK_SIZE
from reference_server.frontend.context import SERVER_NAME
from reference_server.frontend.dialects.base.service import (
    NO_TOKEN_ID,
    model_path_label,
    sampling_defaults_json,
)
from reference_server.frontend.dialects.base.tokenizer_bundle import ARCHITECTURES
from reference_server.ipc import EngineInfo
from reference_server.models.source import ModelSource


def model_info(model: ModelInfo, source: ModelSource) -> vllm.GetModelInfoResponse:
    return vllm.GetModelInfoResponse(
        model_path=model_path_label(source, model.model_id),
        is_generation=True,
        max_context_length=model.max_context_tokens,
        vocab_size=model.vocab_size,
        supports_vision=False,
        served_model_name=model.model_id,
        model_type=model.architecture,
        architectures=[ARCHITECTURES.get(model.architecture, model.architecture)],
        eos_token_ids=list(model.eos_token_ids),
        pad_token_id=NO_TOKEN_ID,
        bos_token_id=NO_TOKEN_ID if model.bos_token_id is None else model.bos_token_id,
        max_req_input_len=max(model.max_context_tokens - 1, 0),  # at least one token to generate
        default_sampling_params_json=sampling_defaults_json(model),
    )


def server_info(
    load: Load, info: EngineInfo, uptime_seconds: float, last_receive_timestamp: float, model_dtype: str
) -> vllm.GetServerInfoResponse:
    return vllm.GetServerInfoResponse(
        active_requests=load.active_requests,
        is_paused=load.paused,
        last_receive_timestamp=last_receive_timestamp,
        uptime_seconds=uptime_seconds,
        server_type=SERVER_NAME,
        data_parallel_size=1,
        kv_cache_dtype="auto",
        block_size=KV_EVENT_BLOCK_SIZE,  # the block size of its KV-cache events
        model_dtype=model_dtype,
        max_num_seqs=info.max_running_sequences,
    )


def loads(
    load: Load, info: EngineInfo, *, gen_throughput: float, cache_hit_rate: float
) -> vllm.GetLoadsResponse:
    total = load.kv_tokens_total
    return vllm.GetLoadsResponse(
        timestamp=datetime.datetime.now(datetime.UTC).isoformat(),
        version=f"{SERVER_NAME} {__version__}",
        dp_rank_count=1,
        loads=[
            vllm.SchedulerLoad(
                dp_rank=0,
                num_running_reqs=load.running_sequences,
                num_waiting_reqs=load.waiting_sequences,
                num_total_reqs=load.active_requests,
                num_used_tokens=load.kv_tokens_in_use,
                max_total_num_tokens=total,
                token_usage=load.kv_tokens_in_use / total if total else 0.0,
                gen_throughput=gen_throughput,
                cache_hit_rate=cache_hit_rate,
                utilization=load.running_sequences / info.max_running_sequences
                if info.max_running_sequences
                else 0.0,
                max_running_requests=info.max_running_sequences,
            )
        ],
    )
