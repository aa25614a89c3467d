"""The dialect table: every foreign protocol the frontend serves, in the order it installs them.

``frontend/app.py`` loops over it: a dialect that is enabled joins lmrpc.v1 on its port, or
listens on a port of its own, with its administrative RPCs behind the admin role.
"""

from __future__ import annotations

from reference_server.frontend.dialects.base.dialect import Dialect
from reference_server.frontend.dialects.sglang_runtime.service import SGLANG_RUNTIME
from reference_server.frontend.dialects.sglang_scheduler.service import SGLANG_SCHEDULER
from reference_server.frontend.dialects.vllm_engine.service import VLLM_ENGINE

DIALECTS: tuple[Dialect, ...] = (VLLM_ENGINE, SGLANG_SCHEDULER, SGLANG_RUNTIME)
