"""What smg's engine dialects share (``smg.grpc.common``): the tokenizer bundle and KV events."""
