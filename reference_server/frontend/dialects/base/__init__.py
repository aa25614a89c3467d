"""What every dialect shares: the service base (Generate translated onto lmrpc.v1, health, the
lmrpc facts discovery and load translate), the Generate event walk, request refusals, the
dialect descriptor, and what smg's engine protocols add (``smg.grpc.common``: the tokenizer
bundle, KV events, cache flush, profiler). Dialects import from here, never from each other."""
