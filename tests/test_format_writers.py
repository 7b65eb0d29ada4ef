"""The writers that live beside their readers in formats/: what formats/encodings.py and
formats/tokenizer.py write, their own readers read back as written."""
from __future__ import annotations

import json

import numpy as np

from hexbundle.formats import encodings, tokenizer
from hexbundle.inputs import bpe

SPECIALS = {"bos": "<|im_start|>", "eos": "<|im_end|>", "eot": "<|endoftext|>"}


def test_an_encodings_document_reads_back_as_written(tmp_path):
    amax = np.array([0.5, 2.0, 1e-30], np.float32)   # the last: the tiny-scale floor
    doc = encodings.encodings_document(
        [encodings.int_entry("x", encodings.symmetric_per_tensor(8.0, 16)),
         encodings.int_entry("mask", encodings.asymmetric_per_tensor(-50.0, 0.0, 16))],
        [encodings.int_entry("w", encodings.symmetric_per_channel(amax, 4)),
         encodings.int_entry("emb", encodings.asymmetric_per_tensor(-1.5, 0.75, 8)),
         encodings.float_entry("norm", 16)],
        {"activation_bitwidth": 16})
    path = tmp_path / "g.encodings"
    path.write_bytes(encodings.encodings_bytes(doc))
    read = encodings.load_encodings(path)
    assert read.schema == "1.0.0" and set(read.params) == {"w", "emb", "norm"}
    w = read.params["w"]
    assert (w.bitwidth, w.symmetric, w.per_channel, w.is_int) == (4, True, True, True)
    np.testing.assert_array_equal(w.scale, np.maximum(amax / np.float32(7),
                                                      np.finfo(np.float32).tiny))
    assert w.offset.tolist() == [-8] * 3
    emb = read.params["emb"]
    assert (emb.bitwidth, emb.symmetric, emb.per_channel) == (8, False, False)
    scale = (0.75 + 1.5) / 255
    np.testing.assert_allclose(emb.scale, [scale], rtol=1e-7)
    assert emb.offset.tolist() == [round(-1.5 / scale)]
    assert (read.params["norm"].dtype, read.params["norm"].bitwidth) == ("float", 16)
    mask = read.activations["mask"]
    assert mask.offset.tolist() == [-65535] and not mask.symmetric
    assert read.activations["x"].scale.tolist() == [np.float32(8.0 / 32767)]
    assert json.loads(path.read_bytes()) == doc


def test_a_byte_level_bpe_tokenizer_reads_back_as_written(tmp_path):
    doc = bpe.tokenizer_json(600, SPECIALS)
    path = tmp_path / "tokenizer.json"
    path.write_bytes(tokenizer.tokenizer_bytes(doc))
    ids = tokenizer.special_token_ids(path, SPECIALS, 600)
    first = len(doc["model"]["vocab"])
    assert ids == {"bos": first, "eos": first + 1, "eot": first + 2}
    assert tokenizer.added_token_contents(path) == {first + i: c
                                                    for i, c in enumerate(SPECIALS.values())}
    assert json.loads(path.read_text("utf-8")) == doc


def test_the_tokenizer_writer_keeps_non_ascii_text_as_utf8():
    doc = tokenizer.byte_level_bpe({"a": 0, "你": 1}, [("a", "a")], [(2, "<s>")])
    raw = tokenizer.tokenizer_bytes(doc)
    assert "你".encode("utf-8") in raw and b"\\u" not in raw and raw.endswith(b"}\n")
