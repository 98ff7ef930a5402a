"""A BPE tokenizer from Hugging Face's `tokenizer.json` (ModernBERT's, GPT-NeoX-style byte-level
BPE), run by the `tokenizers` library behind the project's `Tokenizer` interface.

The file is kept as it was read: ids are exactly what transformers' fast tokenizer of the same
file gives (without the [CLS]/[SEP] its post-processor adds: the interface's `encode` adds no
special tokens). BERT's five special tokens ([PAD], [UNK], [CLS], [SEP], [MASK]) must be in it,
as ModernBERT's are. Case is the file's: `lowercase` says whether its normalizer lower-cases,
and cannot be changed from outside. The token tasks read it as running text: `encode_with_spans`
(SQuAD: each token's characters) and `encode_words` (CoNLL-2003: a word after the first with its
space mark).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence

import numpy as np

from bert_jax.data.tokenizers.interface import SPECIAL_TOKENS, UNK, Tokenizer
from bert_jax.runtime import fs
from bert_jax.runtime.errors import UserError
from bert_jax.runtime.outputs import write_bytes_atomic

TOKENIZER_JSON = "tokenizer.json"
# A token whose text starts with one of these begins a word: byte-level BPE's space, newline and
# tab marks, and SentencePiece's metaspace.
_WORD_MARKS = ("Ġ", "Ċ", "ĉ", "▁")


def model_type(spec: dict) -> str | None:
    """The `model.type` of a parsed tokenizer.json ("BPE", "WordPiece", ...)."""
    model = spec.get("model") or {}
    return model.get("type") if isinstance(model, dict) else None


def is_bpe_json(path: str) -> bool:
    """Whether the tokenizer.json at `path` holds a BPE model (this class's) rather than
    WordPiece (`wordpiece.WordPieceTokenizer.from_hf_json`'s)."""
    with fs.open(path, "rb") as f:
        try:
            spec = json.loads(f.read().decode("utf-8"))
        except ValueError:
            return False  # the WordPiece reader names what is wrong with it
    return isinstance(spec, dict) and model_type(spec) == "BPE"


def _lowercases(normalizer: dict | None) -> bool:
    """Whether a tokenizer.json normalizer lower-cases (Lowercase, BertNormalizer's flag, or
    either inside a Sequence)."""
    if not normalizer:
        return False
    kind = normalizer.get("type")
    if kind == "Lowercase":
        return True
    if kind == "BertNormalizer":
        return bool(normalizer.get("lowercase", True))
    if kind == "Sequence":
        return any(_lowercases(n) for n in normalizer.get("normalizers", []))
    return False


class HfBpeTokenizer(Tokenizer):
    """A BPE `tokenizer.json` with BERT's five special tokens among its added tokens."""

    kind = "bpe"

    def __init__(self, spec_text: str, origin: str = TOKENIZER_JSON):
        from tokenizers import Tokenizer as RustTokenizer

        try:
            spec = json.loads(spec_text)
        except ValueError as err:
            raise UserError(f"{origin} is damaged: not a JSON file ({err})") from None
        if not isinstance(spec, dict) or model_type(spec) != "BPE":
            found = model_type(spec) if isinstance(spec, dict) else None
            raise UserError(f"{origin}: a {found!r} tokenizer model, not BPE")
        self._spec_text = spec_text
        try:
            self._rust = RustTokenizer.from_str(spec_text)
            # The same tokenizer reading special tokens written in text as ordinary text.
            self._plain = RustTokenizer.from_str(spec_text)
        except Exception as err:  # the library's own error type for a malformed file
            raise UserError(f"{origin}: tokenizers cannot read it ({err})") from None
        self._plain.encode_special_tokens = True
        self.lowercase = _lowercases(spec.get("normalizer"))
        self.vocab_size = int(self._rust.get_vocab_size(with_added_tokens=True))
        ids = {token: self._rust.token_to_id(token) for token in SPECIAL_TOKENS}
        missing = [token for token, i in ids.items() if i is None]
        if missing:
            raise UserError(
                f"{origin} lacks the special token(s) {', '.join(missing)}; bert-jax needs all "
                f"of {', '.join(SPECIAL_TOKENS)} (ModernBERT's tokenizer has them)"
            )
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            int(ids[token]) for token in SPECIAL_TOKENS
        )
        tokens = [self._rust.id_to_token(i) or "" for i in range(self.vocab_size)]
        added = set(self._rust.get_added_tokens_decoder())
        self._word_start_table = np.array(
            [i in added or token.startswith(_WORD_MARKS) for i, token in enumerate(tokens)],
            dtype=bool,
        )
        # Added tokens (the special ones, [unused*], runs of spaces) are never a random
        # replacement; neither is an id the file leaves without a token.
        self._ordinary_table = np.array(
            [i not in added and token != "" for i, token in enumerate(tokens)], dtype=bool
        )

    @classmethod
    def from_file(cls, path: str, lowercase: bool | None = None) -> HfBpeTokenizer:
        with fs.open(path, "rb") as f:
            raw = f.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise UserError(f"{path} is damaged: not UTF-8 text") from None
        tokenizer = cls(text, origin=path)
        if lowercase is not None and bool(lowercase) != tokenizer.lowercase:
            case = "lower-cases" if tokenizer.lowercase else "keeps case"
            raise UserError(
                f"{path}: this BPE tokenizer {case} as its file says; a case setting "
                f"(lowercase={lowercase}) cannot change it"
            )
        return tokenizer

    def encode(self, text: str, allow_special: bool = True) -> list[int]:
        rust = self._rust if allow_special else self._plain
        return list(rust.encode(text, add_special_tokens=False).ids)

    def encode_with_spans(self, text: str) -> tuple[list[int], np.ndarray, np.ndarray]:
        """`encode(text, allow_special=False)`'s ids and each one's characters [start, end) in
        `text`, from the library's offsets (transformers' `return_offsets_mapping`), less the
        whitespace a token's space or newline mark stands for: a word's first token starts at
        the word, and a token of whitespace alone is empty where the next word begins. Tokens
        of one character's bytes (non-ASCII cut by byte-level BPE) each span that character."""
        encoding = self._plain.encode(text, add_special_tokens=False)
        starts, ends = [], []
        for start, end in encoding.offsets:
            while start < end and text[start].isspace():
                start += 1
            starts.append(start)
            ends.append(end)
        return list(encoding.ids), np.asarray(starts, np.int64), np.asarray(ends, np.int64)

    def encode_words(self, words: Sequence[str]) -> list[list[int]]:
        """Each word's ids as the text of the words joined by single spaces has them (a word
        after the first with its space mark, as in running text, where byte-level BPE
        tokenizes " word" unlike "word"): each token goes to the word its first character is
        in; a word no token starts in (a tokenizer whose tokens cross spaces) has none."""
        starts, text = [], ""
        for word in words:
            text += " " if starts else ""
            starts.append(len(text))
            text += word
        ids, token_starts, _ = self.encode_with_spans(text)
        owners = np.searchsorted(np.asarray(starts, np.int64), token_starts, side="right") - 1
        grouped: list[list[int]] = [[] for _ in words]
        for token_id, owner in zip(ids, owners, strict=True):
            grouped[max(int(owner), 0)].append(token_id)
        return grouped

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        encoded = self._plain.encode_batch(list(texts), add_special_tokens=False)
        return [list(e.ids) for e in encoded]

    def tokenize(self, text: str, allow_special: bool = True) -> list[str]:
        rust = self._rust if allow_special else self._plain
        return list(rust.encode(text, add_special_tokens=False).tokens)

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self._rust.id_to_token(int(i)) or UNK for i in ids]

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        found = (self._rust.token_to_id(t) for t in tokens)
        return [self.unk_id if i is None else int(i) for i in found]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self._rust.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def _save_files(self, directory: str) -> None:
        path = os.path.join(directory, TOKENIZER_JSON)
        write_bytes_atomic(path, self._spec_text.encode("utf-8"))

    def _fingerprint_bytes(self) -> bytes:
        return self._spec_text.encode("utf-8")

    def __getstate__(self) -> dict:
        # The Rust tokenizers are rebuilt from the file's text in a worker process.
        state = dict(self.__dict__)
        state.pop("_rust")
        state.pop("_plain")
        return state

    def __setstate__(self, state: dict) -> None:
        from tokenizers import Tokenizer as RustTokenizer

        self.__dict__.update(state)
        self._rust = RustTokenizer.from_str(self._spec_text)
        self._plain = RustTokenizer.from_str(self._spec_text)
        self._plain.encode_special_tokens = True
