"""Constrained decoding (CONSTRAIN-1..4): a request's constraint compiled to a grammar over the
served vocabulary, and, per output, the grammar's state: which tokens may come next.

The one module that imports xgrammar. Only the places that meet a constraint import it (the
frontend's check, the scheduler's compile thread, tests), so a server that never sees one never
pays for the import. Compiling precomputes token masks over the whole vocabulary (milliseconds,
up to a second for a large schema), so it runs off the engine's step, once per distinct
constraint (``GrammarCompiler``); the engines only ask an ``OutputGrammar`` for the next mask
and feed it the sampled token.

The rules both engines share: every added (special) token is outside every grammar, since its
id stands for text the grammar never sees (a chat marker, or nothing once skipped); a grammar
that is complete and can go no further allows only the EOS tokens, and an output whose grammar
accepted one of them is finished (``stopping.finish_after``, ``constraint_complete``).
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass

import torch
import xgrammar as xgr

from reference_server.engine.schema_keywords import unenforced_keyword
from reference_server.ipc import Constraint
from reference_server.models.tokenizer import TokenizerBundle

DEFAULT_CACHE_ENTRIES = 256  # compiled grammars kept; a JSON-object grammar is about 60 KB
COMPILE_THREADS = 2  # xgrammar's own threads per compile: the engine's step needs the cores
MAX_ERROR_CHARS = 300
JSON_OBJECT_SCHEMA = '{"type": "object"}'  # xgrammar's builtin JSON grammar also allows arrays
# JSON as {"a": 1, "b": [2]}, no free whitespace: with it a small model may write newlines until
# max_tokens instead of closing the document
JSON_ANY_WHITESPACE = False
FIELD_OF_KIND = {
    "json_schema": "constraint.json_schema",
    "json_object": "constraint.json_object",
    "regex": "constraint.regex",
    "ebnf": "constraint.ebnf",
    "choice": "constraint.choice",
}
REFUSAL_OF_KIND = {
    "json_schema": "is not a JSON Schema this server can compile",
    "json_object": "does not compile",
    "regex": "does not parse",
    "ebnf": "does not parse",
    "choice": "does not compile",
}
# "[04:27:03] /project/cpp/regex_converter.cc:83: " and "Check failed: (x) is false: "
_XGRAMMAR_PREFIX = re.compile(r"^\[[0-9:.]+\] \S+:\d+: (?:Check failed: .*? is false: )?")
_BIT = torch.arange(32, dtype=torch.int32)


class ConstraintError(ValueError):
    """A constraint that does not compile (CONSTRAIN-2): ``field`` names it, ``reason`` says why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Grammar:
    """A compiled constraint for one vocabulary, shared read-only by every output that uses it."""

    compiled: xgr.CompiledGrammar
    vocab_size: int

    def matcher(self) -> OutputGrammar:
        return OutputGrammar(xgr.GrammarMatcher(self.compiled), self.vocab_size)


class OutputGrammar:
    """One output's place in its grammar."""

    def __init__(self, matcher: xgr.GrammarMatcher, vocab_size: int) -> None:
        self._matcher = matcher
        self._vocab_size = vocab_size
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def allowed_tokens(self) -> torch.Tensor:
        """bool [vocab_size] on the CPU: True for each token the grammar allows next."""
        self._matcher.fill_next_token_bitmask(self._bitmask)
        return unpack_bitmask(self._bitmask[0], self._vocab_size)

    def accept(self, token_id: int) -> None:
        """Advance past a sampled token, which the mask allowed."""
        if not self._matcher.accept_token(token_id):
            raise RuntimeError(f"the grammar refused token {token_id}, which its own mask allowed")

    @property
    def terminated(self) -> bool:
        """The grammar accepted its EOS token: the output is a complete text of the constraint."""
        return bool(self._matcher.is_terminated())

    def fork(self) -> OutputGrammar:
        """An independent copy in the same state (the n outputs of one prompt)."""
        return OutputGrammar(self._matcher.fork(), self._vocab_size)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """xgrammar's packed mask (int32 words, token j at bit j % 32 of word j // 32) as bools."""
    return ((bitmask.view(-1, 1) >> _BIT) & 1).view(-1)[:vocab_size].bool()


