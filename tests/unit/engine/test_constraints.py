"""engine/constraints.py: the vocabulary as llguidance reads it, each kind of constraint, which
JSON Schema keywords are enforced and which refused (CONSTRAIN-4), the errors a client sees, the
compile cache, and one output's grammar state.

Texts are judged by an llguidance matcher of the test's own, built from the grammar's
definition, fed the text's tokens (llguidance matches bytes, so any tokenization of a text is
judged alike), and where one exists by an independent recognizer (jsonschema)."""

from __future__ import annotations

import dataclasses
import json
import threading
from typing import Any

import jsonschema
import numpy as np
import pytest
import torch
from llguidance import LLMatcher, LLParserLimits, LLTokenizer
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

from reference_server.engine.constraints import (
    ConstraintError,
    Grammar,
    GrammarCompiler,
    OutputGrammar,
    choice_grammar,
    clean_error,
    grammar_tokenizer,
    unpack_bitmask,
)
from reference_server.engine.gbnf import gbnf_to_lark
from reference_server.ipc import Constraint
from reference_server.models.tokenizer import TokenizerBundle, _bundle

PERSON = json.dumps(
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
)


@pytest.fixture(scope="module")
def compiler(tokenizer: TokenizerBundle) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, tokenizer.vocab_size)


@pytest.fixture(scope="module")
def own_tokenizer(tokenizer: TokenizerBundle) -> LLTokenizer:
    """The test's own llguidance tokenizer, for matchers that are not the compiler's."""
    return LLTokenizer(tokenizer.tokenizer.to_str(), n_vocab=tokenizer.vocab_size, eos_token=[2])


def fed(own: LLTokenizer, bundle: TokenizerBundle, grammar: Grammar, text: str) -> LLMatcher | None:
    """A matcher of the test's own that took ``text``, or None if the grammar refused it."""
    matcher = LLMatcher(own, grammar.definition, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    ok = matcher.consume_tokens(bundle.encode(text, parse_special_tokens=False))
    return matcher if ok else None


def accepts(own: LLTokenizer, bundle: TokenizerBundle, grammar: Grammar, text: str) -> bool:
    """Whether ``text`` is a whole sentence of the grammar."""
    matcher = fed(own, bundle, grammar, text)
    return matcher is not None and matcher.is_accepting()


def test_added_tokens_are_outside_every_grammar_and_eos_ends_it(tokenizer: TokenizerBundle) -> None:
    padded = tokenizer.vocab_size + 64  # a model's padded logits
    vocab = grammar_tokenizer(tokenizer, padded)
    assert vocab.vocab_size == padded and vocab.eos_tokens == list(tokenizer.eos_token_ids)
    added = set(tokenizer.tokenizer.get_added_tokens_decoder())
    assert all(vocab.is_special_token(t) for t in added | set(range(tokenizer.vocab_size, padded)))
    # inside a JSON string any text goes, but never a chat marker's id nor padding
    grammar = GrammarCompiler(tokenizer, padded).compile(Constraint("json_object"))
    matcher = grammar.matcher()
    for token_id in tokenizer.encode('{"a": "x'):
        matcher.accept(token_id)
    allowed = matcher.allowed_tokens()
    assert allowed.shape == (padded,) and allowed.dtype == torch.bool
    assert not allowed[sorted(added)].any() and not allowed[tokenizer.vocab_size :].any()
    assert allowed[tokenizer.encode("hello")[0]]


def test_an_added_token_that_is_not_special_is_outside_too(tokenizer: TokenizerBundle) -> None:
    backend = Tokenizer.from_str(tokenizer.tokenizer.to_str())
    backend.add_tokens([AddedToken("<tool>", special=False)])
    tool = backend.token_to_id("<tool>")
    bundle = dataclasses.replace(tokenizer, tokenizer=backend, vocab_size=backend.get_vocab_size())
    grammar = GrammarCompiler(bundle, bundle.vocab_size).compile(Constraint("regex", "<tool>|x"))
    allowed = grammar.matcher().allowed_tokens()
    assert not allowed[tool] and allowed[tokenizer.encode("<")[0]]


def test_every_eos_token_may_end_a_complete_text(tokenizer: TokenizerBundle) -> None:
    other = tokenizer.tokenizer.token_to_id("<|endoftext|>")
    assert other is not None
    bundle = dataclasses.replace(tokenizer, eos_token_ids=(*tokenizer.eos_token_ids, other))
    grammar = GrammarCompiler(bundle, bundle.vocab_size).compile(Constraint("regex", "[0-9]{2}"))
    for eos in bundle.eos_token_ids:
        matcher = grammar.matcher()
        for token_id in tokenizer.encode("42"):
            matcher.accept(token_id)
        assert matcher.allowed_tokens().nonzero().flatten().tolist() == sorted(bundle.eos_token_ids)
        matcher.accept(eos)
        assert matcher.terminated


def llama2_style_tokenizer() -> TokenizerBundle:
    """A byte-fallback BPE with "▁" for spaces and a prefix space, as Llama 2's tokenizer.json."""
    pieces = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), "▁", "h", "e", "l", "o"]
    pieces += "w r d ▁h he ll ▁he ▁hell ▁hello ▁w ▁wor ▁worl ▁world or".split()
    vocab = {piece: i for i, piece in enumerate(pieces)}
    merges = [("▁", "h"), ("h", "e"), ("l", "l"), ("▁h", "e"), ("▁he", "ll"), ("▁hell", "o")]
    merges += [("▁", "w"), ("o", "r"), ("▁w", "or"), ("▁wor", "l"), ("▁worl", "d")]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, fuse_unk=True))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=False)
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in ("<unk>", "<s>", "</s>")])
    meta = {"vocab_size": len(pieces), "bos_token_id": 1, "eos_token_ids": [2], "chat_template": None}
    return _bundle(tokenizer, meta)


