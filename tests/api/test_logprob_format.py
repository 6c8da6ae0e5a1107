"""api/logprob_format.py on real tokenizers: each token's text is the tokenizer's decoding of it alone, its bytes the
token's own (byte-level BPE: SmolLM2's; SentencePiece with byte fallback: one built here), and text offsets count
the characters before each token in the decoded text."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models

from api.logprob_format import LOWEST_LOGPROB, CompletionLogprobs, TextOffsets, TokenTexts, chat_content, parse_entries


@pytest.fixture(scope="module")
def smollm2_tokenizer() -> Tokenizer:
    from engine.config import ModelConfig
    from engine.model_loader import resolve_model_dir

    return Tokenizer.from_file(str(resolve_model_dir(ModelConfig(model="default")) / "tokenizer.json"))


def test_byte_level_tokens_decode_alone_and_keep_their_bytes(smollm2_tokenizer: Tokenizer) -> None:
    texts = TokenTexts(smollm2_tokenizer)
    text = "Café 東京 sea"
    ids = smollm2_tokenizer.encode(text, add_special_tokens=False).ids
    pieces = [texts.get(i) for i in ids]
    assert b"".join(raw for _, raw in pieces) == text.encode()
    assert [t for t, _ in pieces] == [smollm2_tokenizer.decode([i]) for i in ids]
    assert ("é", "é".encode()) in pieces and (" sea", b" sea") in pieces
    partial = [raw for t, raw in pieces if "\ufffd" in t]  # the pieces of 東 and 京: joined, their UTF-8
    assert len(partial) > 2 and b"".join(partial) == " 東京".encode()
    assert texts.get(0) == ("<|endoftext|>", b"<|endoftext|>")  # a special token as its text


def test_byte_fallback_tokens_keep_their_bytes() -> None:
    vocab = {"<unk>": 0, "▁caf": 1, "<0xC3>": 2, "<0xA9>": 3, "▁sea": 4}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    texts = TokenTexts(tokenizer)
    assert texts.get(2) == ("\ufffd", b"\xc3")
    assert texts.get(4) == ("sea", b" sea")  # decoded alone the leading space is stripped; the bytes keep it


def test_without_a_tokenizer_tokens_show_their_ids() -> None:
    assert TokenTexts(None).get(7) == ("token_id:7", b"token_id:7")


def test_formats_and_offsets(smollm2_tokenizer: Tokenizer) -> None:
    texts = TokenTexts(smollm2_tokenizer)
    ids = smollm2_tokenizer.encode("Café 東京", add_special_tokens=False).ids
    raw = [{"token_id": ids[0], "logprob": None, "top": {}}] + [
        {"token_id": i, "logprob": -float(n), "top": {str(i): -float(n), "0": float("-inf")}}
        for n, i in enumerate(ids[1:], 1)
    ]
    entries = parse_entries(raw)
    body = CompletionLogprobs.empty().add(entries, texts, TextOffsets()).body()
    assert body["token_logprobs"][0] is None and body["top_logprobs"][0] is None
    assert body["top_logprobs"][1]["<|endoftext|>"] == LOWEST_LOGPROB  # -inf is not JSON
    # 'C' 'af' 'é' ' 東'[:1] 東[1:2] 東[2:] 京[:2] 京[2:]: a token inside a character points at that character
    assert [texts.text(i) for i in ids] == ["C", "af", "é", " \ufffd", "\ufffd", "\ufffd", "\ufffd", "\ufffd"]
    assert body["text_offset"] == [0, 1, 3, 4, 5, 5, 6, 6]
    content = chat_content(entries[1:], texts)
    assert [c["bytes"] for c in content] == [list(texts.get(i)[1]) for i in ids[1:]]
    assert content[0]["top_logprobs"][0]["token"] == texts.text(ids[1])
