#!/usr/bin/env python3
"""vllm-engine SMG-6[cleared]: after FlushCache on an idle engine, SubscribeKvEvents publishes no
"cleared" event: vLLM publishes the KV cache's events at the engine's next step, and an idle
engine takes none, so a router keeps routing on prefixes the server no longer holds.

    python3 SMG-6_cleared.py HOST:PORT      (the vLLM gRPC server, idle)
"""

import threading
import time

from smg_grpc_proto.generated import common_pb2

from _wire import pb, stub

engine = stub()
seen: list[str] = []


def watch() -> None:
    try:
        for batch in engine.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(), timeout=8):
            seen.extend(event.WhichOneof("data") or "?" for event in batch.events)
    except Exception:  # the deadline ends the subscription
        pass


watcher = threading.Thread(target=watch)
watcher.start()
time.sleep(1.0)
print("FlushCache:", engine.FlushCache(common_pb2.FlushCacheRequest(), timeout=30))
watcher.join()
print(f"events in the 7 s after FlushCache: {seen} (want a cleared event)")
