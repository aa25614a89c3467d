"""The SGLang scheduler protocol of smg (``sglang.grpc.scheduler.SglangScheduler``) on top of lmrpc.v1."""
