"""Whether a request's constraint compiles (CONSTRAIN-2), checked before the request is accepted.

The constraint is compiled in a worker thread against the vocabulary the engine serves, each
distinct constraint once (``engine/constraints.GrammarCompiler`` caches grammars and errors alike);
the scheduler compiles it once more for itself: a compiled grammar (an llguidance matcher) does
not cross a process, and compiling again costs a few milliseconds, which its cache spends once
per constraint. llguidance is loaded at the first constraint, in that thread.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING

from reference_server.frontend.validation import constraint_refusal
from reference_server.ipc import Constraint
from reference_server.models.tokenizer import TokenizerBundle

if TYPE_CHECKING:
    from reference_server.engine.constraints import GrammarCompiler


class ConstraintChecker:
    def __init__(self, tokenizer: TokenizerBundle, vocab_size: int) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._lock = threading.Lock()
        self._compiler: GrammarCompiler | None = None

    async def check(self, constraint: Constraint) -> None:
        """Raises INVALID_ARGUMENT naming the field if the constraint does not compile."""
        await asyncio.to_thread(self._check, constraint)

    def _check(self, constraint: Constraint) -> None:
        from reference_server.engine.constraints import ConstraintError

        try:
            self._grammar_compiler().compile(constraint)
        except ConstraintError as exc:
            raise constraint_refusal(constraint, exc.field, exc.reason) from None

    def _grammar_compiler(self) -> GrammarCompiler:
        with self._lock:
            if self._compiler is None:
                from reference_server.engine.constraints import GrammarCompiler

                self._compiler = GrammarCompiler(self._tokenizer, self._vocab_size)
            return self._compiler