def test_a_byte_fallback_vocabulary_maps_its_spaces_and_bytes() -> None:
    """A "▁" is a space and "<0x21>" the byte "!"; a text's first token is read as it is spelt
    (a "▁hello" is " hello"), so a grammar that starts "hello" begins without "▁"."""
    bundle = llama2_style_tokenizer()
    vocab = grammar_tokenizer(bundle, bundle.vocab_size)
    spelt = {
        piece: vocab.decode_bytes([bundle.tokenizer.token_to_id(piece) or 0])
        for piece in ("▁world", "<0x21>")
    }
    assert spelt == {"▁world": b" world", "<0x21>": b"!"}
    grammar = GrammarCompiler(bundle, bundle.vocab_size).compile(Constraint("regex", "hello world!"))
    matcher, ids = grammar.matcher(), []
    while not matcher.terminated:  # the longest token the grammar allows, as a greedy model might
        allowed = matcher.allowed_tokens().nonzero().flatten().tolist()
        token_id = max(allowed, key=lambda t: len(vocab.decode_bytes([t])))
        matcher.accept(token_id)
        ids.append(token_id)
    assert ids[-1] == 2 and bundle.tokenizer.id_to_token(ids[-2]) == "<0x21>"  # "!" is a byte token
    assert "▁world" in [bundle.tokenizer.id_to_token(t) for t in ids]
    assert bundle.decode(ids) == "hello world!"


