"""WordPiece (Google's ``vocab.txt``, or Hugging Face's ``tokenizer.json``), as BERT tokenizes.

Reproduces Hugging Face's slow Python ``BertTokenizer`` (``BertTokenizerLegacy`` in transformers
5) exactly: special tokens in the text are kept whole, control characters are dropped, CJK
ideographs become words, the text is NFC-normalised, an uncased vocabulary lower-cases and strips
accents, punctuation is split off, and a word longer than 100 characters becomes ``[UNK]``. Data
preparation passes ``allow_special=False`` (``encode_batch``) so that a literal "[SEP]" in a
corpus is ordinary text and can never inject a control token.

Why this is hand-written rather than Hugging Face ``tokenizers``' Rust WordPiece
(``benchmarks/data_bench.py``, tokenizers 0.23.3, the uncased 30,522-entry vocabulary, all 17,562
sentences of the embedded corpus, one process on a shared 2-core machine, median of 3): this code
encodes 33,900 sentences/s, the Rust pipeline (BertNormalizer + BertPreTokenizer + WordPiece,
``encode_batch``) 11,700, so it would be the slower choice; the per-word id cache and the ASCII
fast path below skip work the Rust normaliser redoes on every word. It is not exact either: it
lower-cases character by character, so a capital sigma ending a word becomes "σ" where
``str.lower`` and the reference give "ς" ("ΟΔΟΣ" -> ο ##δ ##ος here, ο ##δ ##ο ##σ there), and
it does not NFC-normalise, so a cased vocabulary sees "e" + U+0301 as two pieces, not "é"
(tests/test_data_wordpiece.py pins both cases against the reference).
"""

from __future__ import annotations

import json
import os
import unicodedata
from collections.abc import Iterable, Sequence

import numpy as np

from bert_jax.data.tokenizers.interface import (
    SPECIAL_TOKENS,
    UNK,
    VOCAB_NAME,
    Tokenizer,
    special_token_pattern,
)
from bert_jax.runtime import fs
from bert_jax.runtime.errors import UserError
from bert_jax.runtime.outputs import write_bytes_atomic

HF_TOKENIZER_JSON = "tokenizer.json"

# Bound on the per-word cache; natural text has a heavy-tailed vocabulary, so a modest cache
# catches nearly every repeat while keeping worker memory flat on huge corpora.
_WORD_CACHE_SIZE = 200_000
_CHAR_TABLE_SIZE = 65_536


def _is_whitespace(char: str) -> bool:
    if char in " \t\n\r":
        return True
    return unicodedata.category(char) == "Zs"


def _is_control(char: str) -> bool:
    if char in "\t\n\r":
        return False
    return unicodedata.category(char).startswith("C")


def _is_punctuation(char: str) -> bool:
    cp = ord(char)
    # All non-letter/number ASCII counts as punctuation, as in the original BERT.
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _is_cjk(cp: int) -> bool:
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


# ASCII fast path: the per-character rules below as one `str.translate` (control characters
# dropped, each punctuation character spaced out so that `split` makes it a word of its own).
_ASCII_CLEAN: dict[int, str | None] = {cp: None for cp in range(32) if chr(cp) not in "\t\n\r"}
_ASCII_CLEAN[127] = None
_ASCII_TABLE = dict(_ASCII_CLEAN)
_ASCII_TABLE.update({cp: f" {chr(cp)} " for cp in range(33, 127) if _is_punctuation(chr(cp))})


class _CharTable(dict):
    """A ``str.translate`` table that computes a character's replacement on first sight."""

    def __init__(self, rule):
        super().__init__()
        self._rule = rule

    def __missing__(self, cp: int) -> str | None:
        if len(self) >= _CHAR_TABLE_SIZE:  # bounded, whatever scripts a corpus mixes
            self.clear()
        value = self[cp] = self._rule(chr(cp))
        return value


def _clean_char(char: str) -> str | None:
    """BERT's text cleaning: drop NUL, U+FFFD and controls, whitespace to " ", CJK spaced out."""
    cp = ord(char)
    if cp == 0 or cp == 0xFFFD or _is_control(char):
        return None
    if _is_whitespace(char):
        return " "
    return f" {char} " if _is_cjk(cp) else char


# Any text: the same rules, one table lookup per character after the first sight of it.
_CLEAN_TABLE = _CharTable(_clean_char)
_PUNCT_TABLE = _CharTable(lambda char: f" {char} " if _is_punctuation(char) else char)


