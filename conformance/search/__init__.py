"""Hypothesis: request strategies, the table of invalid inputs, property searches, the shared
stream pool and the lifecycle state machine."""
