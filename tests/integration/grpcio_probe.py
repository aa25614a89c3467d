"""Runs in its own interpreter (grpcio's health/reflection protos would clash with grpclib's in
the test process): talks to a server with grpcio only and prints what it saw as JSON.

usage: python grpcio_probe.py HOST:PORT PB_DIR
"""

from __future__ import annotations

import json
import sys

import grpc
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase


def main(target: str, pb_dir: str) -> None:
    sys.path.insert(0, pb_dir)
    from pbwire.v1 import control_pb2, inference_pb2  # the contract under another package name

    seen: dict[str, object] = {}
    with grpc.insecure_channel(target) as channel:
        generate = channel.unary_stream(
            "/lmrpc.v1.InferenceService/Generate",
            request_serializer=inference_pb2.GenerateRequest.SerializeToString,
            response_deserializer=inference_pb2.GenerateResponse.FromString,
        )
        request = inference_pb2.GenerateRequest(request_id="grpcio-1", text="interop 互通 ✓")
        request.sampling.temperature = 0.0
        request.sampling.n = 2
        request.stopping.max_tokens = 6
        responses = list(generate(request, timeout=30))
        seen["kinds"] = [r.WhichOneof("event") for r in responses]
        seen["request_ids"] = sorted({r.request_id for r in responses})
        seen["completion_tokens"] = responses[-1].usage.completion_tokens
        seen["text0"] = "".join(
            r.delta.text for r in responses if r.WhichOneof("event") == "delta" and r.delta.output_index == 0
        )
        seen["index_present"] = all(
            r.delta.HasField("output_index") for r in responses if r.WhichOneof("event") == "delta"
        )
        get_load = channel.unary_unary(
            "/lmrpc.v1.ControlService/GetLoad",
            request_serializer=control_pb2.GetLoadRequest.SerializeToString,
            response_deserializer=control_pb2.GetLoadResponse.FromString,
        )
        seen["kv_tokens_total"] = get_load(control_pb2.GetLoadRequest(), timeout=5).current.kv_tokens_total
        bad = inference_pb2.GenerateRequest(text="x")
        bad.sampling.temperature = -1.0
        try:
            list(generate(bad, timeout=5))
        except grpc.RpcError as exc:
            seen["bad_code"] = exc.code().name
            seen["bad_details"] = exc.details()
        long = inference_pb2.GenerateRequest(text="cancel me")
        long.stopping.max_tokens, long.stopping.ignore_eos = 4000, True  # still running when cancelled
        stream = generate(long, timeout=30)
        next(stream)
        stream.cancel()
        seen["cancelled"] = stream.cancelled()

        health = health_pb2_grpc.HealthStub(channel)
        seen["health"] = {
            service: health_pb2.HealthCheckResponse.ServingStatus.Name(
                health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
            )
            for service in (
                "",
                "lmrpc.v1.InferenceService",
                "lmrpc.v1.ControlService",
                "vllm.grpc.engine.VllmEngine",
            )
        }
        database = ProtoReflectionDescriptorDatabase(channel)
        seen["services"] = sorted(database.get_services())
        method = (
            DescriptorPool(database)
            .FindServiceByName("lmrpc.v1.InferenceService")
            .FindMethodByName("Generate")
        )
        seen["generate"] = {
            "server_streaming": method.server_streaming,
            "client_streaming": method.client_streaming,
            "output": method.output_type.full_name,
            "fields": sorted(method.output_type.fields_by_name),
        }
        # the vendored smg protocol is described too, with its imports (common.proto)
        subscribe = (
            DescriptorPool(database)
            .FindServiceByName("vllm.grpc.engine.VllmEngine")
            .FindMethodByName("SubscribeKvEvents")
        )
        seen["vllm_subscribe"] = [subscribe.input_type.full_name, subscribe.output_type.full_name]
    print(json.dumps(seen))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
