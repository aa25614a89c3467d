"""The mutant zoo: each mutant is the reference server behind a proxy with exactly one fault, and
declares the cases (IDs or globs) that must fail against it, no more and no fewer."""

from __future__ import annotations

from .abort_faults import ABORT_FAULTS
from .base import Mutant
from .constraints import CONSTRAINT_MUTANTS
from .control_rpcs import CONTROL_MUTANTS
from .correct_variants import CORRECT_VARIANTS
from .requests import REQUEST_MUTANTS
from .revision3 import REVISION_3_MUTANTS
from .server_faults import SERVER_FAULTS
from .stream import STREAM_MUTANTS
from .stream_faults import STREAM_FAULTS
from .unary import UNARY_MUTANTS

MUTANTS: tuple[type[Mutant], ...] = (
    *STREAM_MUTANTS,
    *CONTROL_MUTANTS,
    *UNARY_MUTANTS,
    *REQUEST_MUTANTS,
    *ABORT_FAULTS,
    *STREAM_FAULTS,
    *SERVER_FAULTS,
    *REVISION_3_MUTANTS,
    *CONSTRAINT_MUTANTS,
    *CORRECT_VARIANTS,
)

__all__ = ["MUTANTS", "Mutant"]
