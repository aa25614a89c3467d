"""Constrained requests wait here, outside the engine, while their grammar compiles.

The scheduler's loop never waits for a compile (the first reads the vocabulary, 0.4 s; a large
schema takes tens of milliseconds): a request whose grammar is not compiled yet is parked, its
constraint compiled in one background thread, and the loop hands it to the engine on a later
turn; requests behind it go ahead meanwhile. The compiler (llguidance and the tokenizer's
vocabulary) is built in that thread at the first constraint, so a scheduler that never meets one
never loads llguidance.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from reference_server.ipc import Constraint, SubmitRequest
from reference_server.models.source import resolve_model
from reference_server.models.tokenizer import load_tokenizer

if TYPE_CHECKING:
    from reference_server.engine.constraints import Grammar, GrammarCompiler

log = logging.getLogger("lmrpc.scheduler")


class GrammarQueue:
    def __init__(self, make_compiler: Callable[[], GrammarCompiler]) -> None:
        self._make_compiler = make_compiler
        self._compiler: GrammarCompiler | None = None
        self._parked: dict[str, SubmitRequest] = {}  # by rid, in arrival order
        self._jobs: queue.SimpleQueue[Constraint | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._done: dict[Constraint, Grammar | str] = {}  # a grammar, or why it did not compile
        self._thread: threading.Thread | None = None

    @property
    def waiting(self) -> bool:
        return bool(self._parked)

    def compiled(self, constraint: Constraint) -> Grammar | None:
        """The grammar, if it is compiled already (never waits)."""
        compiler = self._compiler
        return None if compiler is None else compiler.cached(constraint)

    def park(self, request: SubmitRequest) -> None:
        """Hold a constrained request until its grammar is compiled (``ready``)."""
        assert request.constraint is not None
        if all(p.constraint != request.constraint for p in self._parked.values()):
            self._jobs.put(request.constraint)
        self._parked[request.rid] = request
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="grammar-compiler", daemon=True)
            self._thread.start()

    def ready(self) -> list[tuple[SubmitRequest, Grammar | str]]:
        """The parked requests whose grammar is done, in arrival order, each with its grammar or
        why it does not compile."""
        if not self._parked:
            return []
        with self._lock:
            done = dict(self._done)
        result = []
        for rid, request in list(self._parked.items()):
            assert request.constraint is not None
            outcome = done.get(request.constraint)
            if outcome is not None:
                del self._parked[rid]
                result.append((request, outcome))
        if result:
            self._forget_unwaited()
        return result

    def drop(self, rid: str) -> SubmitRequest | None:
        """Take a parked request out (it was aborted); None if ``rid`` is not parked."""
        request = self._parked.pop(rid, None)
        if request is not None:
            self._forget_unwaited()
        return request

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)

    def _forget_unwaited(self) -> None:
        # the compiler's cache keeps the grammar; this only holds it for the requests parked on it
        wanted = {request.constraint for request in self._parked.values()}
        with self._lock:
            for constraint in [c for c in self._done if c not in wanted]:
                del self._done[constraint]

    def _run(self) -> None:
        while (constraint := self._jobs.get()) is not None:
            outcome: Grammar | str
            try:
                outcome = self._compile(constraint)
            except ValueError as exc:  # ConstraintError: the frontend's check compiled it, so rare
                outcome = str(exc)
            except Exception as exc:
                log.exception("the grammar compiler failed")
                outcome = f"the grammar compiler failed: {exc}"
            with self._lock:
                self._done[constraint] = outcome

    def _compile(self, constraint: Constraint) -> Grammar:
        if self._compiler is None:
            self._compiler = self._make_compiler()
        return self._compiler.compile(constraint)


def compiler_factory(model_path: str | None, vocab_size: int) -> Callable[[], GrammarCompiler]:
    """Builds the compiler for the served model's tokenizer and ``vocab_size`` (the logits' width)."""

    def make() -> GrammarCompiler:
        from reference_server.engine.constraints import GrammarCompiler

        return GrammarCompiler(load_tokenizer(resolve_model(model_path)), vocab_size)

    return make
