"""lmrpc.v1 discovery and load answers as the SGLang scheduler's GetModelInfo, GetServerInfo,
GetLoads.

The fields smg's engine protocols share (model labels, sampling defaults, the one rank's load)
come from ``dialects/base/info.py``. What is SGLang's own: GetServerInfo's ``server_args``, of
which smg picks a few keys (``routers/grpc/client.rs`` ``SGLANG_GRPC_KEYS``), and GetLoads'
aggregate over the (one) rank.
"""

from __future__ import annotations

import datetime

from lmrpc._gen.google.protobuf import Struct
from lmrpc._gen.sglang.grpc import scheduler as sglang
from lmrpc.v1 import ModelInfo
from reference_server.frontend.context import SERVER_NAME
from reference_server.frontend.dialects.base.info import (
    SERVER_VERSION,
    RatedLoad,
    loads_timestamp,
    model_path_label,
    scheduler_load_fields,
)
from reference_server.frontend.dialects.base.service import ServerFacts
from reference_server.models.source import ModelSource


def server_info(facts: ServerFacts, model: ModelInfo, source: ModelSource) -> sglang.GetServerInfoResponse:
    load = facts.load
    started = datetime.datetime.fromtimestamp(
        facts.started_at_unix, datetime.UTC
    )  # fixed: routers compare it
    server_args = {
        "model_path": model_path_label(source, model.model_id),
        "served_model_name": model.model_id,
        "context_length": model.max_context_tokens,
        "vocab_size": model.vocab_size,
        "max_total_tokens": load.kv_tokens_total,
        "max_running_requests": facts.engine.max_running_sequences,
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
        last_receive_timestamp=facts.last_receive_timestamp,
        uptime_seconds=facts.uptime_seconds,
        sglang_version=SERVER_VERSION,
        server_type=SERVER_NAME,
        start_time=started,
        max_total_num_tokens=load.kv_tokens_total,
    )


def loads(rated: RatedLoad) -> sglang.GetLoadsResponse:
    load = rated.load
    return sglang.GetLoadsResponse(
        timestamp=loads_timestamp(),
        version=SERVER_VERSION,
        dp_rank_count=1,
        loads=[sglang.SchedulerLoad(**scheduler_load_fields(rated))],
        aggregate=sglang.AggregateMetrics(
            total_running_reqs=load.running_sequences,
            total_waiting_reqs=load.waiting_sequences,
            total_reqs=load.active_requests,
            avg_token_usage=rated.token_usage,
            avg_throughput=rated.gen_throughput,
            avg_utilization=rated.utilization,
        ),
    )
