"""Self-test of the engine-protocol drivers: mutating proxies of vllm-engine and sglang-scheduler."""
