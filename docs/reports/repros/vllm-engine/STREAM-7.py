#!/usr/bin/env python3
"""vllm-engine STREAM-7: OutputLogProbs.top_logprobs of a sampled token lead with that token and
then list the k-1 most likely ones, so they are neither the k most likely tokens nor sorted by
logprob whenever sampling picks a token that is not the most likely one
(smg_grpc_servicer/vllm/servicer.py, _build_top_logprobs: the first k items of vLLM's logprob dict,
whose first item is the sampled token). vLLM's OpenAI server does the same for chat
(vllm/entrypoints/openai/chat_completion/serving.py, _get_top_logprobs).

    python3 STREAM-7.py HOST:PORT      (the vLLM gRPC server)
"""

from _wire import generate, stub

request = generate("repro-top", temperature=1.0, seed=7, max_tokens=16, ignore_eos=True, logprobs=3)
unsorted = 0
for message in stub().Generate(request, timeout=120):
    body = message.chunk if message.WhichOneof("response") == "chunk" else message.complete
    logprobs = body.output_logprobs
    for token, value, top in zip(logprobs.token_ids, logprobs.token_logprobs, logprobs.top_logprobs):
        values = list(top.values)
        if values != sorted(values, reverse=True):
            unsorted += 1
            print(f"token {token} ({value:.3f}): top {list(top.token_ids)} {[round(v, 3) for v in values]}")
print(f"{unsorted} positions whose top_logprobs are not sorted by logprob (want 0)")
