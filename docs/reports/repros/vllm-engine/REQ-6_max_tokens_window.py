#!/usr/bin/env python3
"""vllm-engine REQ-6: a request whose prompt and max_tokens together pass the context window is
accepted and cut at the window (finish "length"), where vLLM's own HTTP server refuses it with a
400 ("This model's maximum context length is ..."). smg forwards OpenAI requests with any
max_tokens to this server, so through smg a max_tokens of 10^9 is an HTTP 200.

    python3 REQ-6_max_tokens_window.py HOST:PORT      (the vLLM gRPC server, --max-model-len 4096)
"""

from _wire import generate, stub

WINDOW = 4096
request = generate("repro-window", temperature=0.0, max_tokens=WINDOW, ignore_eos=True)
responses = stub().Generate(request, timeout=120)
first = next(responses)
print("accepted: first message", first.WhichOneof("response"), list(first.chunk.token_ids)[:4])
responses.cancel()
print(f"want INVALID_ARGUMENT for 4 prompt tokens + max_tokens {WINDOW} > window {WINDOW}; got a stream")
