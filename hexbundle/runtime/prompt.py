"""The token ids `doit verify` feeds a bundle: ordinary text, tokenized by the bundle's own
tokenizer.json.

Random ids (what verify fed before issue 46) reach ids a model never sees in text: padding and
special tokens, whose embedding rows some exports set to zero (SmolLM2's pad row, Falcon 3's),
so a part's output is all zeros in the bundle and in both references and the verdict hangs on
how a comparison treats two zero vectors. Ordinary text is what a bundle is built to run.

The seed picks the order of the sentences below (a new order each time round, if the sequence
is longer than the text); every id comes from encoding a sentence without special tokens, and a
sentence that still maps to an added (special) token or an id past the model's vocabulary is
skipped.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hexbundle.support.errors import VerifyError

# Plain prose, no markup: what a tokenizer's ordinary vocabulary covers, whatever the family.
ORDINARY_TEXT = (
    "The morning train left the station a few minutes late.",
    "Most of the passengers were reading or looking out of the window.",
    "A small river ran beside the track for several miles.",
    "In the summer the water is low and children play on the stones.",
    "The town at the end of the line has a market every Saturday.",
    "Farmers bring apples, bread, cheese and fresh eggs to sell.",
    "Some people walk there from the nearby villages before sunrise.",
    "The old bridge was built of grey stone more than two hundred years ago.",
    "It was repaired after a flood damaged one of its arches.",
    "Visitors often stop in the middle to watch the boats below.",
    "My grandmother kept a garden with roses, beans and tall sunflowers.",
    "She wrote the date of every frost in a notebook by the kitchen door.",
    "When it rained she sat by the fire and mended clothes for the family.",
    "The library opens at nine and closes early on Sundays.",
    "Students come to study quietly, and the reading room is always warm.",
    "A friendly clerk helps anyone who cannot find the book they need.",
    "Learning a new language takes patience and a little practice every day.",
    "Simple words come first, and longer sentences follow with time.",
    "Music helps many people remember new words and their sounds.",
    "The weather changed quickly in the afternoon, and clouds covered the hills.",
    "By evening the wind had dropped and the sky was clear again.",
    "We counted the stars until it was too cold to stay outside.",
    "Good bread needs flour, water, salt, yeast and enough time to rise.",
    "The baker starts work long before the shop opens its doors.",
    "On busy days the first loaves are sold within an hour.",
    "A careful engineer checks each part before the machine is started.",
    "Small mistakes are easier to fix when they are found early.",
    "The team writes down what they measured and how they measured it.",
    "After lunch the children drew maps of the streets around the school.",
    "Each map showed the park, the post office and the way home.",
)


@dataclass
class Prompt:
    text: str
    ids: np.ndarray     # int32, prompt + decode ids


def ordinary_prompt(tokenizer_path: Path, n_vocab: int, seed: int, count: int) -> Prompt:
    """`count` token ids of ORDINARY_TEXT in the seed's sentence order, and the text they are."""
    from hexbundle.runtime.generation import load_tokenizer
    tokenizer = load_tokenizer(tokenizer_path)
    special = set(tokenizer.get_added_tokens_decoder())
    pieces = []
    for sentence in ORDINARY_TEXT:   # each as it stands in running text: after a space
        ids = tokenizer.encode(" " + sentence, add_special_tokens=False).ids
        if ids and all(0 <= i < n_vocab and i not in special for i in ids):
            pieces.append((" " + sentence, ids))
    if not pieces:
        raise VerifyError(f"{tokenizer_path}: none of verify's ordinary sentences encodes to "
                          f"ordinary token ids (below n-vocab {n_vocab}, no special token): not "
                          "a text tokenizer of this model; rebuild the bundle with the model's "
                          "own tokenizer.json")
    rng = np.random.default_rng(seed)
    text, ids = [], []
    while len(ids) < count:
        for i in rng.permutation(len(pieces)):
            sentence, sentence_ids = pieces[i]
            text.append(sentence)
            ids += sentence_ids
            if len(ids) >= count:
                break
    # the text the ids were taken from (its last sentence may go past the last id)
    return Prompt("".join(text), np.asarray(ids[:count], np.int32))