def test_each_kind_accepts_its_texts_and_nothing_else(
    compiler: GrammarCompiler, own_tokenizer: LLTokenizer, tokenizer: TokenizerBundle
) -> None:
    cases = {
        Constraint("json_schema", PERSON): (['{"name": "Ann", "age": 3}'], ['{"name": "Ann"}', "[1]"]),
        Constraint("json_object"): (['{"a": [1, {"b": null}]}', "{}"], ["[1]", '"x"', "3"]),
        Constraint("regex", r"[a-z]+@[a-z]+\.com"): (["ann@mail.com"], ["ann@mail.org", "@mail.com"]),
        Constraint("ebnf", 'root ::= "(" num ")"\nnum ::= [0-9]+'): (["(42)"], ["()", "(4a)"]),
        Constraint("choice", choices=("yes", "no", "maybe not")): (["yes", "maybe not"], ["ye", "Yes"]),
    }
    for constraint, (good, bad) in cases.items():
        grammar = compiler.compile(constraint)
        assert all(accepts(own_tokenizer, tokenizer, grammar, text) for text in good), constraint
        assert not any(accepts(own_tokenizer, tokenizer, grammar, text) for text in bad), constraint
    person = compiler.compile(Constraint("json_schema", PERSON))
    assert fed(own_tokenizer, tokenizer, person, '{"name": "An') is not None  # a prefix


def test_json_is_laid_out_with_one_space_after_each_separator(
    compiler: GrammarCompiler, own_tokenizer: LLTokenizer, tokenizer: TokenizerBundle
) -> None:
    """{"a": 1, "b": [2]}, no free whitespace: with it a small model may write newlines until
    max_tokens instead of closing the document."""
    grammar = compiler.compile(Constraint("json_object"))
    assert accepts(own_tokenizer, tokenizer, grammar, '{"a": 1, "b": [2, 3]}')
    for text in ('{"a":1}', '{ "a": 1}', '{"a": 1,"b": 2}', '{"a": 1}\n', '{\n"a": 1}'):
        assert not accepts(own_tokenizer, tokenizer, grammar, text), text


def test_the_ebnf_is_read_as_written_not_lexed_greedily(
    compiler: GrammarCompiler, own_tokenizer: LLTokenizer, tokenizer: TokenizerBundle
) -> None:
    """Sentences that a greedy lexer would lose (llguidance.gbnf_to_lark's conversion rejects
    every one of these)."""
    cases = {
        'root ::= num "0"\nnum ::= [0-9]+': ["10", "100"],
        'root ::= a b\na ::= "x"*\nb ::= "x"': ["x", "xx", "xxx"],
        'root ::= "ab" | "a" "bd"': ["ab", "abd"],
    }
    for ebnf, texts in cases.items():
        grammar = compiler.compile(Constraint("ebnf", ebnf))
        assert all(accepts(own_tokenizer, tokenizer, grammar, text) for text in texts), ebnf


def test_choices_are_literals_whatever_their_characters(
    compiler: GrammarCompiler, own_tokenizer: LLTokenizer, tokenizer: TokenizerBundle
) -> None:
    choices: tuple[str, ...] = (
        'say "hi"',
        "back\\slash",
        "new\nline",
        "\x01c",
        "\x7f",
        "ünï 😀",
        "[a] (b) | c*",
        "a",
        "ab",
    )
    choices += ("/x/", "%ignore", "\u2028", "ab" * 40)
    grammar = compiler.compile(Constraint("choice", choices=choices))
    assert all(accepts(own_tokenizer, tokenizer, grammar, choice) for choice in choices)
    for text in ("say hi", "\x1c", "backslash", "[a]", "x", "abab"):
        assert not accepts(own_tokenizer, tokenizer, grammar, text), text
    assert choice_grammar(("a\x01c", "ü")) == 'start: "a\\u0001c" | "\\u00fc"'


