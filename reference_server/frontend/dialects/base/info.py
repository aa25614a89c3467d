"""lmrpc.v1 discovery and load facts in the fields the dialects' GetModelInfo and GetLoads share.

smg's engine protocols spell these messages alike (the same field names and meanings), so each
dialect builds its own message type from the same values:

- ``served_model_name`` is the OpenAI ``model`` id; ``default_sampling_params_json`` holds
  lmrpc's EffectiveDefaults;
- ``model_path`` is where smg looks for the tokenizer first (``model_path_label``);
- int32 ids the model lacks (pad, and BOS for some models) are -1;
- a load reports one data-parallel rank; running and waiting count *sequences* (an n > 1 request
  counts n), ``num_total_reqs`` the Generate calls in flight, ``token_usage`` the KV share held
  by requests (reusable cached prefixes excluded).
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from typing import TypedDict

from lmrpc import __version__
from lmrpc.v1 import Load, ModelInfo
from reference_server.frontend.context import SERVER_NAME
from reference_server.frontend.dialects.base.tokenizer_bundle import ARCHITECTURES
from reference_server.ipc import EngineInfo
from reference_server.models.source import ModelSource

NO_TOKEN_ID = -1  # int32 ids the model lacks (pad, and BOS for some models)
SERVER_VERSION = f"{SERVER_NAME} {__version__}"


@dataclass(frozen=True, slots=True)
class RatedLoad:
    """What GetLoads reports: lmrpc's Load, the engine's facts, and the rates the frontend
    measures (0 without metrics)."""

    load: Load
    engine: EngineInfo
    gen_throughput: float
    cache_hit_rate: float

    @property
    def token_usage(self) -> float:
        total = self.load.kv_tokens_total
        return self.load.kv_tokens_in_use / total if total else 0.0

    @property
    def utilization(self) -> float:
        most = self.engine.max_running_sequences
        return self.load.running_sequences / most if most else 0.0


class ModelInfoFields(TypedDict):
    """The fields of GetModelInfoResponse that every smg engine protocol has."""

    model_path: str
    is_generation: bool
    max_context_length: int
    vocab_size: int
    supports_vision: bool
    served_model_name: str
    model_type: str
    architectures: list[str]
    eos_token_ids: list[int]
    pad_token_id: int
    bos_token_id: int
    max_req_input_len: int
    default_sampling_params_json: str


class SchedulerLoadFields(TypedDict):
    """The fields of the one data-parallel rank's SchedulerLoad that every smg engine protocol has."""

    dp_rank: int
    num_running_reqs: int
    num_waiting_reqs: int
    num_total_reqs: int
    num_used_tokens: int
    max_total_num_tokens: int
    token_usage: float
    gen_throughput: float
    cache_hit_rate: float
    utilization: float
    max_running_requests: int


def model_info_fields(model: ModelInfo, source: ModelSource) -> ModelInfoFields:
    return ModelInfoFields(
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


def scheduler_load_fields(rated: RatedLoad) -> SchedulerLoadFields:
    load = rated.load
    return SchedulerLoadFields(
        dp_rank=0,
        num_running_reqs=load.running_sequences,
        num_waiting_reqs=load.waiting_sequences,
        num_total_reqs=load.active_requests,
        num_used_tokens=load.kv_tokens_in_use,
        max_total_num_tokens=load.kv_tokens_total,
        token_usage=rated.token_usage,
        gen_throughput=rated.gen_throughput,
        cache_hit_rate=rated.cache_hit_rate,
        utilization=rated.utilization,
        max_running_requests=rated.engine.max_running_sequences,
    )


def loads_timestamp() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


def model_path_label(source: ModelSource, model_id: str) -> str:
    """Where smg looks for the tokenizer first: the model directory of a Hugging Face checkpoint
    (loaded when smg shares the filesystem), else the model id, which is no path, so smg fetches
    the tokenizer over GetTokenizer."""
    return str(source.path) if source.kind == "hf" else model_id


def sampling_defaults_json(model: ModelInfo) -> str:
    """lmrpc's EffectiveDefaults as ``default_sampling_params_json``: the values smg reads
    (``worker/sampling_defaults.rs``: temperature, top_p, top_k, min_p, repetition_penalty)."""
    defaults = model.defaults
    if defaults is None:
        return "{}"
    values = {
        "temperature": defaults.temperature,
        "top_p": defaults.top_p,
        "top_k": defaults.top_k,
        "min_p": defaults.min_p,
        "repetition_penalty": defaults.repetition_penalty,
    }
    return json.dumps(values, sort_keys=True)
