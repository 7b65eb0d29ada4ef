"""The synthetic model's tokenizer: byte-level BPE merges learned from a small English and
Chinese corpus up to the model's vocab_size, then the special tokens; the tokenizer.json document
and bytes are formats/tokenizer.py's.
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from hexbundle.formats import tokenizer
from hexbundle.inputs.synthetic import write_input_file

# --------------------------------------------------------------------------- tokenizer

# Training text for the BPE merges: plain English and Chinese, so both scripts get real merges.
_CORPUS = """\
The quick brown fox jumps over the lazy dog. A small model can still say hello to the world.
Hello, how are you today? I am fine, thank you. What is the weather like in the city this morning?
Large language models predict the next token from the tokens that came before it.
The prompt is processed in chunks of one hundred and twenty eight tokens, then one token at a time.
Each decoder layer has attention and a feed forward network with a gated linear unit.
The key and value cache keeps the past so that every new token only needs one pass.
Quantization stores weights with four bits and activations with sixteen bits on the device.
Please answer the question in English or in Chinese, and keep the answer short and clear.
There are three apples on the table, and she gives two of them to her brother.
Today is a good day to learn something new about computers, numbers and language.
The river flows through the valley, past the old bridge and the green fields of rice.
He wrote a letter to his friend, telling her about the mountains and the long winter.
Numbers such as 1, 2, 3, 42, 100 and 2024 appear in text as well as words do.
Where is the train station? Turn left at the second street and walk for five minutes.
你好，世界！今天天气很好，我们一起去公园散步吧。
大语言模型根据前面的词预测下一个词，一次生成一个词。
请用中文回答这个问题，回答要简短清楚。
我喜欢读书，也喜欢听音乐和看电影。
这个模型很小，但是它的结构和真正的大模型一样。
每一层都有注意力机制和前馈网络，最后输出每个词的概率。
量化以后，权重只用四位存储，激活值用十六位表示。
北京是中国的首都，上海是一个很大的城市。
桌子上有三个苹果，她给了弟弟两个，还剩一个。
春天来了，花开了，小鸟在树上唱歌，孩子们在草地上玩耍。
学习一门新的语言需要时间和耐心，每天练习一点就会进步。
谢谢你的帮助，我们明天见。
"""

_PRETOKENIZE = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+""")


def _byte_to_unicode() -> dict:
    """GPT-2's byte -> printable character map used by byte-level BPE (bytes in id order)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def _learn_merges(text: str, max_merges: int) -> list:
    """Greedy BPE: merge the most frequent adjacent pair; ties go to the smallest pair string."""
    to_char = _byte_to_unicode()
    words = Counter(tuple(to_char[b] for b in piece.encode("utf-8")) for piece in _PRETOKENIZE.findall(text))
    merges = []
    while len(merges) < max_merges:
        pairs = Counter()
        for word, freq in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += freq
        if not pairs:
            break   # every pre-token is a single symbol: the corpus is used up
        best = min(pairs, key=lambda pair: (-pairs[pair], pair))
        merges.append(best)
        words = Counter({_merge_pair(word, best): freq for word, freq in words.items()})
    return merges


def _merge_pair(word: tuple, pair: tuple) -> tuple:
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def generated_special_ids(first_free: int, special_tokens: dict) -> dict:
    """{role: id}: the specials take the ids right after the BPE vocabulary, in the dict's order.

    As in Qwen's own tokenizer.json: the tokenizers library numbers an added token that is not in
    model.vocab from the vocabulary's end, whatever id added_tokens writes, so any gap would make
    the file contradict itself. The logits width (vocab_size) may be wider than the tokenizer."""
    return {role: first_free + i for i, role in enumerate(special_tokens)}


def tokenizer_json(vocab_size: int, special_tokens: dict) -> dict:
    """The Hugging Face tokenizer.json content (byte-level BPE) for a model's vocab_size: the
    corpus's merges up to it (a small model's vocabulary fills up, a 7B-sized one does not),
    then the specials."""
    budget = vocab_size - len(special_tokens) - 256
    if budget < 0:
        raise ValueError(f"vocab_size {vocab_size} leaves no room for 256 byte "
                         f"tokens and {len(special_tokens)} special tokens")
    vocab = {ch: i for i, ch in enumerate(_byte_to_unicode().values())}
    merges = _learn_merges(_CORPUS, budget)
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))   # two merges may spell one token: one id
    ids = generated_special_ids(len(vocab), special_tokens)
    return tokenizer.byte_level_bpe(vocab, merges, [(ids[role], content)
                                                    for role, content in special_tokens.items()])


def generate_tokenizer(vocab_size: int, path: Path, special_tokens: dict) -> Path:
    """Write a byte-level BPE tokenizer.json: every id < vocab_size, specials at the top ids."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_input_file(path, tokenizer.tokenizer_bytes(tokenizer_json(vocab_size, special_tokens)))
    return path
