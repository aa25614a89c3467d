"""Run reports: the summary and badge line, JUnit XML, versioned JSON, and the rich console view."""

from __future__ import annotations

from conformance.report.model import RunReport, badge, exit_code

__all__ = ["RunReport", "badge", "exit_code"]