class GrammarCompiler:
    """Compiles constraints for one tokenizer and vocabulary, each distinct constraint once: a
    later or concurrent request for it gets the first one's result, a ConstraintError included.
    Thread-safe; keeps the ``max_entries`` most recently used."""

    def __init__(
        self, tokenizer: TokenizerBundle, vocab_size: int, *, max_entries: int = DEFAULT_CACHE_ENTRIES
    ) -> None:
        self.vocab_size = vocab_size
        self.max_entries = max_entries
        self.compilations = 0  # constraints compiled (not served from the cache)
        self._compiler = xgr.GrammarCompiler(
            tokenizer_info(tokenizer, vocab_size), max_threads=COMPILE_THREADS, cache_enabled=False
        )
        self._lock = threading.Lock()
        self._entries: OrderedDict[Constraint, Future[Grammar]] = OrderedDict()

    def compile(self, constraint: Constraint) -> Grammar:
        """The constraint's grammar; raises ConstraintError for one that does not compile."""
        with self._lock:
            entry = self._entries.get(constraint)
            owner = entry is None
            if entry is None:
                entry = self._entries[constraint] = Future()
                while len(self._entries) > self.max_entries:
                    self._entries.popitem(last=False)
            else:
                self._entries.move_to_end(constraint)
        if owner:
            try:
                entry.set_result(Grammar(self._compile(constraint), self.vocab_size))
            except ConstraintError as exc:
                entry.set_exception(exc)
            finally:
                with self._lock:
                    self.compilations += 1
        return entry.result()

    def cached(self, constraint: Constraint) -> Grammar | None:
        """The grammar if it is compiled already; never waits, never compiles."""
        with self._lock:
            entry = self._entries.get(constraint)
        if entry is None or not entry.done() or entry.exception() is not None:
            return None
        return entry.result()

    def _compile(self, constraint: Constraint) -> xgr.CompiledGrammar:
        field = FIELD_OF_KIND[constraint.kind]
        try:
            match constraint.kind:
                case "json_schema":
                    _check_json(constraint.definition, field)
                    return self._compiler.compile_json_schema(
                        constraint.definition, any_whitespace=JSON_ANY_WHITESPACE
                    )
                case "json_object":
                    return self._compiler.compile_json_schema(
                        JSON_OBJECT_SCHEMA, any_whitespace=JSON_ANY_WHITESPACE
                    )
                case "regex":
                    return self._compiler.compile_regex(constraint.definition)
                case "ebnf":
                    return self._compiler.compile_grammar(constraint.definition)
                case "choice":
                    return self._compiler.compile_grammar(choice_grammar(constraint.choices))
        except RuntimeError as exc:
            raise ConstraintError(
                field, f"{REFUSAL_OF_KIND[constraint.kind]}: {clean_error(str(exc))}"
            ) from None


def tokenizer_info(tokenizer: TokenizerBundle, vocab_size: int) -> xgr.TokenizerInfo:
    """The vocabulary as xgrammar reads it, ``vocab_size`` wide (the model's logits; ids the
    tokenizer lacks are padding). Every added token is given as an empty string, which xgrammar
    takes for a special token and never allows, except the EOS tokens, its stop tokens. How the
    vocabulary spells bytes (byte-level as GPT-2, byte fallback with "▁" spaces as Llama 2, or
    raw) is read from the tokenizer's pipeline as xgrammar's own Hugging Face loader reads it."""
    backend = tokenizer.tokenizer
    added = backend.get_added_tokens_decoder()
    vocab = [
        "" if token_id in added else backend.id_to_token(token_id) or ""
        for token_id in range(min(tokenizer.vocab_size, vocab_size))
    ]
    # private, but what TokenizerInfo.from_huggingface itself calls (xgrammar is pinned, setup.sh)
    metadata = xgr.TokenizerInfo._detect_metadata_from_hf(backend.to_str())
    return xgr.TokenizerInfo(
        vocab,
        vocab_type=metadata["vocab_type"],
        vocab_size=vocab_size,
        stop_token_ids=list(tokenizer.eos_token_ids),
        add_prefix_space=metadata["add_prefix_space"],
    )


def choice_grammar(choices: tuple[str, ...]) -> str:
    """An EBNF grammar whose sentences are exactly the choices."""
    return "root ::= " + " | ".join(_ebnf_literal(choice) for choice in choices)


def _ebnf_literal(text: str) -> str:
    # \uXXXX has a fixed width; \xNN would also swallow a hex digit that follows it
    escaped = "".join(
        "\\" + ch if ch in '"\\' else f"\\u{ord(ch):04x}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch
        for ch in text
    )
    return f'"{escaped}"'


def _check_json(text: str, field: str) -> None:
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise ConstraintError(field, f"is not JSON: {exc}") from None
    unenforced = unenforced_keyword(schema)
    if unenforced is not None:
        raise ConstraintError(field, f"uses {unenforced}, which this server cannot enforce")


def clean_error(message: str) -> str:
    """xgrammar's message without its C++ log prefix, the schema it echoes, or a length past
    MAX_ERROR_CHARS."""
    text = _XGRAMMAR_PREFIX.sub("", message.strip())
    text = text.split(" The JSON string is:", 1)[0].strip()
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 3] + "..."
    return text
