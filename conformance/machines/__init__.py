"""Hypothesis state machines that drive many requests at once (``lifecycle``)."""
