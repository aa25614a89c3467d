"""lmrpc.v1 discovery and load answers as the SGLang scheduler's GetModelInfo, GetServerInfo,
GetLoads.

smg turns GetModelInfo's fields into worker labels (``served_model_name`` is the OpenAI model id,
``default_sampling_params_json`` the sampling defaults) and picks a few keys from GetServerInfo's
``server_args`` (``routers/grpc/client.rs`` ``SGLANG_GRPC_KEYS``). GetLoads reports one
data-parallel rank, counted as in the vLLM dialect: running and waiting *sequences* (an n > 1
request counts n), ``num_total_reqs`` the Generate calls in flight, ``token_usage`` the KV share
held by requests (reusable cached prefixes excluded).
"""

from __future__ import annotations

import datetime

from lmrpc import __version__
from lmrpc._gen.google.protobuf import Struct
from lmrpc._gen.sglang.grpc import scheduler as sglang
from lmrpc.v1 import Load, ModelInfo
from reference_server.frontend.context import SERVER_NAME
from reference_server.frontend.dialects.base.service import (
    NO_TOKEN_ID,
    model_path_label,
    sampling_defaults_json,
)
from reference_server.frontend.dialects.base.tokenizer_bundle import ARCHITECTURES
from reference_server.ipc import EngineInfo
from reference_server.models.source import ModelSource

VERSION = f"{SERVER_NAME} {__version__}"


def model_info(model: ModelInfo, source: ModelSource) -> sglang.GetModelInfoResponse:
    return sglang.GetModelInfoResponse(
        model_path=model_path_label(source, model.model_id),
        is_generation=True,
        served_model_name=model.model_id,
        max_context_length=model.max_context_tokens,
        vocab_size=model.vocab_size,
        supports_vision=False,
        model_type=model.architecture,
        eos_token_ids=list(model.eos_token_ids),
        pad_token_id=NO_TOKEN_ID,
        bos_token_id=NO_TOKEN_ID if model.bos_token_id is None else model.bos_token_id,
        max_req_input_len=max(model.max_context_tokens - 1, 0),  # at least one token to generate
        architectures=[ARCHITECTURES.get(model.architecture, model.architecture)],
        default_sampling_params_json=sampling_defaults_json(model),
    )


def server_info(
    load: Load,
    info: EngineInfo,
    model: ModelInfo,
    source: ModelSource,
    *,
    uptime_seconds: float,
    last_receive_timestamp: float,
) -> sglang.GetServerInfoResponse:
    started = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=uptime_seconds)
    server_args = {
        "model_path": model_path_label(source, model.model_id),
        "served_model_name": model.model_id,
        "context_length": model.max_context_tokens,
        "vocab_size": model.vocab_size,
        "max_total_tokens": load.kv_tokens_total,
        "max_running_requests": info.max_running_sequences,
        "tp_size": 1,
        "dp_size": 1,
        "pp_size": 1,
        "is_embedding": False,
        "disaggregation_mode": "null",
    }
    return sglang.GetServerInfoResponse(
        server_args=Struct.from_dict(server_args),
        active_requests=load.active_requests,
        is_paused=load.paused,
        last_receive_timestamp=last_receive_timestamp,
        uptime_seconds=uptime_seconds,
        sglang_version=VERSION,
        server_type=SERVER_NAME,
        start_time=started,
        max_total_num_tokens=load.kv_tokens_total,
    )


def loads(
    load: Load, info: EngineInfo, *, gen_throughput: float, cache_hit_rate: float
) -> sglang.GetLoadsResponse:
    total = load.kv_tokens_total
    usage = load.kv_tokens_in_use / total if total else 0.0
    utilization = load.running_sequences / info.max_running_sequences if info.max_running_sequences else 0.0
    rank = sglang.SchedulerLoad(
        dp_rank=0,
        num_running_reqs=load.running_sequences,
        num_waiting_reqs=load.waiting_sequences,
        num_total_reqs=load.active_requests,
        num_used_tokens=load.kv_tokens_in_use,
        max_total_num_tokens=total,
        token_usage=usage,
        gen_throughput=gen_throughput,
        cache_hit_rate=cache_hit_rate,
        utilization=utilization,
        max_running_requests=info.max_running_sequences,
    )
    return sglang.GetLoadsResponse(
        timestamp=datetime.datetime.now(datetime.UTC).isoformat(),
        version=VERSION,
        dp_rank_count=1,
        loads=[rank],
        aggregate=sglang.AggregateMetrics(
            total_running_reqs=load.running_sequences,
            total_waiting_reqs=load.waiting_sequences,
            total_reqs=load.active_requests,
            avg_token_usage=usage,
            avg_throughput=gen_throughput,
            avg_utilization=utilization,
        ),
    )
