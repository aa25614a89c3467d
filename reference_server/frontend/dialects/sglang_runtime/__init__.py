"""SGLang's native gRPC service (``sglang.runtime.v1.SglangService``) on top of lmrpc.v1."""
