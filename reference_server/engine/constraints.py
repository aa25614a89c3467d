"""Constrained decoding (CONSTRAIN-1..4): a request's constraint compiled to a grammar over the
served vocabulary, and, per output, the grammar's state: which tokens may come next.

The one module that imports llguidance (a dependency-free abi3 wheel, the server extra's). Only
the places that meet a constraint import it (the frontend's check, the scheduler's compile
thread, tests), so a server that never sees one never pays for the import. Reading the
vocabulary takes about 0.4 s, once per compiler; compiling a constraint builds its lexer and
parser (about a millisecond; more for a large schema), off the engine's step, once per distinct
constraint (``GrammarCompiler``); the engines only ask an ``OutputGrammar`` for the next mask
and feed it the sampled token.

What llguidance cannot enforce it refuses, naming the keyword, which CONSTRAIN-4 asks: measured
on llguidance 1.9.1 by compiling a schema per keyword and feeding it a document that breaks the
keyword (``tests/unit/engine/test_constraints.py`` keeps the measurement), it refuses ``not``,
``if``/``then``/``else``, ``uniqueItems``, ``contains``, ``min/maxContains``,
``dependentRequired``, ``dependentSchemas``, ``dependencies``, ``propertyNames``,
``unevaluatedProperties``, ``unevaluatedItems``, ``$dynamicRef``, ``$recursiveRef``, a ``oneOf``
whose branches a document could match together, a ``$ref`` to another document, a ``format`` it
does not check and a ``pattern`` with look-around or backreferences, and it enforces the rest:
``type``, ``enum``, ``const``, ``properties``, ``required``, ``additionalProperties``,
``patternProperties``, ``min/maxProperties``, ``items``, ``prefixItems``, ``min/maxItems``,
``allOf``, ``anyOf``, a local ``$ref``, the numeric bounds, ``multipleOf``, ``min/maxLength``,
``pattern`` and the formats date, time, date-time, duration, email, hostname, ipv4, ipv6, uri and
uuid. (xgrammar 0.2.8, before it, compiled the first list without complaint and ignored it, so a
pre-check of keywords stood in front of it; llguidance needs none.) Annotations (``title``,
``description``, ``contentEncoding``, unknown keywords) are not assertions and change nothing.
An object that names its properties takes only those unless the schema says otherwise, as
xgrammar had it (``closed_schema``); the JSON is laid out as ``{"a": 1, "b": [2]}``.

The rules both engines share: every added (special) token is outside every grammar, since its
id stands for text the grammar never sees (a chat marker, or nothing once skipped); a grammar
that is complete and can go no further allows only the EOS tokens, and an output whose grammar
accepted one of them is finished (``stopping.finish_after``, ``constraint_complete``).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from llguidance import LLMatcher, LLTokenizer

from reference_server.engine.closed_schema import closed
from reference_server.engine.gbnf import GbnfError, gbnf_to_lark
from reference_server.ipc import Constraint
from reference_server.models.tokenizer import TokenizerBundle

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

log = logging.getLogger("lmrpc.engine")

DEFAULT_CACHE_ENTRIES = 256  # compiled grammars kept
MAX_ERROR_CHARS = 300
JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}
# JSON as {"a": 1, "b": [2]}, no free whitespace: with it a small model may write newlines until
# max_tokens instead of closing the document
JSON_LAYOUT: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
# llguidance reads its own options from a schema's top-level "x-guidance" (among them "lenient",
# which would let unenforceable keywords through); to JSON Schema it is an annotation, so dropped
LLGUIDANCE_OPTIONS_KEY = "x-guidance"
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
CANNOT_ENFORCE = "which this server cannot enforce"
# llguidance's refusals of a schema it cannot enforce, each said as the keyword it names (CONSTRAIN-4)
_UNIMPLEMENTED = re.compile(r"Unimplemented keys: \[(.*)\]")
_ONE_OF = re.compile(r"oneOf constraints are not supported")
_FORMAT = re.compile(r"Unknown format: (.*)")
_REMOTE_REF = re.compile(r"Resource '(.*?)' is not present in a registry")
_POSITION = re.compile(r"^(?:at )?\d+\(\d+\): ")  # "at 1(8): ": a place in llguidance's own grammar text
_DETAIL = re.compile(r"^error: (.+)$", re.M)  # the regex parser's one line under its drawing of the place


class ConstraintError(ValueError):
    """A constraint that does not compile (CONSTRAIN-2): ``field`` names it, ``reason`` says why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Grammar:
    """A compiled constraint for one vocabulary, shared read-only by every output that uses it:
    a matcher at the grammar's start, which each output copies. ``definition``: the grammar as
    llguidance reads it (what a test or bench builds a matcher of its own from)."""

    start: LLMatcher
    definition: str
    vocab_size: int
    eos_token_ids: frozenset[int]

    def matcher(self) -> OutputGrammar:
        return OutputGrammar(self.start.deep_copy(), self.vocab_size, self.eos_token_ids)


