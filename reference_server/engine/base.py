"""The interface between the scheduler process and an engine (the real model or the fake one).

The scheduler process owns exactly one Engine and drives it from a single thread:

    engine.add_request(submit, grammar) # admitted later, when capacity allows
    while engine.has_work():
        outputs = engine.step()         # one forward pass: new tokens for running outputs
    engine.abort_request(rid)           # any time between steps

An engine never blocks on I/O, never raises for a request it was given (the frontend validated
it against EngineInfo), and after ``abort_request``/its last finish holds no state for the rid.
A constrained request comes with its grammar, compiled off the engine's thread (the scheduler's
``GrammarQueue``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Collection
from typing import TYPE_CHECKING, Protocol

from reference_server.ipc import EngineInfo, EngineLoad, KvCacheEvent, SequenceOutput, SubmitRequest
from reference_server.models.source import ModelSource

if TYPE_CHECKING:
    from reference_server.engine.constraints import Grammar


# the grammar engine (the server extra's llguidance; it imports nothing else)
GRAMMAR_MODULES = ("llguidance",)


def constrained_decoding_available(eos_token_ids: Collection[int]) -> bool:
    """Whether an engine can honour constraints (EngineInfo.constrained_decoding): llguidance can
    be imported (it is, only at the first constraint), and the model has an EOS token for a
    complete output to end with (CONSTRAIN-1)."""
    return bool(eos_token_ids) and all(importlib.util.find_spec(name) for name in GRAMMAR_MODULES)


class Engine(Protocol):
    def info(self) -> EngineInfo:
        """Static facts the frontend validates requests against. Cheap; called once at start."""
        ...

    def add_request(self, request: SubmitRequest, grammar: Grammar | None = None) -> None:
        """Queue a request group. Its ``num_outputs`` outputs are admitted all-or-nothing;
        a group waits (never fails) while there is not enough free KV space. ``grammar``: the
        compiled ``request.constraint``, which every output's tokens then follow (CONSTRAIN-1)."""
        ...

    def abort_request(self, rid: str) -> list[SequenceOutput]:
        """Drop every output of ``rid`` (waiting or running) and free its KV slots.
        Returns one ``finish=Finish("aborted")`` output, with no tokens, per output that had
        not finished yet; ``[]`` for an unknown rid."""
        ...

    def finish_output(self, rid: str, output_index: int) -> None:
        """The detokenizer ended this output (stop string). Free it and emit nothing more for it."""
        ...

    def grant_tokens(self, rid: str, credit: int) -> None:
        """Let the outputs of ``rid`` produce tokens until they have ``credit`` in all (a request
        starts with ``SubmitRequest.token_credit``; 0 there means no limit). A request out of
        credit keeps its KV cache but takes no part in steps, and gives its batch slots and unused
        KV reservation to others, until more is granted (FLOW-1). Unknown rids are ignored."""
        ...

    def step(self) -> list[SequenceOutput]:
        """Run one scheduling step. Each running output that produced a token gets one
        SequenceOutput; an output's last SequenceOutput carries its Finish. The first output
        emitted for a request carries ``cached_prompt_tokens``."""
        ...

    def has_work(self) -> bool:
        """Whether ``step()`` could make progress: something running with credit left, or waiting
        that a step might admit (False after a step that could neither run nor admit anything,
        until a request arrives, ends or is granted more tokens)."""
        ...

    def load(self, *, paused: bool) -> EngineLoad:
        """Current occupancy. Once no request is in flight every count is 0 except the totals and
        ``kv_tokens_cached`` (the prefix cache outlives requests)."""
        ...

    def flush_cache(self) -> int:
        """Drop every cached prefix that no running request uses. Returns KV slots released."""
        ...

    def drain_kv_events(self) -> list[KvCacheEvent]:
        """What the prefix cache stored and removed since the last call, in order, as blocks of
        ``engine.kv_events.KV_EVENT_BLOCK_SIZE`` tokens (see ipc.KvEvents)."""
        ...

    def embed(self, texts: list[str]) -> tuple[list[list[float]], list[int]]:
        """L2-normalized embedding per text and its token count. Raises ValueError for a text
        longer than the embedding model's window."""
        ...

    def update_weights(self, source: ModelSource) -> str:
        """Replace the model's weights by ``source``'s, between steps, without dropping requests
        in flight; returns what was done. Raises ValueError (CheckpointMismatchError for a shape
        that does not fit) or OSError and then serves on with the weights it had."""
        ...
