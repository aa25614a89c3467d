#!/usr/bin/env python3
"""vllm-engine SVC-4: GetServerInfo.uptime_seconds is always 0 (smg_grpc_servicer/vllm/servicer.py
GetServerInfo never sets it), so a router cannot tell a restarted server from the one it knew; the
vLLM protocol has no other field that names the running instance.

    python3 SVC-4.py HOST:PORT      (the vLLM gRPC server)
"""

import time

from _wire import pb, stub

engine = stub()
first = engine.GetServerInfo(pb.GetServerInfoRequest(), timeout=10).uptime_seconds
time.sleep(1.0)
second = engine.GetServerInfo(pb.GetServerInfoRequest(), timeout=10).uptime_seconds
print(f"uptime_seconds {first} then, 1 s later, {second} (want > 0 and growing)")
