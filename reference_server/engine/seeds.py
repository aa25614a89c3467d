"""How a request's seed becomes one generator seed per output, for both engines: output ``i`` of a
request with seed ``s`` samples from a generator seeded with ``derive_seed(s, i)``, so seeded
outputs are reproducible whatever else runs beside them (SAMPLE-3)."""

from __future__ import annotations


def derive_seed(seed: int, output_index: int) -> int:
    """Seed of output ``output_index``'s generator: deterministic, distinct per index."""
    mixed = (seed ^ (0x9E3779B97F4A7C15 * (output_index + 1))) & 0xFFFFFFFFFFFFFFFF
    mixed ^= mixed >> 31
    return (mixed * 0xBF58476D1CE4E5B9) & 0x7FFFFFFFFFFFFFFF
