"""What the vllm-engine repros share: a grpcio channel to vLLM's gRPC worker server and smg's
messages for it (pip install grpcio "smg-grpc-proto==0.4.28"). No lmrpc code: the wire only."""

import sys

import grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

TARGET = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051"
PROMPT = [1, 9519, 28, 2114]  # token ids of SmolLM2's vocabulary; any short prompt shows the same


def stub() -> pb_grpc.VllmEngineStub:
    return pb_grpc.VllmEngineStub(grpc.insecure_channel(TARGET))


def generate(request_id: str, **sampling: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=request_id,
        tokenized=pb.TokenizedInput(input_ids=PROMPT, original_text="repro"),
        sampling_params=pb.SamplingParams(**sampling),
        stream=True,
    )