INT = {"type": "integer"}
# keyword: (a schema that uses it, a document that breaks it, one that keeps it), each compiled
# and judged: what llguidance 1.9.1 enforces, and every keyword it cannot enforce is refused
ENFORCED: dict[str, tuple[Any, str, str]] = {
    "type": (INT, '"x"', "1"),
    "type list": ({"type": ["integer", "null"]}, '"x"', "null"),
    "enum": ({"enum": [1, "a"]}, "2", '"a"'),
    "const": ({"const": 3}, "4", "3"),
    "properties": ({"type": "object", "properties": {"a": INT}}, '{"a": "x"}', '{"a": 1}'),
    "required": ({"type": "object", "properties": {"a": INT}, "required": ["a"]}, "{}", '{"a": 1}'),
    "additionalProperties": (
        {"type": "object", "properties": {"a": INT}, "additionalProperties": False},
        '{"b": 1}',
        '{"a": 1}',
    ),
    "patternProperties": (
        {"type": "object", "patternProperties": {"^x": INT}, "additionalProperties": False},
        '{"x": "s"}',
        '{"xa": 1}',
    ),
    "minProperties": ({"type": "object", "minProperties": 1}, "{}", '{"a": 1}'),
    "maxProperties": ({"type": "object", "maxProperties": 1}, '{"a": 1, "b": 2}', '{"a": 1}'),
    "items": ({"type": "array", "items": INT}, '["x"]', "[1]"),
    "prefixItems": ({"type": "array", "prefixItems": [INT], "items": False}, "[1, 2]", "[1]"),
    "minItems": ({"type": "array", "items": INT, "minItems": 1}, "[]", "[1]"),
    "maxItems": ({"type": "array", "items": INT, "maxItems": 1}, "[1, 2]", "[1]"),
    "allOf": ({"allOf": [INT, {"minimum": 5}]}, "3", "6"),
    "anyOf": ({"anyOf": [INT, {"type": "string"}]}, "null", '"a"'),
    "oneOf of disjoint schemas": ({"oneOf": [INT, {"type": "string"}]}, "null", '"a"'),
    "local $ref": ({"$defs": {"p": {"type": "integer", "minimum": 1}}, "$ref": "#/$defs/p"}, "0", "1"),
    "minimum": ({"type": "integer", "minimum": 5}, "4", "5"),
    "exclusiveMaximum": ({"type": "number", "exclusiveMaximum": 5}, "5", "4.5"),
    "multipleOf": ({"type": "integer", "multipleOf": 3}, "4", "6"),
    "minLength": ({"type": "string", "minLength": 2}, '"a"', '"ab"'),
    "maxLength": ({"type": "string", "maxLength": 2}, '"abc"', '"ab"'),
    "pattern": ({"type": "string", "pattern": "^a+$"}, '"b"', '"aa"'),
    "format date": ({"type": "string", "format": "date"}, '"2024-13-01"', '"2024-01-31"'),
    "format email": ({"type": "string", "format": "email"}, '"a"', '"a@b.com"'),
    "format uuid": ({"type": "string", "format": "uuid"}, '"x"', '"123e4567-e89b-12d3-a456-426614174000"'),
    "format ipv4": ({"type": "string", "format": "ipv4"}, '"1.2.3"', '"1.2.3.4"'),
}
REFUSED: dict[str, tuple[Any, str]] = {
    "not": ({"type": "integer", "not": {"const": 3}}, "'not'"),
    "if": ({"type": "integer", "if": {"minimum": 5}, "then": {"multipleOf": 2}}, "'if'"),
    "uniqueItems": ({"type": "array", "items": INT, "uniqueItems": True}, "'uniqueItems'"),
    "contains": ({"type": "array", "contains": {"const": 5}}, "'contains'"),
    "minContains": ({"type": "array", "contains": {"const": 5}, "minContains": 2}, "'minContains'"),
    "dependentRequired": ({"type": "object", "dependentRequired": {"a": ["b"]}}, "'dependentRequired'"),
    "dependentSchemas": (
        {"type": "object", "dependentSchemas": {"a": {"required": ["b"]}}},
        "'dependentSchemas'",
    ),
    "dependencies": ({"type": "object", "dependencies": {"a": ["b"]}}, "'dependencies'"),
    "propertyNames": ({"type": "object", "propertyNames": {"maxLength": 2}}, "'propertyNames'"),
    "unevaluatedProperties": (
        {"type": "object", "properties": {"a": INT}, "unevaluatedProperties": False},
        "'unevaluatedProperties'",
    ),
    "unevaluatedItems": (
        {"type": "array", "prefixItems": [INT], "unevaluatedItems": False},
        "'unevaluatedItems'",
    ),
    "$dynamicRef": ({"type": "integer", "$dynamicRef": "#"}, "'$dynamicRef'"),
    "$recursiveRef": ({"type": "array", "items": {"$recursiveRef": "#"}}, "'$recursiveRef'"),
    "oneOf that may overlap": ({"oneOf": [INT, {"type": "number"}]}, "'oneOf'"),
    "an unknown format": ({"type": "string", "format": "frob"}, "'format': 'frob'"),
    "a format it does not check": (
        {"type": "string", "format": "uri-reference"},
        "'format': 'uri-reference'",
    ),
    "a remote $ref": (
        {"type": "object", "properties": {"x": {"$ref": "https://example.invalid/a.json"}}},
        "'$ref' to another document ('https://example.invalid/a.json')",
    ),
    "deep inside": (
        {"type": "object", "properties": {"a": {"type": "array", "items": {"not": {}}}}},
        "'not'",
    ),
    "a pattern with a look-ahead": ({"type": "string", "pattern": "^(?=a)a+$"}, "look-around"),
}


