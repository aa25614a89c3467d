"""The vLLM worker dialect of smg (``vllm.grpc.engine.VllmEngine``) on top of lmrpc.v1."""
