"""Self-test of the conformance harness: the reference server must pass, every mutant must fail
exactly the cases its fault breaks (tests/selftest/mutants.py)."""
