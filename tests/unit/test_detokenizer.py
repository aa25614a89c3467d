"""Incremental detokenization and stop-string holdback (no processes, no sockets)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference_server.detokenizer.incremental import ByteStreamDecoder, DecodeTable, WindowDecoder
from reference_server.detokenizer.state import RequestText
from reference_server.detokenizer.stops import StopStringMatcher
from reference_server.ipc import DetokenizeConfig, Finish, SequenceOutput
from reference_server.models.tokenizer import TokenizerBundle

SAMPLES = [
    "Hello, world!",
    "你好，世界。日本語のテキスト",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flag 🇫🇷",
    "한국어 문장은 음절 단위로 잘립니다",
    "mixed: naïve café – 12 345 ² ½ ١٢٣",
    "tabs\tand  spaces  \n\nnewlines",
]

texts = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=40
) | st.sampled_from(SAMPLES)


@pytest.fixture(scope="module")
def table(tokenizer: TokenizerBundle) -> DecodeTable:
    return DecodeTable.build(tokenizer.tokenizer, tokenizer.vocab_size)


def pieces(decoder: ByteStreamDecoder | WindowDecoder, ids: list[int]) -> list[str]:
    out = [decoder.feed(i) for i in ids]
    out.append(decoder.flush())
    return out


@pytest.mark.parametrize("skip_special", [True, False])
@pytest.mark.parametrize("text", [*SAMPLES, "<|im_start|>user\n你<|im_end|>好😀"])
def test_byte_stream_matches_full_decode(
    table: DecodeTable, tokenizer: TokenizerBundle, text: str, skip_special: bool
) -> None:
    ids = tokenizer.encode(text)
    out = pieces(ByteStreamDecoder(table, skip_special), ids)
    assert "".join(out) == tokenizer.decode(ids, skip_special_tokens=skip_special)
    assert all("\ufffd" not in p for p in out), "U+FFFD caused by buffering"


@given(text=texts)
def test_both_decoders_concatenate_to_the_full_decode(
    table: DecodeTable, tokenizer: TokenizerBundle, text: str
) -> None:
    ids = tokenizer.encode(text)
    full = tokenizer.decode(ids)
    for decoder in (ByteStreamDecoder(table, True), WindowDecoder(tokenizer.tokenizer, True)):
        out = pieces(decoder, ids)
        assert "".join(out) == full
        if "\ufffd" not in full:
            assert all("\ufffd" not in p for p in out)


def test_invalid_bytes_become_one_replacement_each_like_the_tokenizer(
    table: DecodeTable, tokenizer: TokenizerBundle
) -> None:
    emoji = tokenizer.encode("😀")  # split across byte tokens
    assert len(emoji) > 1
    ids = emoji[1:] + [2] + emoji[:1]  # continuation bytes first, a special token, a dangling lead byte
    for skip in (True, False):
        joined = "".join(pieces(ByteStreamDecoder(table, skip), ids))
        assert joined == tokenizer.decode(ids, skip_special_tokens=skip)


def scan_all(stops: tuple[str, ...], chunks: list[str], include: bool) -> tuple[str, str | None]:
    matcher = StopStringMatcher(stops, include_stop=include)
    emitted = []
    for chunk in chunks:
        scan = matcher.feed(chunk)
        emitted.append(scan.text)
        if scan.matched is not None:
            return "".join(emitted), scan.matched
    emitted.append(matcher.flush())
    return "".join(emitted), None


@given(
    text=st.text(alphabet="abc ", max_size=30),
    stops=st.lists(st.text(alphabet="abc ", min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=30), max_size=8),
    include=st.booleans(),
)
def test_stop_matching_does_not_depend_on_how_text_is_split(
    text: str, stops: list[str], cuts: list[int], include: bool
) -> None:
    bounds = sorted({0, len(text), *[min(c, len(text)) for c in cuts]})
    chunks = [text[a:b] for a, b in itertools.pairwise(bounds)]
    assert scan_all(tuple(stops), chunks, include) == scan_all(tuple(stops), [text], include)
    emitted, matched = scan_all(tuple(stops), chunks, include)
    if matched is None:
        assert emitted == text
    else:
        body = emitted[: len(emitted) - len(matched)] if include else emitted
        assert not any(s in body for s in stops), "text before the match contains a stop string"
        assert text.startswith(body)


def test_holdback_never_streams_a_prefix_of_an_excluded_stop() -> None:
    matcher = StopStringMatcher(("STOP",), include_stop=False)
    assert matcher.feed("hello ST").text == "hello "
    assert matcher.feed("O").text == ""
    scan = matcher.feed("P tail")
    assert scan == ("", "STOP")


def test_held_text_is_released_when_it_can_no_longer_match() -> None:
    matcher = StopStringMatcher(("STOP",), include_stop=False)
    assert matcher.feed("ST").text == ""
    assert matcher.feed("AR").text == "STAR"


def config(**overrides: object) -> DetokenizeConfig:
    base: dict[str, object] = dict(
        return_text=True,
        skip_special_tokens=False,
        stop_strings=(),
        include_stop_in_output=False,
        min_tokens=0,
    )
    base.update(overrides)
    return DetokenizeConfig(**base)  # type: ignore[arg-type]


def test_stop_token_text_is_excluded_but_its_id_is_kept(
    table: DecodeTable, tokenizer: TokenizerBundle
) -> None:
    ids = tokenizer.encode("Paris")
    request = RequestText.create(table, "r", 1, config())
    event, _ = request.process(SequenceOutput("r", 0, [*ids, 2], finish=Finish("stop", eos_token_id=2)))
    assert event is not None and event.text == "Paris" and event.token_ids == [*ids, 2]
    request = RequestText.create(table, "r", 1, config(include_stop_in_output=True))
    event, _ = request.process(SequenceOutput("r", 0, [*ids, 2], finish=Finish("stop", eos_token_id=2)))
    assert event is not None and event.text == "Paris<|im_end|>"


def test_stop_string_ends_the_output_and_drops_later_tokens(
    table: DecodeTable, tokenizer: TokenizerBundle
) -> None:
    ids = tokenizer.encode("one two three four")
    request = RequestText.create(table, "r", 1, config(stop_strings=("three",)))
    event, stop_engine = request.process(SequenceOutput("r", 0, ids))
    assert stop_engine and event is not None
    assert event.text == "one two " and event.finish == Finish("stop", stop_string="three")
    assert event.completion_tokens == len(tokenizer.encode("one two three"))
    assert event.token_ids == ids[: event.completion_tokens]
    assert request.done
    assert request.process(SequenceOutput("r", 0, [5])) == (None, False)


def test_min_tokens_delays_stop_strings(table: DecodeTable, tokenizer: TokenizerBundle) -> None:
    ids = tokenizer.encode("ab ab ab")
    request = RequestText.create(table, "r", 1, config(stop_strings=("ab",), min_tokens=3))
    texts = []
    for token_id in ids:
        event, _ = request.process(SequenceOutput("r", 0, [token_id]))
        assert event is not None
        texts.append(event.text)
        if event.finish:
            break
    assert event is not None and event.finish == Finish("stop", stop_string="ab")
    assert event.completion_tokens >= 3


def test_whole_token_text_matches_a_stop_only_where_a_gateway_decoding_the_ids_sees_it(
    table: DecodeTable, tokenizer: TokenizerBundle
) -> None:
    """`: ` before 新: the space shares a token with 新's first byte. Character by character the
    stop matches at that token, whose ids a gateway decoding them (holding an incomplete
    character, as smg and vLLM do) reads as 'Repeat exactly:', no stop in it. Whole token by whole
    token, as vLLM's detokenizer releases text, the stop matches once 新 completes: the ids then
    hold the whole stop, and the text is cut before it all the same."""
    ids = tokenizer.encode("Repeat exactly: 新 新")
    assert any(tokenizer.decode([t]).endswith("\ufffd") for t in ids), "no token ends inside a character"

    def run(whole_tokens: bool) -> tuple[str, list[int]]:
        request = RequestText.create(
            table, "r", 1, config(stop_strings=(": ",), whole_token_text=whole_tokens)
        )
        text, sent = "", []
        for token_id in ids:
            event, _ = request.process(SequenceOutput("r", 0, [token_id]))
            assert event is not None
            text, sent = text + event.text, sent + event.token_ids
            if event.finish is not None:
                return text, sent
        raise AssertionError("the stop never matched")

    def seen_by_a_gateway(token_ids: list[int]) -> str:
        """The ids' text as an incremental decoder shows it: no token that ends inside a character."""
        whole = [
            k for k in range(len(token_ids) + 1) if not tokenizer.decode(token_ids[:k]).endswith("\ufffd")
        ]
        return tokenizer.decode(token_ids[: whole[-1]])

    early_text, early_ids = run(whole_tokens=False)
    late_text, late_ids = run(whole_tokens=True)
    assert early_text == late_text == "Repeat exactly"
    assert seen_by_a_gateway(early_ids) == "Repeat exactly:"  # no stop left to cut
    assert seen_by_a_gateway(late_ids) == "Repeat exactly: 新"