@pytest.mark.parametrize("keyword", sorted(ENFORCED))
def test_a_schema_keyword_it_compiles_is_enforced(
    compiler: GrammarCompiler, own_tokenizer: LLTokenizer, tokenizer: TokenizerBundle, keyword: str
) -> None:
    schema, breaks, keeps = ENFORCED[keyword]
    assert not jsonschema.Draft202012Validator(schema).is_valid(json.loads(breaks)) or "format" in keyword
    grammar = compiler.compile(Constraint("json_schema", json.dumps(schema)))
    assert accepts(own_tokenizer, tokenizer, grammar, keeps)
    assert not accepts(own_tokenizer, tokenizer, grammar, breaks)


@pytest.mark.parametrize("keyword", sorted(REFUSED))
def test_a_schema_keyword_it_cannot_enforce_is_refused_by_name(
    compiler: GrammarCompiler, keyword: str
) -> None:
    """CONSTRAIN-4: never compiled into a looser grammar."""
    schema, named = REFUSED[keyword]
    with pytest.raises(ConstraintError) as refused:
        compiler.compile(Constraint("json_schema", json.dumps(schema)))
    assert refused.value.field == "constraint.json_schema" and named in refused.value.reason
    if "pattern" not in keyword:
        assert refused.value.reason.endswith("which this server cannot enforce"), refused.value.reason


def test_llguidance_options_in_a_schema_change_nothing(
    compiler: GrammarCompiler, own_tokenizer: LLTokenizer, tokenizer: TokenizerBundle
) -> None:
    """The key "x-guidance" is no JSON Schema keyword: it neither lets a keyword through
    unenforced nor changes the layout."""
    options = {"lenient": True, "coerce_one_of": True, "whitespace_flexible": True, "item_separator": ","}
    with pytest.raises(ConstraintError, match="'not'"):
        compiler.compile(Constraint("json_schema", json.dumps({"not": {}, "x-guidance": options})))
    grammar = compiler.compile(
        Constraint("json_schema", json.dumps({"type": "array", "x-guidance": options}))
    )
    assert accepts(own_tokenizer, tokenizer, grammar, "[1, 2]")
    assert not accepts(own_tokenizer, tokenizer, grammar, "[1,2]")


