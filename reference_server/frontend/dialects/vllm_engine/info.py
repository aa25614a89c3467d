"""lmrpc.v1 discovery and load answers as the vLLM dialect's GetModelInfo, GetServerInfo, GetLoads.

The fields smg's engine protocols share (model labels, sampling defaults, the one rank's load)
come from ``dialects/base/info.py``; what is the vLLM protocol's own is here.
"""

from __future__ import annotations

from lmrpc._gen.vllm.grpc import engine as vllm
from reference_server.engine.kv_events import KV_EVENT_BLOCK_SIZE
from reference_server.frontend.context import SERVER_NAME
from reference_server.frontend.dialects.base.info import (
    SERVER_VERSION,
    RatedLoad,
    loads_timestamp,
    scheduler_load_fields,
)
from reference_server.frontend.dialects.base.service import ServerFacts


def server_info(facts: ServerFacts, *, model_dtype: str) -> vllm.GetServerInfoResponse:
    return vllm.GetServerInfoResponse(
        active_requests=facts.load.active_requests,
        is_paused=facts.load.paused,
        last_receive_timestamp=facts.last_receive_timestamp,
        uptime_seconds=facts.uptime_seconds,
        server_type=SERVER_NAME,
        data_parallel_size=1,
        kv_cache_dtype="auto",
        block_size=KV_EVENT_BLOCK_SIZE,  # the block size of its KV-cache events
        model_dtype=model_dtype,
        max_num_seqs=facts.engine.max_running_sequences,
    )


def loads(rated: RatedLoad) -> vllm.GetLoadsResponse:
    return vllm.GetLoadsResponse(
        timestamp=loads_timestamp(),
        version=SERVER_VERSION,
        dp_rank_count=1,
        loads=[vllm.SchedulerLoad(**scheduler_load_fields(rated))],
    )
