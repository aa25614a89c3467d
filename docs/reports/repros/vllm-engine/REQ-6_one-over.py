#!/usr/bin/env python3
"""vllm-engine REQ-6[one-over]: 4 prompt tokens with max_tokens = window - 3 (one token past the
window) is accepted and cut at the window, not refused (vLLM's HTTP server answers 400).

    python3 REQ-6_one-over.py HOST:PORT      (the vLLM gRPC server, --max-model-len 4096)
"""

from _wire import PROMPT, generate, stub

WINDOW = 4096
request = generate("repro-one-over", temperature=0.0, max_tokens=WINDOW - len(PROMPT) + 1, ignore_eos=True)
responses = stub().Generate(request, timeout=120)
first = next(responses)
print("accepted: first message", first.WhichOneof("response"))
responses.cancel()
print("want INVALID_ARGUMENT: prompt + max_tokens is one token over the window; got a stream")
