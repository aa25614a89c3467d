"""A deterministic engine with no model weights, for fast tests and frontend benchmarks.

Each output draws tokens from a made-up distribution over the real tokenizer's vocabulary:

- the most likely token at step k is ``prompt[k % len(prompt)]``, so greedy decoding echoes the
  prompt (a prompt with an EOS token in it stops there; a CJK or emoji prompt comes back split
  across byte-level tokens, exactly as a model would produce it);
- a few other candidates, chosen by hashing (prompt, k), and the EOS token get lower logits;
- every other token gets a tiny, equal logit, so logprobs and ranks are always defined;
- a constrained output samples only what its grammar allows (``engine/constraints.py``, as the
  model engine does): the candidates above that it allows, and a few more tokens it allows, chosen
  by hashing, with logits below EOS, so an output whose echo leaves its grammar still goes on, and
  ends as soon as its grammar is complete and no echoed or hashed candidate continues it.

Sampling applies the real rules (penalties, temperature, top-k, top-p, min-p) with a per-output
``random.Random(derive_seed(seed, i))``, so seeded outputs are reproducible whatever else runs.
It goes through the same scheduler and detokenizer path as the real model. It also simulates
a prefix cache (reported cached tokens, and KV-cache events for every full block of an admitted
prompt) and KV accounting (admission, GetLoad).
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from reference_server.engine.base import constrained_decoding_available
from reference_server.engine.fake_blocks import FakeBlockCache
from reference_server.engine.fake_sampling import Candidate, apply_penalties, sample_candidates
from reference_server.engine.kv_events import KV_EVENT_BLOCK_SIZE
from reference_server.engine.seeds import derive_seed
from reference_server.engine.stopping import finish_after, suppressed_ids
from reference_server.ipc import (
    EngineInfo,
    EngineLoad,
    Finish,
    KvCacheEvent,
    SequenceOutput,
    SubmitRequest,
    TokenLogprob,
)
from reference_server.models.source import ModelSource

if TYPE_CHECKING:
    from reference_server.engine.constraints import Grammar, OutputGrammar

ECHO_LOGIT = 4.0
OTHER_LOGIT_STEP = 0.5
EOS_LOGIT = 1.0
ALLOWED_LOGIT = EOS_LOGIT - OTHER_LOGIT_STEP  # the first of the tokens a grammar adds
BACKGROUND_LOGIT = -10.0
NUM_OTHER_CANDIDATES = 7
EMBEDDING_DIMENSIONS = 384
EMBEDDING_MAX_TOKENS = 256


@dataclass(frozen=True, slots=True)
class FakeEngineConfig:
    model_id: str
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    sampleable_token_ids: tuple[int, ...]  # non-special tokens that decode to whole characters
    max_context_tokens: int = 8192
    kv_tokens: int = 262144
    max_running_sequences: int = 256
    token_delay_s: float = 0.0  # sleep per engine step, to make streams take time
    kv_event_block_size: int = KV_EVENT_BLOCK_SIZE  # 0: no KV-cache events

    def __post_init__(self) -> None:
        if self.token_delay_s < 0:
            raise ValueError(f"token_delay_s={self.token_delay_s} must be >= 0")
        if not self.sampleable_token_ids:
            raise ValueError("sampleable_token_ids must not be empty")
        if self.kv_tokens < self.max_context_tokens:
            raise ValueError(f"kv_tokens={self.kv_tokens} must be >= max_context_tokens")


@dataclass
class _Output:
    index: int
    rng: random.Random
    token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    grammar: OutputGrammar | None = None


@dataclass
class _Group:
    request: SubmitRequest
    prompt_hash: int
    outputs: list[_Output]
    cached_prompt_tokens: int = 0
    reported_cache: bool = False
    token_credit: int = 0  # tokens its outputs may produce in all (FLOW-1); 0: no limit

    @property
    def out_of_credit(self) -> bool:
        if not self.token_credit:
            return False
        produced = sum(len(o.token_ids) for o in self.outputs)
        return produced + sum(not o.finished for o in self.outputs) > self.token_credit

    @property
    def kv_reservation(self) -> int:
        return len(self.request.prompt_ids) + self.request.num_outputs * self.request.stopping.max_tokens

    @property
    def kv_used(self) -> int:
        return len(self.request.prompt_ids) + sum(len(o.token_ids) for o in self.outputs)


class FakeEngine:
    def __init__(self, config: FakeEngineConfig, tokenize: Callable[[str], list[int]] | None = None) -> None:
        self.config = config
        self._tokenize = tokenize
        self._waiting: OrderedDict[str, _Group] = OrderedDict()
        self._running: OrderedDict[str, _Group] = OrderedDict()
        self._held: set[str] = set()  # running groups out of token credit: their client is not reading
        self._stuck = False  # the last step could neither run nor admit anything
        self._prefixes: OrderedDict[int, None] = OrderedDict()  # prefix hash -> (LRU order)
        self._blocks: FakeBlockCache | None = None
        if config.kv_event_block_size:
            b = config.kv_event_block_size
            self._blocks = FakeBlockCache(config.kv_tokens // b, b)
        self._token_vectors: dict[int, list[float]] = {}
        self._sampleable = torch.zeros(config.vocab_size, dtype=torch.bool)
        self._sampleable[list(config.sampleable_token_ids)] = True

    # ── Engine protocol ─────────────────────────────────────────────────────────────────────

    def info(self) -> EngineInfo:
        c = self.config
        return EngineInfo(
            model_id=c.model_id,
            architecture="fake",
            vocab_size=c.vocab_size,
            max_context_tokens=c.max_context_tokens,
            eos_token_ids=list(c.eos_token_ids),
            bos_token_id=c.bos_token_id,
            kv_tokens_total=c.kv_tokens,
            max_running_sequences=c.max_running_sequences,
            prefix_cache=True,
            deterministic_greedy=True,
            embedding_model_id="fake-embedding" if self._tokenize else None,
            embedding_dimensions=EMBEDDING_DIMENSIONS if self._tokenize else 0,
            embedding_max_tokens=EMBEDDING_MAX_TOKENS if self._tokenize else 0,
            constrained_decoding=constrained_decoding_available(c.eos_token_ids),
        )

    def add_request(self, request: SubmitRequest, grammar: Grammar | None = None) -> None:
        outputs = [
            _Output(i, random.Random(derive_seed(request.sampling.seed, i)))
            for i in range(request.num_outputs)
        ]
        if grammar is not None:
            first = outputs[0].grammar = grammar.matcher()
            for out in outputs[1:]:
                out.grammar = first.fork()
        self._waiting[request.rid] = _Group(
            request, _hash_ids(request.prompt_ids), outputs, token_credit=request.token_credit
        )
        self._stuck = False

    def abort_request(self, rid: str) -> list[SequenceOutput]:
        self._held.discard(rid)
        self._stuck = False
        group = self._waiting.pop(rid, None) or self._running.pop(rid, None)
        if group is None:
            return []
        return [
            SequenceOutput(rid, out.index, [], finish=Finish("aborted"))
            for out in group.outputs
            if not out.finished
        ]

    def finish_output(self, rid: str, output_index: int) -> None:
        self._stuck = False
        group = self._running.get(rid)
        if group is not None:
            group.outputs[output_index].finished = True
            self._retire_if_done(group)

    def grant_tokens(self, rid: str, credit: int) -> None:
        self._stuck = False
        group = self._running.get(rid) or self._waiting.get(rid)
        if group is not None and credit > group.token_credit:
            group.token_credit = credit

    def has_work(self) -> bool:
        runnable = bool(self._waiting) or any(not g.out_of_credit for g in self._running.values())
        return runnable and not self._stuck

    def step(self) -> list[SequenceOutput]:
        self._held = {rid for rid, g in self._running.items() if g.out_of_credit}
        self._admit()
        active = [g for rid, g in self._running.items() if rid not in self._held]
        if not active:
            self._stuck = True
            return []
        if self.config.token_delay_s:
            time.sleep(self.config.token_delay_s)
        results: list[SequenceOutput] = []
        for group in active:
            for out in group.outputs:
                if not out.finished:
                    results.append(self._decode_one(group, out))
            self._retire_if_done(group)
        return results

    def load(self, *, paused: bool) -> EngineLoad:
        in_use = sum(
            len(g.request.prompt_ids) + sum(len(o.token_ids) for o in g.outputs)
            for g in self._running.values()
        )
        return EngineLoad(
            running_sequences=sum(sum(not o.finished for o in g.outputs) for g in self._running.values()),
            waiting_sequences=sum(g.request.num_outputs for g in self._waiting.values()),
            kv_tokens_in_use=in_use,
            kv_tokens_total=self.config.kv_tokens,
            kv_tokens_cached=min(len(self._prefixes), self.config.kv_tokens - in_use),
            paused=paused,
            requests_in_engine=len(self._waiting) + len(self._running),
        )

    def flush_cache(self) -> int:
        self._stuck = False
        released = len(self._prefixes)
        self._prefixes.clear()
        if self._blocks is not None:
            self._blocks.clear()
        return released

    def drain_kv_events(self) -> list[KvCacheEvent]:
        return self._blocks.drain_events() if self._blocks is not None else []

    def embed(self, texts: list[str]) -> tuple[list[list[float]], list[int]]:
        if self._tokenize is None:
            raise ValueError("this engine has no embedding model")
        vectors, counts = [], []
        for i, text in enumerate(texts):
            ids = self._tokenize(text)
            if len(ids) > EMBEDDING_MAX_TOKENS:
                raise ValueError(
                    f"texts[{i}] has {len(ids)} tokens; the embedding model accepts at most {EMBEDDING_MAX_TOKENS}"
                )
            total = [0.0] * EMBEDDING_DIMENSIONS
            for token_id in ids or [0]:
                for d, x in enumerate(self._token_vector(token_id)):
                    total[d] += x
            norm = math.sqrt(sum(x * x for x in total)) or 1.0
            vectors.append([x / norm for x in total])
            counts.append(len(ids))
        return vectors, counts

    def update_weights(self, source: ModelSource) -> str:
        """The fake engine has no weights: a loadable path is accepted and changes nothing."""
        return f"The fake engine has no weights: {source.path} was accepted without effect."

    # ── internals ───────────────────────────────────────────────────────────────────────────

    def _admit(self) -> None:
        # held groups (FLOW-1) keep the KV they filled but give their batch slots and the rest of
        # their reservation to others
        reserved = sum(
            g.kv_used if rid in self._held else g.kv_reservation for rid, g in self._running.items()
        )
        running = sum(g.request.num_outputs for rid, g in self._running.items() if rid not in self._held)
        held = sum(g.request.num_outputs for rid, g in self._running.items() if rid in self._held)
        for rid, group in list(self._waiting.items()):
            n = group.request.num_outputs
            if reserved + group.kv_reservation > self.config.kv_tokens:
                break  # first come, first served: later groups wait too
            if (
                running + n > self.config.max_running_sequences
                or running + held + n > 2 * self.config.max_running_sequences
            ):
                break
            del self._waiting[rid]
            group.cached_prompt_tokens = self._match_and_insert_prefix(group.request.prompt_ids)
            if self._blocks is not None:
                self._blocks.insert(group.request.prompt_ids)
            self._running[rid] = group
            reserved += group.kv_reservation
            running += n

    def _match_and_insert_prefix(self, prompt: list[int]) -> int:
        cached = 0
        h = 0
        for length, token_id in enumerate(prompt[:-1], start=1):  # the last token is always computed
            h = _extend_hash(h, token_id)
            if h in self._prefixes:
                cached = length
                self._prefixes.move_to_end(h)
            else:
                self._prefixes[h] = None
        while len(self._prefixes) > self.config.kv_tokens:
            self._prefixes.popitem(last=False)
        return cached

    def _decode_one(self, group: _Group, out: _Output) -> SequenceOutput:
        request = group.request
        candidates = self._candidates(group, out)
        permitted = candidates
        if out.grammar is not None:
            grammar_allows = out.grammar.allowed_tokens()
            candidates += self._grammar_candidates(group, out, grammar_allows, candidates)
            permitted = [c for c in candidates if grammar_allows[c.token_id]]
        suppressed = suppressed_ids(request.stopping, self.config.eos_token_ids, len(out.token_ids))
        allowed = [c for c in permitted if c.token_id not in suppressed]
        if not allowed and out.grammar is not None:
            allowed = permitted  # the grammar can only end here: it wins over min_tokens (CONSTRAIN-1)
        processed = apply_penalties(allowed, request.prompt_ids, out.token_ids, request.sampling)
        token_id = sample_candidates(processed, request.sampling, out.rng)
        out.token_ids.append(token_id)
        if out.grammar is not None:
            out.grammar.accept(token_id)
        logprobs = None
        if request.top_logprobs is not None:
            logprobs = [self._logprob(candidates, token_id, request.top_logprobs)]
        cached = None
        if not group.reported_cache:
            group.reported_cache = True
            cached = group.cached_prompt_tokens
        return SequenceOutput(
            request.rid, out.index, [token_id], logprobs, self._finish(request, out), cached
        )

    def _candidates(self, group: _Group, out: _Output) -> list[Candidate]:
        prompt = group.request.prompt_ids
        k = len(out.token_ids)
        echo = prompt[k % len(prompt)]
        result = [Candidate(echo, ECHO_LOGIT)]
        seen = {echo}
        pool = self.config.sampleable_token_ids
        for j in range(1, NUM_OTHER_CANDIDATES + 1):
            token_id = pool[_mix(group.prompt_hash, k, j) % len(pool)]
            if token_id not in seen:
                seen.add(token_id)
                result.append(Candidate(token_id, ECHO_LOGIT - OTHER_LOGIT_STEP * j))
        for eos in self.config.eos_token_ids:
            if eos not in seen:
                seen.add(eos)
                result.append(Candidate(eos, EOS_LOGIT))
        return result

    def _grammar_candidates(
        self, group: _Group, out: _Output, grammar_allows: torch.Tensor, present: list[Candidate]
    ) -> list[Candidate]:
        """Tokens the grammar allows, chosen by hashing (whole characters where it allows any)."""
        usable = grammar_allows & self._sampleable
        pool = (usable if bool(usable.any()) else grammar_allows).nonzero().flatten().tolist()
        seen = {c.token_id for c in present}
        result = []
        for j in range(NUM_OTHER_CANDIDATES):
            token_id = pool[_mix(group.prompt_hash, len(out.token_ids), NUM_OTHER_CANDIDATES + j) % len(pool)]
            if token_id not in seen:
                seen.add(token_id)
                result.append(Candidate(token_id, ALLOWED_LOGIT - OTHER_LOGIT_STEP * j))
        return result

    def _logprob(self, candidates: list[Candidate], token_id: int, top_n: int) -> TokenLogprob:
        background = self.config.vocab_size - len(candidates)
        log_z = _logsumexp([c.logit for c in candidates] + [BACKGROUND_LOGIT + math.log(max(background, 1))])
        ranked = sorted(candidates, key=lambda c: (-c.logit, c.token_id))
        top = [(c.token_id, c.logit - log_z) for c in ranked[:top_n]]
        filler = (t for t in range(self.config.vocab_size) if all(t != c.token_id for c in candidates))
        while len(top) < top_n:
            top.append((next(filler), BACKGROUND_LOGIT - log_z))
        rank = next(i for i, c in enumerate(ranked, start=1) if c.token_id == token_id)
        logit = next(c.logit for c in candidates if c.token_id == token_id)
        return TokenLogprob(token_id, logit - log_z, rank, top)

    def _finish(self, request: SubmitRequest, out: _Output) -> Finish | None:
        finish = finish_after(
            request.stopping,
            self.config.eos_token_ids,
            out.token_ids[-1],
            num_output_tokens=len(out.token_ids),
            num_tokens=len(request.prompt_ids) + len(out.token_ids),
            max_context_tokens=self.config.max_context_tokens,
            constraint_complete=out.grammar is not None and out.grammar.terminated,
        )
        out.finished = finish is not None
        return finish

    def _retire_if_done(self, group: _Group) -> None:
        if all(o.finished for o in group.outputs):
            self._running.pop(group.request.rid, None)
            self._held.discard(group.request.rid)

    def _token_vector(self, token_id: int) -> list[float]:
        vector = self._token_vectors.get(token_id)
        if vector is None:
            rng = random.Random(token_id)
            vector = self._token_vectors[token_id] = [
                rng.gauss(0.0, 1.0) for _ in range(EMBEDDING_DIMENSIONS)
            ]
        return vector


def _hash_ids(ids: list[int]) -> int:
    digest = hashlib.blake2b(b",".join(str(i).encode() for i in ids), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _extend_hash(h: int, token_id: int) -> int:
    return ((h * 1_000_003) ^ (token_id + 0x9E3779B1)) & 0xFFFFFFFFFFFFFFFF


def _mix(a: int, b: int, c: int) -> int:
    x = (a ^ (b * 0x9E3779B97F4A7C15) ^ (c * 0xC2B2AE3D27D4EB4F)) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 29
    x = (x * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 32)


def _logsumexp(values: list[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))
