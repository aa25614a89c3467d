"""The OpenAI-compatible HTTP profile's cases (``--protocol openai``), one module per concern;
importing this package registers them. Each case ID is its clause's, with ``openai`` first in its
brackets."""

# isort: skip_file
from __future__ import annotations

import conformance.cases.openai.services
import conformance.cases.openai.errors
import conformance.cases.openai.pool
import conformance.cases.openai.compare
import conformance.cases.openai.usage
import conformance.cases.openai.stops
import conformance.cases.openai.disconnect
import conformance.cases.openai.structured
import conformance.cases.openai.tools  # noqa: F401
