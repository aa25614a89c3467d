"""Black-box conformance harness for lmrpc.v1 servers: ``conformance run --target host:port``.

The public surface a case author uses is re-exported here (``case``, ``Ctx``, ``CaseFailed``,
``CaseSkipped``); the machinery lives in folders (docs/conformance-map.md has one line per package):
``spec`` what is checked, ``harness`` how a run executes, ``stream`` one Generate call as the client
sees it, ``validators`` the pure stream checks, ``search`` hypothesis, ``cases`` the case library,
``report`` console, JUnit, JSON, repro scripts and baselines.
"""

from __future__ import annotations

HARNESS_VERSION = "0.1.0"
REPORT_SCHEMA = "lmrpc-conformance/1"

from conformance.harness.context import Ctx  # noqa: E402
from conformance.harness.outcome import CaseFailed, CaseSkipped  # noqa: E402
from conformance.spec.registry import case  # noqa: E402

__all__ = ["HARNESS_VERSION", "REPORT_SCHEMA", "CaseFailed", "CaseSkipped", "Ctx", "case"]