def _basic_tokenize_piece(
    text: str, lowercase: bool, never_split: frozenset[str] = frozenset()
) -> list[str]:
    """BERT's BasicTokenizer on text between special tokens.

    ``never_split`` words stay whole (Hugging Face keeps a special token that only appears once
    control characters are dropped, e.g. "[SE\\x00P]").
    """
    if text.isascii() and not (
        never_split and any(t in text.translate(_ASCII_CLEAN) for t in never_split)
    ):
        if lowercase:
            text = text.lower()
        return text.translate(_ASCII_TABLE).split()

    text = unicodedata.normalize("NFC", text.translate(_CLEAN_TABLE))
    words: list[str] = []
    for word in text.split():
        if word in never_split:
            words.append(word)
            continue
        if lowercase:
            word = word.lower()
            if not word.isascii():
                word = "".join(
                    c for c in unicodedata.normalize("NFD", word) if unicodedata.category(c) != "Mn"
                )
        words.append(word.translate(_PUNCT_TABLE))
    # Accent stripping can leave a word empty or with inner whitespace; re-split like the original.
    return " ".join(words).split()


_DECODE_CLEANUP = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


class WordPieceTokenizer(Tokenizer):
    """Google's WordPiece vocabulary (``vocab.txt``), one token per line, id = line number."""

    kind = "wordpiece"

    def __init__(self, vocab: Sequence[str], lowercase: bool, max_chars_per_word: int = 100):
        self.vocab = list(vocab)
        self.token_to_id: dict[str, int] = {}
        for index, token in enumerate(self.vocab):
            # Hugging Face keeps the last id of a duplicated line; do the same.
            self.token_to_id[token] = index
        self.lowercase = bool(lowercase)
        self.max_chars_per_word = max_chars_per_word
        self.vocab_size = len(self.vocab)
        missing = [t for t in SPECIAL_TOKENS if t not in self.token_to_id]
        if missing:
            raise UserError(
                f"WordPiece vocabulary lacks the special token(s) {', '.join(missing)}; BERT needs "
                f"all of {', '.join(SPECIAL_TOKENS)} (one per line in vocab.txt)."
            )
        ids = [self.token_to_id[t] for t in SPECIAL_TOKENS]
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = ids
        self._special_re = special_token_pattern(SPECIAL_TOKENS)
        self._special_set = frozenset(SPECIAL_TOKENS)
        # word -> its WordPiece ids; a per-process speed-up (most words repeat).
        self._word_cache: dict[str, list[int]] = {}
        self._word_start_table = np.array([not t.startswith("##") for t in self.vocab], dtype=bool)
        # Bracketed entries ([PAD], [unused0], ...) and the original vocab's <S>/<T> markers are
        # not text; a random replacement must never produce them.
        self._ordinary_table = np.array(
            [
                not (t.startswith("[") and t.endswith("]") and len(t) > 2)
                and t not in ("<S>", "<T>")
                and t != ""
                for t in self.vocab
            ],
            dtype=bool,
        )

    def __getstate__(self) -> dict:
        # The word cache is a per-process speed-up; don't ship it to worker processes.
        state = dict(self.__dict__)
        state["_word_cache"] = {}
        return state

    @classmethod
    def from_file(cls, vocab_file: str, lowercase: bool | None = None) -> WordPieceTokenizer:
        with fs.open(vocab_file, "rb") as f:
            raw = f.read().split(b"\n")
        try:
            vocab = [line.decode("utf-8").rstrip("\r") for line in raw]
        except UnicodeDecodeError:
            line = next(i for i, b in enumerate(raw, 1) if not _is_utf8(b))
            raise UserError(
                f"{vocab_file}: line {line} is not UTF-8 text; a WordPiece vocab.txt holds one "
                "token per line"
            ) from None
        if vocab and vocab[-1] == "":
            vocab.pop()
        if lowercase is None:
            lowercase = infer_lowercase(vocab)
        return cls(vocab, lowercase)

    @classmethod
    def from_hf_json(cls, path: str, lowercase: bool | None = None) -> WordPieceTokenizer:
        """Hugging Face's ``tokenizer.json`` holding a BERT WordPiece model (what transformers 5
        saves in place of ``vocab.txt``); anything this class would not reproduce is refused."""
        spec = read_json(path)
        model = spec.get("model") or {}
        if model.get("type") != "WordPiece":
            raise UserError(
                f"{path}: a {model.get('type')!r} tokenizer model; only BERT's WordPiece is read "
                "from tokenizer.json (use a SentencePiece .model for other vocabularies)"
            )
        settings = (model.get("continuing_subword_prefix", "##"), model.get("unk_token", UNK))
        if settings != ("##", UNK):
            raise UserError(f"{path}: WordPiece with prefix/unknown {settings}, not ('##', {UNK})")
        normalizer = spec.get("normalizer") or {}
        if normalizer.get("type") != "BertNormalizer":
            raise UserError(f"{path}: normalizer {normalizer.get('type')!r}, not BertNormalizer")
        stored = bool(normalizer.get("lowercase", True))
        strip = normalizer.get("strip_accents")
        if (strip is not None and bool(strip) != stored) or not normalizer.get(
            "handle_chinese_chars", True
        ):
            raise UserError(
                f"{path}: strip_accents={strip}, handle_chinese_chars="
                f"{normalizer.get('handle_chinese_chars')} with lowercase={stored}: BERT's "
                "tokenizer strips accents exactly when it lower-cases and splits CJK characters"
            )
        by_id = sorted((int(i), token) for token, i in model["vocab"].items())
        if [i for i, _ in by_id] != list(range(len(by_id))):
            raise UserError(f"{path}: vocabulary ids are not 0..{len(by_id) - 1} without gaps")
        return cls(
            [token for _, token in by_id],
            stored if lowercase is None else lowercase,
            int(model.get("max_input_chars_per_word", 100)),
        )

    def _word_ids(self, word: str) -> list[int]:
        """Greedy longest-match-first WordPiece of one word, memoised."""
        lookup = self.token_to_id
        if len(word) > self.max_chars_per_word:
            ids = [self.unk_id]
        else:
            ids = []
            start = 0
            while start < len(word):
                end = len(word)
                found = None
                while start < end:
                    candidate = word[start:end] if start == 0 else "##" + word[start:end]
                    found = lookup.get(candidate)
                    if found is not None:
                        break
                    end -= 1
                if found is None:
                    ids = [self.unk_id]
                    break
                ids.append(found)
                start = end
        if len(self._word_cache) >= _WORD_CACHE_SIZE:
            self._word_cache.clear()
        self._word_cache[word] = ids
        return ids

    def _encode_words(self, words: list[str], out: list[int]) -> None:
        cache = self._word_cache
        for word in words:
            ids = cache.get(word)
            out += ids if ids is not None else self._word_ids(word)

    def encode(self, text: str, allow_special: bool = True) -> list[int]:
        ids: list[int] = []
        if not allow_special:
            self._encode_words(_basic_tokenize_piece(text, self.lowercase), ids)
            return ids
        for index, part in enumerate(self._special_re.split(text)):
            if index % 2 == 1:
                ids.append(self.token_to_id[part])
            elif part:
                words = _basic_tokenize_piece(part, self.lowercase, self._special_set)
                self._encode_words(words, ids)
        return ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """``encode(text, allow_special=False)`` for each text (all ASCII: one pass for all)."""
        joined = "\n".join(texts)
        if not joined.isascii() or joined.count("\n") != len(texts) - 1:
            return [self.encode(text, allow_special=False) for text in texts]
        if self.lowercase:
            joined = joined.lower()
        out = []
        for line in joined.translate(_ASCII_TABLE).split("\n"):
            ids: list[int] = []
            self._encode_words(line.split(), ids)
            out.append(ids)
        return out

    def tokenize(self, text: str, allow_special: bool = True) -> list[str]:
        vocab = self.vocab
        return [vocab[i] for i in self.encode(text, allow_special)]

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.vocab[int(i)] if 0 <= int(i) < self.vocab_size else UNK for i in ids]

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        return [self.token_to_id.get(t, self.unk_id) for t in tokens]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        special = set(self.special_ids.values())
        tokens = [
            self.vocab[int(i)]
            for i in ids
            if 0 <= int(i) < self.vocab_size and not (skip_special_tokens and int(i) in special)
        ]
        text = " ".join(tokens).replace(" ##", "").strip()
        # Hugging Face's default clean-up, so decoded text reads (and compares) the same.
        for spaced, joined in _DECODE_CLEANUP:
            text = text.replace(spaced, joined)
        return text

    def _save_files(self, directory: str) -> None:
        text = "".join(token + "\n" for token in self.vocab)
        write_bytes_atomic(os.path.join(directory, VOCAB_NAME), text.encode("utf-8"))

    def _fingerprint_bytes(self) -> bytes:
        return "\n".join(self.vocab).encode("utf-8")


def infer_lowercase(vocab: Sequence[str]) -> bool:
    """An uncased Google vocabulary has no entry that lower-casing would change (outside its
    bracketed entries); a cased one has thousands."""
    for token in vocab:
        if token.startswith("[") and token.endswith("]"):
            continue
        if token in ("<S>", "<T>"):
            continue
        # `lower()` rather than `isupper()`: symbols such as "ℝ" are category Lu but have no
        # lower-case form, and the uncased vocabulary does contain them.
        if token != token.lower():
            return False
    return True


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def read_json(path: str) -> dict:
    """A tokenizer's JSON file as a dict; a damaged one is a `UserError` naming it."""
    with fs.open(path, "rb") as f:
        data = f.read()
    try:
        value = json.loads(data.decode("utf-8"))
    except ValueError as err:  # not UTF-8, not JSON
        raise UserError(f"{path} is damaged: not a JSON file ({err})") from None
    if not isinstance(value, dict):
        raise UserError(f"{path} is damaged: not a JSON object")
    return value
