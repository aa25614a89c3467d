"""Black-box conformance harness for lmrpc.v1 servers: ``conformance run --target host:port``.

The cases live in ``conformance.cases`` (one module per clause group, each case named after the
clause of docs/contract.md it checks); ``conformance.runner`` runs them, ``conformance.report``
writes the console, JUnit and JSON reports.
"""

from __future__ import annotations

HARNESS_VERSION = "0.1.0"
REPORT_SCHEMA = "lmrpc-conformance/1"