@pytest.mark.parametrize(
    ("constraint", "field", "says"),
    [
        (Constraint("json_schema", "{not json"), "constraint.json_schema", "is not JSON"),
        (Constraint("json_schema", ""), "constraint.json_schema", "is not JSON"),
        (Constraint("json_schema", '{"const": NaN}'), "constraint.json_schema", "NaN is not a JSON value"),
        (
            Constraint("json_schema", '{"type": "frobnicate"}'),
            "constraint.json_schema",
            "Invalid type: frobnicate",
        ),
        (Constraint("json_schema", "[1, 2]"), "constraint.json_schema", "an object or a boolean"),
        (Constraint("json_schema", "false"), "constraint.json_schema", "no document"),
        (Constraint("json_schema", '{"required": "a"}'), "constraint.json_schema", "'required'"),
        (Constraint("regex", "a(b"), "constraint.regex", "unclosed group"),
        (Constraint("regex", "(a)\\1"), "constraint.regex", "backreferences are not supported"),
        (Constraint("regex", "[z-a]"), "constraint.regex", "invalid character class range"),
        (Constraint("ebnf", 'root ::= "a'), "constraint.ebnf", "unterminated string (line 1, column 12)"),
        (Constraint("ebnf", 'start ::= "a"'), "constraint.ebnf", "no rule 'root'"),
        (
            Constraint("ebnf", "root ::= undefined_rule"),
            "constraint.ebnf",
            "rule 'undefined_rule' is not defined",
        ),
        (Constraint("ebnf", 'root ::= "a"{3,2}'), "constraint.ebnf", "{3,2}"),
    ],
)
def test_a_constraint_that_does_not_compile_names_its_field(
    compiler: GrammarCompiler, constraint: Constraint, field: str, says: str
) -> None:
    with pytest.raises(ConstraintError) as refused:
        compiler.compile(constraint)
    reason = refused.value.reason
    assert refused.value.field == field and says in reason, reason
    assert "\n" not in reason and "<state>" not in reason and not reason.startswith("at ")


def test_true_is_the_schema_of_any_json(
    compiler: GrammarCompiler, own_tokenizer: LLTokenizer, tokenizer: TokenizerBundle
) -> None:
    grammar = compiler.compile(Constraint("json_schema", "true"))
    assert all(accepts(own_tokenizer, tokenizer, grammar, text) for text in ("[1]", '{"a": null}', '"x"'))


def test_clean_error_keeps_the_line_that_says_what_is_wrong() -> None:
    regex = (
        'at 1(8): invalid regex "a(b" (in regex): regex parse error:\n    a(b\n     ^\n'
        "error: unclosed group\n   1 | start: /a(b/\n              ^\n"
    )
    assert clean_error(regex) == "unclosed group"
    lark = '1(14): End number in range cannot be 0 (at "\\n")\n   1 | start: "a"{0}\n                    ^\n'
    assert clean_error(lark) == 'End number in range cannot be 0 (at "\\n")'
    assert clean_error("Expected f64 for 'minimum', got \"x\"") == "Expected f64 for 'minimum', got \"x\""
    assert len(clean_error("y" * 1000)) == 300