class OutputGrammar:
    """One output's place in its grammar."""

    def __init__(self, matcher: LLMatcher, vocab_size: int, eos_token_ids: frozenset[int]) -> None:
        self._matcher = matcher
        self._vocab_size = vocab_size
        self._eos_token_ids = eos_token_ids
        self._bitmask = np.zeros((vocab_size + 31) // 32, dtype=np.uint32)
        self._terminated = False
        self._failed = False

    def allowed_tokens(self) -> torch.Tensor:
        """bool [vocab_size] on the CPU: True for each token the grammar allows next."""
        self._matcher.unsafe_compute_mask_ptr(self._bitmask.ctypes.data, self._bitmask.nbytes)
        if self._matcher.is_error() and not self._failed:
            # past llguidance's bounds on one mask's work: the mask allows only EOS, so the output
            # ends there instead of the engine's step raising for every request in it
            self._failed = True
            log.error("a constrained output ends early: %s", clean_error(self._matcher.get_error()))
        return unpack_bitmask(self._bitmask, self._vocab_size)

    def accept(self, token_id: int) -> None:
        """Advance past a sampled token, which the mask allowed."""
        if self._failed and token_id in self._eos_token_ids:
            self._terminated = True  # the EOS its failed mask allowed: the output ends here
            return
        if not self._matcher.consume_token(token_id):
            raise RuntimeError(
                f"the grammar refused token {token_id}, which its own mask allowed: "
                f"{clean_error(self._matcher.get_error())}"
            )
        self._terminated = token_id in self._eos_token_ids

    @property
    def terminated(self) -> bool:
        """The grammar accepted an EOS token: the output is a complete text of the constraint.
        (llguidance's own is_stopped() is already true before, where only EOS may follow.)"""
        return self._terminated

    def fork(self) -> OutputGrammar:
        """An independent copy in the same state (the n outputs of one prompt)."""
        copy = OutputGrammar(self._matcher.deep_copy(), self._vocab_size, self._eos_token_ids)
        copy._terminated, copy._failed = self._terminated, self._failed
        return copy


def unpack_bitmask(bitmask: np.ndarray, vocab_size: int) -> torch.Tensor:
    """llguidance's packed mask (uint32 words, token j at bit j % 32 of word j // 32) as bools."""
    little = bitmask.astype("<u4", copy=False)  # the words' own bytes, on a little-endian host
    bits = np.unpackbits(little.view(np.uint8), count=vocab_size, bitorder="little")
    return torch.from_numpy(bits.view(np.bool_))


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
        self._tokenizer = grammar_tokenizer(tokenizer, vocab_size)
        self._eos_token_ids = frozenset(tokenizer.eos_token_ids)
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
                entry.set_result(self._compile(constraint))
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

    def _compile(self, constraint: Constraint) -> Grammar:
        for definition in grammar_definitions(constraint):
            start = LLMatcher(self._tokenizer, definition, log_level=0)  # releases the GIL while it builds
            if not start.is_error():
                return Grammar(start, definition, self.vocab_size, self._eos_token_ids)
        raise ConstraintError(FIELD_OF_KIND[constraint.kind], refusal(constraint.kind, start.get_error()))


def grammar_tokenizer(tokenizer: TokenizerBundle, vocab_size: int) -> LLTokenizer:
    """The vocabulary as llguidance reads it, ``vocab_size`` wide (the model's logits; ids past
    the tokenizer's are padding, as special tokens). llguidance reads the tokenizer's JSON, and
    from its pipeline how the vocabulary spells bytes (byte-level as GPT-2, byte fallback with
    "▁" spaces as Llama 2, or raw); it takes every added token, special or not, for a special
    token, which no grammar allows, and the EOS tokens for the ones a complete text ends with."""
    return LLTokenizer(
        tokenizer.tokenizer.to_str(), n_vocab=vocab_size, eos_token=list(tokenizer.eos_token_ids)
    )


def grammar_definitions(constraint: Constraint) -> tuple[str, ...]:
    """The constraint as llguidance grammars, not yet compiled, the one to serve first: an EBNF
    with its runs of text fused into lexemes, then (should llguidance's bounds refuse the
    fused regexes) the same a character at a time. Raises ConstraintError for one that is not
    even that (a schema that is not JSON, an EBNF that does not parse)."""
    field = FIELD_OF_KIND[constraint.kind]
    match constraint.kind:
        case "json_schema":
            schema = _schema(constraint.definition, field)
            try:
                return (LLMatcher.grammar_from_json_schema(schema, overrides=JSON_LAYOUT),)
            except ValueError as exc:
                raise ConstraintError(
                    field, f"{REFUSAL_OF_KIND['json_schema']}: {clean_error(str(exc))}"
                ) from None
        case "json_object":
            return (LLMatcher.grammar_from_json_schema(JSON_OBJECT_SCHEMA, overrides=JSON_LAYOUT),)
        case "regex":
            return (LLMatcher.grammar_from_regex(constraint.definition),)
        case "ebnf":
            try:
                fused, plain = (gbnf_to_lark(constraint.definition, fuse=f) for f in (True, False))
            except GbnfError as exc:
                raise ConstraintError(field, f"{REFUSAL_OF_KIND['ebnf']}: {exc}") from None
            return tuple(dict.fromkeys(LLMatcher.grammar_from_lark(g) for g in (fused, plain)))
        case "choice":
            return (LLMatcher.grammar_from_lark(choice_grammar(constraint.choices)),)
    raise AssertionError(constraint.kind)


def choice_grammar(choices: tuple[str, ...]) -> str:
    """A Lark grammar whose sentences are exactly the choices: each one string, its characters
    JSON-escaped, so none of them means anything to the grammar."""
    return "start: " + " | ".join(json.dumps(choice) for choice in choices)


def _schema(text: str, field: str) -> dict[str, Any]:
    try:
        schema = json.loads(text, parse_constant=_not_json)
    except ValueError as exc:
        raise ConstraintError(field, f"is not JSON: {exc}") from None
    if schema is True:
        return {}
    if schema is False:
        raise ConstraintError(field, "is false: no document is valid against it")
    if not isinstance(schema, dict):
        raise ConstraintError(
            field,
            f"{REFUSAL_OF_KIND['json_schema']}: a schema is an object or a boolean, not {type(schema).__name__}",
        )
    schema.pop(LLGUIDANCE_OPTIONS_KEY, None)
    return closed(schema)


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON value")


def refusal(kind: str, message: str) -> str:
    """Why llguidance refused to compile a constraint, as the client reads it: a schema keyword
    it cannot enforce as that keyword (CONSTRAIN-4), anything else cleaned (``clean_error``)."""
    text = clean_error(message)
    if kind == "json_schema":
        if found := _UNIMPLEMENTED.fullmatch(text):
            keywords = ", ".join(repr(k) for k in json.loads(f"[{found.group(1)}]"))
            return f"uses {keywords}, {CANNOT_ENFORCE}"
        if _ONE_OF.match(text):
            return f"uses 'oneOf' with branches one document could match together, {CANNOT_ENFORCE}"
        if found := _FORMAT.fullmatch(text):
            return f"uses 'format': {found.group(1)!r}, {CANNOT_ENFORCE}"
        if found := _REMOTE_REF.match(text):
            return f"uses '$ref' to another document ({found.group(1)!r}), {CANNOT_ENFORCE}"
        if "regex parse error" in message:
            return f"{REFUSAL_OF_KIND[kind]}: a pattern does not compile: {text}"
    return f"{REFUSAL_OF_KIND[kind]}: {text}"


def clean_error(message: str) -> str:
    """llguidance's message as one line: the regex parser's line that says what is wrong rather
    than its drawing of where, no place in llguidance's own grammar text, no parser state, at
    most MAX_ERROR_CHARS."""
    detail = _DETAIL.search(message)
    text = detail.group(1) if detail is not None else message.strip().split("\n", 1)[0]
    text = _POSITION.sub("", text.strip())
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 3] + "..."
    return text
