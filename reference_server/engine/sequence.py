"""Engine-side state of a request group and its outputs: plain Python the batcher can read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from reference_server.ipc import SubmitRequest

if TYPE_CHECKING:
    from reference_server.engine.constraints import Grammar, OutputGrammar
    from reference_server.engine.radix_cache import RadixNode


@dataclass(eq=False)
class Sequence:
    """One output of a request. Output 0 also prefills the shared prompt."""

    rid: str
    output_index: int
    token_ids: list[int]  # prompt, then generated tokens
    num_prompt_tokens: int
    num_computed_tokens: int = 0  # leading tokens whose K/V is in the cache
    num_locked_tokens: int = 0  # leading tokens whose slots belong to the prefix cache (locked)
    lock_node: RadixNode | None = None  # the prefix-cache node this sequence holds a lock on
    row: int | None = None  # slot-table row while admitted
    generator: torch.Generator | None = None  # seeded with derive_seed(seed, output_index)
    finished: bool = False
    cache_version: int = 0  # the weights it was admitted under (KVManager.retire_cache)
    grammar: OutputGrammar | None = None  # a constrained output's place in its grammar

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_pending_tokens(self) -> int:
        """Tokens still to run through the model before the next token can be sampled."""
        return len(self.token_ids) - self.num_computed_tokens


@dataclass(eq=False)
class RequestGroup:
    """A request's ``num_outputs`` outputs, admitted all-or-nothing. The prompt is prefilled once
    by output 0; after its last chunk every output samples its first token from the same logits
    and shares the prompt's KV slots through the prefix cache."""

    request: SubmitRequest
    outputs: list[Sequence]
    num_cached_prompt_tokens: int = 0
    kv_reserved: int = 0  # worst-case slots still reserved for this group
    kv_suspended: int = 0  # the reservation a held group gave back, to take again on release
    token_credit: int = 0  # its outputs may produce this many tokens in all (FLOW-1); 0: no limit
    reported_cache: bool = False
    forked: bool = False  # the prompt is prefilled and every output has its first token

    @classmethod
    def create(cls, request: SubmitRequest, grammar: Grammar | None = None) -> RequestGroup:
        outputs = [
            Sequence(request.rid, i, list(request.prompt_ids), len(request.prompt_ids))
            for i in range(request.num_outputs)
        ]
        if grammar is not None:
            first = outputs[0].grammar = grammar.matcher()
            for seq in outputs[1:]:
                seq.grammar = first.fork()
        return cls(request, outputs, token_credit=request.token_credit)

    @property
    def rid(self) -> str:
        return self.request.rid

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def kv_worst_case(self) -> int:
        """Slots the group can ever need beyond its cached prefix: the uncached prompt, then
        every output's tokens (the last sampled token of an output never needs a slot)."""
        s = self.request.stopping
        return (
            self.num_prompt_tokens
            - self.num_cached_prompt_tokens
            + self.request.num_outputs * (s.max_tokens - 1)
        )

    @property
    def prefill_sequence(self) -> Sequence:
        return self.outputs[0]

    @property
    def out_of_credit(self) -> bool:
        """One more step would take the outputs past the tokens the frontend granted (FLOW-1)."""
        if not self.token_credit:
            return False
        produced = sum(s.num_output_tokens for s in self.outputs)
        return produced + len(self.active_outputs()) > self.token_credit

    def active_outputs(self) -> list[Sequence]:
        return [s for s in self.outputs if not s.finished]

    @property
    def done(self) -> bool:
        return all(s.finished for s in self.outputs)