def test_each_distinct_constraint_compiles_once(tokenizer: TokenizerBundle) -> None:
    compiler = GrammarCompiler(tokenizer, tokenizer.vocab_size, max_entries=2)
    regex = Constraint("regex", "[0-9]{4}")
    results: list[Grammar] = []
    threads = [threading.Thread(target=lambda: results.append(compiler.compile(regex))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert compiler.compilations == 1 and all(g is results[0] for g in results)
    assert compiler.cached(regex) is results[0]
    assert compiler.cached(Constraint("regex", "[0-9]{5}")) is None  # a lookup never compiles
    bad = Constraint("regex", "a(")
    for _ in range(2):
        with pytest.raises(ConstraintError):
            compiler.compile(bad)
    assert compiler.compilations == 2 and compiler.cached(bad) is None  # the error is cached too
    compiler.compile(Constraint("choice", choices=("x",)))  # a third entry evicts the oldest
    assert compiler.cached(regex) is None
    compiler.compile(regex)
    assert compiler.compilations == 4


def test_an_output_grammar_allows_only_eos_once_complete(
    compiler: GrammarCompiler, tokenizer: TokenizerBundle
) -> None:
    grammar = compiler.compile(Constraint("regex", "[0-9]{3}"))
    first = grammar.matcher()
    forked = first.fork()
    for token_id in tokenizer.encode("123"):
        assert not first.allowed_tokens()[tokenizer.eos_token_ids[0]]
        first.accept(token_id)
    allowed = first.allowed_tokens()
    assert allowed.nonzero().flatten().tolist() == list(tokenizer.eos_token_ids)
    assert not first.terminated
    first.accept(tokenizer.eos_token_ids[0])
    assert first.terminated and first.fork().terminated
    assert not forked.terminated and forked.allowed_tokens()[tokenizer.encode("7")[0]]  # its own state
    with pytest.raises(RuntimeError, match="refused token"):
        forked.accept(tokenizer.encode("x")[0])


def test_a_grammar_past_its_limits_ends_the_output_instead_of_the_server(
    tokenizer: TokenizerBundle, own_tokenizer: LLTokenizer
) -> None:
    """llguidance bounds each mask's work; a matcher past its bounds allows only EOS, and the
    output then ends there (logged) rather than raising in the engine's step."""
    definition = LLMatcher.grammar_from_lark(gbnf_to_lark("root ::= [a-z]+", fuse=False))
    tight = LLMatcher(own_tokenizer, definition, log_level=0, limits=LLParserLimits(step_max_items=3))
    out = OutputGrammar(tight, tokenizer.vocab_size, frozenset(tokenizer.eos_token_ids))
    assert out.allowed_tokens().nonzero().flatten().tolist() == list(tokenizer.eos_token_ids)
    out.accept(tokenizer.eos_token_ids[0])
    assert out.terminated


def test_unpack_bitmask_reads_llguidances_bit_order() -> None:
    vocab = 70
    expected = torch.zeros(vocab, dtype=torch.bool)
    expected[[0, 5, 31, 32, 63, 69]] = True
    words = np.zeros(3, dtype=np.uint32)
    for token_id in expected.nonzero().flatten().tolist():
        words[token_id // 32] |= np.uint32(1 << (token_id % 32))
    assert torch.equal(unpack_bitmask(words, vocab), expected)


@pytest.mark.parametrize(
    ("schema", "keeps", "leaves"),
    [
        ({"type": "object", "properties": {"x": INT}}, ['{"x": 1}', "{}"], ['{"x": 1, "y": 2}']),
        (
            {"type": "object", "properties": {"x": INT}, "additionalProperties": True},
            ['{"x": 1, "y": 2}'],
            [],
        ),
        (
            {"type": "object", "properties": {"x": INT}, "additionalProperties": INT},
            ['{"y": 2}'],
            ['{"y": "s"}'],
        ),
        ({"type": "object"}, ['{"y": [1, {"z": null}]}'], []),
        (
            {"allOf": [{"properties": {"a": INT}}, {"properties": {"b": INT}}]},
            ['{"a": 1, "b": 2, "c": 3}'],
            [],
        ),
        ({"type": "array", "prefixItems": [INT]}, ["[1]"], ["[1, 2]"]),
        ({"type": "array", "prefixItems": [INT], "items": True}, ["[1, 2]"], []),
    ],
)
def test_an_object_takes_only_the_properties_it_names_unless_the_schema_says_otherwise(
    compiler: GrammarCompiler,
    own_tokenizer: LLTokenizer,
    tokenizer: TokenizerBundle,
    schema: dict[str, Any],
    keeps: list[str],
    leaves: list[str],
) -> None:
    """As xgrammar had it: what the schema allows beyond what it names, a small model fills
    with keys of its own until max_tokens (engine/closed_schema.py)."""
    grammar = compiler.compile(Constraint("json_schema", json.dumps(schema)))
    for text in keeps:
        assert jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
        assert accepts(own_tokenizer, tokenizer, grammar, text), text
    assert not any(accepts(own_tokenizer, tokenizer, grammar, text) for text in leaves)
