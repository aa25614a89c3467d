"""The mutant zoo: each mutant is the reference server behind a proxy with exactly one fault, and
declares the cases (IDs or globs) that must fail against it, no more and no fewer."""

from __future__ import annotations

from .base import Mutant
from .blind_spots import BLIND_SPOT_MUTANTS
from .control import CONTROL_MUTANTS
from .controls import CORRECT_VARIANTS
from .requests import REQUEST_MUTANTS
from .stream import STREAM_MUTANTS
from .unary import UNARY_MUTANTS

MUTANTS: tuple[type[Mutant], ...] = (
    *STREAM_MUTANTS,
    *CONTROL_MUTANTS,
    *UNARY_MUTANTS,
    *REQUEST_MUTANTS,
    *BLIND_SPOT_MUTANTS,
    *CORRECT_VARIANTS,
)

__all__ = ["MUTANTS", "Mutant"]
