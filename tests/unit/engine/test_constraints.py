"""engine/constraints.py: the vocabulary as xgrammar reads it, each kind of constraint, the errors
a client sees, the compile cache, and one output's grammar state."""

from __future__ import annotations

import json
import threading

import pytest
import torch
import xgrammar as xgr
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

from reference_server.engine.constraints import (
    ConstraintError,
    Grammar,
    GrammarCompiler,
    choice_grammar,
    clean_error,
    tokenizer_info,
    unpack_bitmask,
)
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


def accepts(grammar: Grammar, text: str) -> bool:
    """Whether ``text`` is a whole sentence of the grammar."""
    matcher = xgr.GrammarMatcher(grammar.compiled)
    return matcher.accept_string(text) and matcher.is_completed()


def is_prefix(grammar: Grammar, text: str) -> bool:
    return xgr.GrammarMatcher(grammar.compiled).accept_string(text)


def test_added_tokens_are_outside_every_grammar_and_eos_ends_it(tokenizer: TokenizerBundle) -> None:
    info = tokenizer_info(tokenizer, tokenizer.vocab_size + 64)  # a model's padded logits
    assert info.vocab_type is xgr.VocabType.BYTE_LEVEL and not info.add_prefix_space
    assert info.stop_token_ids == list(tokenizer.eos_token_ids)
    added = set(tokenizer.tokenizer.get_added_tokens_decoder())
    specials = set(info.special_token_ids)
    assert added - set(tokenizer.eos_token_ids) <= specials
    assert set(range(tokenizer.vocab_size, tokenizer.vocab_size + 64)) <= specials  # padding
    # inside a JSON string any text goes, but never a chat marker's id
    grammar = GrammarCompiler(tokenizer, tokenizer.vocab_size + 64).compile(Constraint("json_object"))
    matcher = grammar.matcher()
    for token_id in tokenizer.encode('{"a": "x'):
        matcher.accept(token_id)
    allowed = matcher.allowed_tokens()
    assert allowed.shape == (tokenizer.vocab_size + 64,) and allowed.dtype == torch.bool
    assert not allowed[sorted(added)].any() and not allowed[tokenizer.vocab_size :].any()
    assert allowed[tokenizer.encode("hello")[0]]


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
    bundle = llama2_style_tokenizer()
    info = tokenizer_info(bundle, bundle.vocab_size)
    assert info.vocab_type is xgr.VocabType.BYTE_FALLBACK and info.add_prefix_space
    grammar = GrammarCompiler(bundle, bundle.vocab_size).compile(Constraint("regex", "hello world!"))
    matcher, ids = grammar.matcher(), []
    while not matcher.terminated:  # the longest token the grammar allows, as a greedy model might
        allowed = matcher.allowed_tokens().nonzero().flatten().tolist()
        token_id = max(allowed, key=lambda t: len(info.decoded_vocab[t]))
        matcher.accept(token_id)
        ids.append(token_id)
    assert ids[-1] == 2 and bundle.tokenizer.id_to_token(ids[-2]) == "<0x21>"  # "!" is a byte token
    assert "▁world" in [bundle.tokenizer.id_to_token(t) for t in ids]
    assert bundle.decode(ids) == "hello world!"


def test_each_kind_accepts_its_texts_and_nothing_else(compiler: GrammarCompiler) -> None:
    cases = {
        Constraint("json_schema", PERSON): (['{"name": "Ann", "age": 3}'], ['{"name": "Ann"}', "[1]"]),
        Constraint("json_object"): (['{"a": [1, {"b": null}]}', "{}"], ["[1]", '"x"', "3"]),
        Constraint("regex", r"[a-z]+@[a-z]+\.com"): (["ann@mail.com"], ["ann@mail.org", "@mail.com"]),
        Constraint("ebnf", 'root ::= "(" num ")"\nnum ::= [0-9]+'): (["(42)"], ["()", "(4a)"]),
        Constraint("choice", choices=("yes", "no", "maybe not")): (["yes", "maybe not"], ["ye", "Yes"]),
    }
    for constraint, (good, bad) in cases.items():
        grammar = compiler.compile(constraint)
        assert all(accepts(grammar, text) for text in good), constraint
        assert not any(accepts(grammar, text) for text in bad), constraint
    assert is_prefix(compiler.compile(Constraint("json_schema", PERSON)), '{"name": "An')


