"""``python -m conformance`` is the ``conformance`` command."""

from __future__ import annotations

import sys

from conformance.cli import main

sys.exit(main())
