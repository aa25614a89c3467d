"""Interop with grpcio (C-core HTTP/2, protobuf codec): Generate, Control, health, reflection."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from reference_server.models.tokenizer import TokenizerBundle
from reference_server.testing import ServerProcess

PROBE = Path(__file__).with_name("grpcio_probe.py")


def test_grpcio_client(
    fake_server: ServerProcess, pb_modules: dict[str, ModuleType], tokenizer: TokenizerBundle
) -> None:
    pb_dir = Path(pb_modules["lmrpc/v1/inference.proto"].__file__ or "").parents[2]
    result = subprocess.run(
        [sys.executable, str(PROBE), fake_server.target, str(pb_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["kinds"][0] == "prompt_info" and seen["kinds"].count("finished") == 2
    assert seen["request_ids"] == ["grpcio-1"]
    assert seen["completion_tokens"] == 12
    # the greedy fake engine echoes the prompt; 6 tokens end inside a character, which the final
    # flush turns into U+FFFD exactly as a full decode does
    assert seen["text0"] == tokenizer.decode(tokenizer.encode("interop 互通 ✓")[:6])
    assert seen["index_present"]
    assert seen["kv_tokens_total"] > 0
    assert seen["bad_code"] == "INVALID_ARGUMENT" and "temperature" in seen["bad_details"]
    assert seen["cancelled"]
    assert set(seen["health"].values()) == {"SERVING"}
    services = {"lmrpc.v1.InferenceService", "lmrpc.v1.ControlService", "vllm.grpc.engine.VllmEngine"}
    assert {*services, "grpc.health.v1.Health"} <= set(seen["services"])
    assert seen["vllm_subscribe"] == [
        "smg.grpc.common.SubscribeKvEventsRequest",
        "smg.grpc.common.KvEventBatch",
    ]
    assert seen["generate"]["server_streaming"] and not seen["generate"]["client_streaming"]
    assert seen["generate"]["output"] == "lmrpc.v1.GenerateResponse"
    assert {"prompt_info", "delta", "finished", "error", "usage"} <= set(seen["generate"]["fields"])
