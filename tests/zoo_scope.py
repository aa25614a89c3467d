"""How much of the harness a zoo runs against each of its mutants.

``declared`` (the default, and what CI runs): a mutant runs only the cases it declares (expected
and tolerated), so every run proves that each declared case still sees its fault. A correct variant
(the unmutated proxy, a control) still runs every case: it must pass all of them.

``full`` (``LMRPC_SELFTEST_ZOO=full``): every mutant runs every case, which also proves that it
fails nothing it does not declare. That is the whole matrix (about 40 minutes of both cores on this
machine kind); run it for a new mutant, and whenever a declared list is in doubt.

``LMRPC_SELFTEST_ZOO_CASES="GLOB GLOB"`` (declared scope only) adds those cases to every mutant's run:
a new case's column of the matrix, so its author sees which mutants it catches beyond the one it was
written for (each must then declare it) for the price of the new case alone.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

MODES = ("declared", "full")
MODE = os.environ.get("LMRPC_SELFTEST_ZOO", "declared")
if MODE not in MODES:
    raise ValueError(f"LMRPC_SELFTEST_ZOO={MODE!r}: expected one of {', '.join(MODES)}")
FULL = MODE == "full"
COLUMN = tuple(os.environ.get("LMRPC_SELFTEST_ZOO_CASES", "").split())  # case IDs hold commas, no spaces
SCOPE = f"{'every case' if FULL else 'each on its declared cases'}, {MODE} zoo"  # for the printed scores


def scope_args(case_ids: Iterable[str], folder: Path, name: str, *, fixed: bool = False) -> tuple[str, ...]:
    """The ``conformance run`` arguments that limit one mutant's run to ``case_ids`` (nothing in the
    full mode, unless ``fixed``: a control made for those cases alone; nothing for a correct variant,
    which declares no case). The IDs go through a ``@file``: a case ID may hold characters the
    command line's comma lists would split."""
    ids = sorted(set(case_ids))
    if (FULL and not fixed) or not ids:
        return ()
    folder.mkdir(parents=True, exist_ok=True)
    listing = folder / f"{name}.cases"
    listing.write_text("".join(f"{pattern}\n" for pattern in (*ids, *COLUMN)), encoding="utf-8")
    return ("--run", f"@{listing}")
