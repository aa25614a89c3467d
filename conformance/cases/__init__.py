"""The case library, one module per clause group. Importing this package registers every case;
the import order below is the order cases start in and the order of the report (load-watching
cases that need a pristine server come first). ``all_cases()`` is every registered case."""

# isort: skip_file
from __future__ import annotations

from conformance.cases import services  # noqa: F401
from conformance.cases import capabilities  # noqa: F401
from conformance.cases import embed  # noqa: F401
from conformance.cases import models  # noqa: F401
from conformance.cases import scoring  # noqa: F401
from conformance.cases import errors  # noqa: F401
from conformance.cases import malformed  # noqa: F401
from conformance.cases import auth  # noqa: F401
from conformance.cases import stream  # noqa: F401
from conformance.cases import sampling  # noqa: F401
from conformance.cases import stops  # noqa: F401
from conformance.cases import stop_tokens  # noqa: F401
from conformance.cases import constraints  # noqa: F401
from conformance.cases import usage  # noqa: F401
from conformance.cases import abort  # noqa: F401
from conformance.cases import cancel  # noqa: F401
from conformance.cases import admin  # noqa: F401
from conformance.cases import flow  # noqa: F401
from conformance.cases import prompts  # noqa: F401
from conformance.cases import stateful  # noqa: F401
from conformance.cases import smg  # noqa: F401
from conformance.cases import kv_events  # noqa: F401
from conformance.cases import sglang_runtime  # noqa: F401
from conformance.cases import sglang_runtime_embed  # noqa: F401
from conformance.cases import sglang_runtime_admin  # noqa: F401
from conformance.cases import sglang_runtime_constraints  # noqa: F401
from conformance.cases import lifecycle  # noqa: F401
from conformance.cases import tracing  # noqa: F401
from conformance.cases import openai  # noqa: F401
from conformance.spec.registry import REGISTRY, Case


def all_cases() -> list[Case]:
    """Every case of the library, in registration order."""
    return list(REGISTRY.values())
