"""The case library, one module per clause group. Importing this package registers every case;
the order here is the order of the report."""

from __future__ import annotations

from conformance.cases import (  # noqa: F401
    abort,
    admin,
    cancel,
    capabilities,
    errors,
    sampling,
    services,
    stops,
    stream,
    usage,
)
from conformance.machines import run as _machines  # noqa: F401
