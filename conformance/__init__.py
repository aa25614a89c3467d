"""Black-box conformance harness for LLM inference servers: ``conformance run --target host:port``.

What a case author uses is re-exported here (``case``, ``Ctx``, ``CaseFailed``, ``CaseSkipped``).
The machinery lives in layers, each importing only those below it (docs/conformance-map.md):
``vocabulary`` (what a target is, what a case produces), ``spec`` (what is checked), ``stream`` (one
Generate call as the client sees it), ``drivers`` (each protocol's wire), ``validators`` (pure
stream checks), ``report``, ``harness`` (how a run executes), ``search`` (hypothesis), ``cases``
(the case library), and at the top the program: ``commands``, ``cli``, ``pytest_plugin``.
"""

from __future__ import annotations

from conformance.harness.context import Ctx
from conformance.spec.registry import case
from conformance.vocabulary import HARNESS_VERSION, REPORT_SCHEMA, CaseFailed, CaseSkipped

__all__ = ["HARNESS_VERSION", "REPORT_SCHEMA", "CaseFailed", "CaseSkipped", "Ctx", "case"]