def test_choices_are_literals_whatever_their_characters(compiler: GrammarCompiler) -> None:
    choices = ('say "hi"', "back\\slash", "new\nline", "\x01c", "\x7f", "ünï 😀", "[a] (b) | c*", "a", "ab")
    grammar = compiler.compile(Constraint("choice", choices=choices))
    assert all(accepts(grammar, choice) for choice in choices)
    assert not any(accepts(grammar, text) for text in ("say hi", "\x1c", "backslash", "[a]"))
    assert choice_grammar(("a\x01c",)) == 'root ::= "a\\u0001c"'


@pytest.mark.parametrize(
    ("constraint", "field", "says"),
    [
        (Constraint("json_schema", "{not json"), "constraint.json_schema", "is not JSON"),
        (Constraint("json_schema", ""), "constraint.json_schema", "is not JSON"),
        (Constraint("json_schema", '{"type": "frobnicate"}'), "constraint.json_schema", "frobnicate"),
        (Constraint("json_schema", "[1, 2]"), "constraint.json_schema", "should be an object or bool"),
        (
            Constraint("json_schema", '{"properties": {"x": {"$ref": "https://example.invalid/a.json"}}}'),
            "constraint.json_schema",
            "cannot enforce",
        ),
        (Constraint("json_schema", '{"not": {"type": "string"}}'), "constraint.json_schema", "'not' at /"),
        (Constraint("regex", "a(b"), "constraint.regex", "parenthesis is not closed"),
        (Constraint("regex", "(a)\\1"), "constraint.regex", "Backreference is not supported"),
        (Constraint("ebnf", 'root ::= "a'), "constraint.ebnf", "does not parse"),
        (Constraint("ebnf", 'start ::= "a"'), "constraint.ebnf", 'root rule with name "root" is not found'),
        (Constraint("ebnf", "root ::= undefined_rule"), "constraint.ebnf", "is not defined"),
    ],
)
def test_a_constraint_that_does_not_compile_names_its_field(
    compiler: GrammarCompiler, constraint: Constraint, field: str, says: str
) -> None:
    with pytest.raises(ConstraintError) as refused:
        compiler.compile(constraint)
    assert refused.value.field == field and says in refused.value.reason
    assert ".cc:" not in refused.value.reason and "Check failed" not in refused.value.reason


def test_clean_error_strips_xgrammar_prefixes() -> None:
    raw = (
        "[04:27:03] /project/cpp/json_schema_converter.cc:4939: Check failed: (error.empty()) is false: "
        "Failed to parse JSON: syntax error at line 1 near: x. The JSON string is:{x\n"
    )
    assert clean_error(raw) == "Failed to parse JSON: syntax error at line 1 near: x."
    assert len(clean_error("[1:2:3] a.cc:1: " + "y" * 1000)) == 300


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
    assert first.terminated
    assert not forked.terminated and forked.allowed_tokens()[tokenizer.encode("7")[0]]  # its own state
    with pytest.raises(RuntimeError, match="refused token"):
        forked.accept(tokenizer.encode("x")[0])


def test_unpack_bitmask_reads_xgrammars_bit_order() -> None:
    vocab = 70
    expected = torch.zeros(vocab, dtype=torch.bool)
    expected[[0, 5, 31, 32, 63, 69]] = True
    words = torch.zeros(3, dtype=torch.int64)
    for token_id in expected.nonzero().flatten().tolist():
        words[token_id // 32] |= 1 << (token_id % 32)
    packed = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # as int32 bit patterns
    assert torch.equal(unpack_bitmask(packed, vocab), expected)
