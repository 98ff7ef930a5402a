"""SentencePiece and WordPiece tokenizers behind one interface.

Public API (other modules and engineers call these):

- ``load_tokenizer(path) -> Tokenizer``: ``path`` is a directory written by ``Tokenizer.save`` /
  ``bert-jax tokenizer train`` (or a model directory, or a Hugging Face BERT directory holding
  ``vocab.txt`` + ``tokenizer_config.json``), a SentencePiece ``.model`` file, or a WordPiece
  ``vocab.txt``. ``lowercase=None`` reads the setting from the directory's JSON, else infers it for
  a ``vocab.txt`` (an uncased Google vocabulary holds no upper-case word pieces).
- ``train_sentencepiece(input_files, vocab_size, output_dir, lowercase=False, ...) -> Tokenizer``
  on one-sentence-per-line text files, and ``train_tokenizer(sources, ...)`` on any corpus source
  (JSONL, ``tfds:``, ``embedded``; what ``bert-jax tokenizer train`` calls).
- ``Tokenizer``: ``vocab_size``, ``pad_id, unk_id, cls_id, sep_id, mask_id``, ``lowercase``,
  ``tokenize(text) -> list[str]``, ``encode(text) -> list[int]`` (no special tokens added),
  ``convert_ids_to_tokens(ids)``, ``convert_tokens_to_ids(tokens)``, ``decode(ids)``,
  ``word_start(ids) -> np.ndarray[bool]`` (which ids begin a new word; whole-word masking),
  ``special_ids``, ``ordinary_ids`` (ids a random MLM replacement may take), ``save(directory)``,
  ``check_vocab_size(model_vocab_size)``.
- ``encode_pair(tokenizer, text_a, text_b=None, max_seq_length=128) -> dict`` and
  ``encode_pairs(...)``: ``[CLS] A [SEP] (B [SEP])`` with the original run_classifier truncation,
  padded to a fixed length; returns ``input_ids``, ``input_mask``, ``segment_ids`` (int32).

The WordPiece path reproduces Hugging Face's slow Python ``BertTokenizer`` (``BertTokenizerLegacy``
in transformers 5) exactly: special tokens in the text are kept whole, control characters are
dropped, CJK ideographs become words, the text is NFC-normalised, an uncased vocabulary lower-cases
and strips accents, punctuation is split off, and a word longer than 100 characters becomes
``[UNK]``. Data preparation passes ``allow_special=False`` so that a literal "[SEP]" in a corpus is
ordinary text and can never inject a control token.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import unicodedata
from collections.abc import Iterable, Sequence

import numpy as np

from bert_jax.data.files import write_bytes_atomic, write_json_atomic

CONFIG_NAME = "bert_jax_tokenizer.json"
SPM_NAME = "spiece.model"
VOCAB_NAME = "vocab.txt"

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
# SentencePiece models from other projects (ALBERT, T5) spell pad/unk differently.
_SPM_ALIASES = {PAD: (PAD, "<pad>"), UNK: (UNK, "<unk>")}

# Bound on the per-word WordPiece cache; natural text has a heavy-tailed vocabulary, so a modest
# cache catches nearly every repeat while keeping worker memory flat on huge corpora.
_WORD_CACHE_SIZE = 200_000


class Tokenizer:
    """Common interface of the WordPiece and SentencePiece tokenizers (see the module docstring)."""

    kind: str
    lowercase: bool
    vocab_size: int
    pad_id: int
    unk_id: int
    cls_id: int
    sep_id: int
    mask_id: int
    # Per-id tables, length vocab_size.
    _word_start_table: np.ndarray
    _ordinary_table: np.ndarray

    # --- to implement -----------------------------------------------------------------------
    def tokenize(self, text: str, allow_special: bool = True) -> list[str]:
        raise NotImplementedError

    def encode(self, text: str, allow_special: bool = True) -> list[int]:
        raise NotImplementedError

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        raise NotImplementedError

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        raise NotImplementedError

    def _save_files(self, directory: str) -> None:
        raise NotImplementedError

    def _fingerprint_bytes(self) -> bytes:
        raise NotImplementedError

    # --- shared -------------------------------------------------------------------------------
    @property
    def special_ids(self) -> dict[str, int]:
        return {
            PAD: self.pad_id,
            UNK: self.unk_id,
            CLS: self.cls_id,
            SEP: self.sep_id,
            MASK: self.mask_id,
        }

    @property
    def word_start_table(self) -> np.ndarray:
        """bool[vocab_size]: True where an id begins a new word (special tokens included)."""
        return self._word_start_table

    @property
    def ordinary_ids(self) -> np.ndarray:
        """int32 ids that a random MLM replacement may take.

        Excludes special, control, unknown and ``[unused*]`` entries: the original draws from the
        whole vocabulary and so can insert [SEP] or [CLS] into the middle of a sequence.
        """
        return np.flatnonzero(self._ordinary_table).astype(np.int32)

    def word_start(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Which ids begin a new word: a WordPiece not starting with "##", a SentencePiece piece
        starting with "▁", and every special token. Used to group sub-tokens for whole-word masking.
        """
        ids = np.asarray(ids, dtype=np.int64)
        return self._word_start_table[ids]

    def check_vocab_size(self, model_vocab_size: int) -> None:
        """Fail before training when ids could index past the model's embedding table.

        An out-of-range id does not raise on accelerators; it silently reads garbage and is a
        known cause of NaN losses with the original code.
        """
        if self.vocab_size > model_vocab_size:
            raise ValueError(
                f"tokenizer vocabulary has {self.vocab_size} entries but the model's vocab_size is "
                f"{model_vocab_size}: ids >= {model_vocab_size} would index past the embedding "
                "table. Set the model's vocab_size to at least the tokenizer's."
            )

    def fingerprint(self) -> str:
        """A short hash of the vocabulary and settings; prepared data records it."""
        digest = hashlib.sha256(self._fingerprint_bytes())
        digest.update(json.dumps({"lowercase": self.lowercase, "kind": self.kind}).encode())
        return digest.hexdigest()[:16]

    def save(self, directory: str) -> None:
        """Write everything needed to load this tokenizer again with ``load_tokenizer``."""
        os.makedirs(directory, exist_ok=True)
        self._save_files(directory)
        config = {
            "type": self.kind,
            "lowercase": self.lowercase,
            "vocab_size": self.vocab_size,
            "special_tokens": self.special_ids,
        }
        write_json_atomic(os.path.join(directory, CONFIG_NAME), config)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(vocab_size={self.vocab_size}, lowercase={self.lowercase}, "
            f"fingerprint={self.fingerprint()})"
        )


# ----------------------------------------------------------------------------------------------
# WordPiece (Google's vocab.txt), matching Hugging Face's slow BertTokenizer.
# ----------------------------------------------------------------------------------------------


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


# ASCII fast path: the same rules as the per-character loop, expressed as one translate + regex.
_ASCII_CLEAN = {cp: None for cp in range(32) if chr(cp) not in "\t\n\r"}
_ASCII_CLEAN[127] = None
_ASCII_PUNCT = re.compile(r"([!-/:-@\[-`{-~])")


def _basic_tokenize_piece(
    text: str, lowercase: bool, never_split: frozenset[str] = frozenset()
) -> list[str]:
    """BERT's BasicTokenizer on text between special tokens.

    ``never_split`` words stay whole (Hugging Face keeps a special token that only appears once
    control characters are dropped, e.g. "[SE\\x00P]").
    """
    if text.isascii():
        text = text.translate(_ASCII_CLEAN)
        if not any(token in text for token in never_split):
            if lowercase:
                text = text.lower()
            return _ASCII_PUNCT.sub(r" \1 ", text).split()

    cleaned = []
    for char in text:
        cp = ord(char)
        if cp == 0 or cp == 0xFFFD or _is_control(char):
            continue
        if _is_whitespace(char):
            cleaned.append(" ")
        elif _is_cjk(cp):
            cleaned.append(f" {char} ")
        else:
            cleaned.append(char)
    text = unicodedata.normalize("NFC", "".join(cleaned))
    words: list[str] = []
    for word in text.split():
        if word in never_split:
            words.append(word)
            continue
        if lowercase:
            word = word.lower()
            word = "".join(
                c for c in unicodedata.normalize("NFD", word) if unicodedata.category(c) != "Mn"
            )
        current: list[str] = []
        for char in word:
            if _is_punctuation(char):
                if current:
                    words.append("".join(current))
                    current = []
                words.append(char)
            else:
                current.append(char)
        if current:
            words.append("".join(current))
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
            raise ValueError(
                f"WordPiece vocabulary lacks the special token(s) {', '.join(missing)}; BERT needs "
                f"all of {', '.join(SPECIAL_TOKENS)} (one per line in vocab.txt)."
            )
        self.pad_id = self.token_to_id[PAD]
        self.unk_id = self.token_to_id[UNK]
        self.cls_id = self.token_to_id[CLS]
        self.sep_id = self.token_to_id[SEP]
        self.mask_id = self.token_to_id[MASK]
        self._special_re = re.compile(
            "("
            + "|".join(re.escape(t) for t in sorted(SPECIAL_TOKENS, key=len, reverse=True))
            + ")"
        )
        self._special_set = frozenset(SPECIAL_TOKENS)
        self._word_cache: dict[str, list[str]] = {}
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
        with open(vocab_file, encoding="utf-8") as f:
            vocab = [line.rstrip("\n") for line in f]
        if vocab and vocab[-1] == "":
            vocab.pop()
        if lowercase is None:
            lowercase = infer_lowercase(vocab)
        return cls(vocab, lowercase)

    def _wordpiece(self, word: str) -> list[str]:
        cached = self._word_cache.get(word)
        if cached is not None:
            return cached
        if len(word) > self.max_chars_per_word:
            pieces = [UNK]
        else:
            pieces = []
            start = 0
            while start < len(word):
                end = len(word)
                piece = None
                while start < end:
                    candidate = word[start:end] if start == 0 else "##" + word[start:end]
                    if candidate in self.token_to_id:
                        piece = candidate
                        break
                    end -= 1
                if piece is None:
                    pieces = [UNK]
                    break
                pieces.append(piece)
                start = end
        if len(self._word_cache) >= _WORD_CACHE_SIZE:
            self._word_cache.clear()
        self._word_cache[word] = pieces
        return pieces

    def tokenize(self, text: str, allow_special: bool = True) -> list[str]:
        parts = self._special_re.split(text) if allow_special else [text]
        tokens: list[str] = []
        for index, part in enumerate(parts):
            if allow_special and index % 2 == 1:
                tokens.append(part)
                continue
            if not part:
                continue
            never_split = self._special_set if allow_special else frozenset()
            for word in _basic_tokenize_piece(part, self.lowercase, never_split):
                tokens.extend(self._wordpiece(word))
        return tokens

    def encode(self, text: str, allow_special: bool = True) -> list[int]:
        lookup = self.token_to_id
        return [lookup.get(t, self.unk_id) for t in self.tokenize(text, allow_special)]

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


# ----------------------------------------------------------------------------------------------
# SentencePiece.
# ----------------------------------------------------------------------------------------------


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model with BERT's five special tokens as (control or user) pieces."""

    kind = "sentencepiece"

    def __init__(self, model_proto: bytes, lowercase: bool = False):
        import sentencepiece as spm

        self._model_proto = bytes(model_proto)
        self.processor = spm.SentencePieceProcessor(model_proto=self._model_proto)
        self.lowercase = bool(lowercase)
        self.vocab_size = int(self.processor.get_piece_size())
        ids = {}
        missing = []
        for token in SPECIAL_TOKENS:
            found = None
            for alias in _SPM_ALIASES.get(token, (token,)):
                piece_id = self.processor.piece_to_id(alias)
                # piece_to_id answers unk_id for an unknown piece; confirm by reading it back.
                if self.processor.id_to_piece(piece_id) == alias:
                    found = piece_id
                    break
            if found is None:
                missing.append(token)
            else:
                ids[token] = found
        if missing:
            raise ValueError(
                f"SentencePiece model lacks the special piece(s) {', '.join(missing)}; train it "
                "with `bert-jax tokenizer train`, which reserves [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 "
                "[MASK]=4."
            )
        self.pad_id, self.unk_id = ids[PAD], ids[UNK]
        self.cls_id, self.sep_id, self.mask_id = ids[CLS], ids[SEP], ids[MASK]
        self.pieces = [self.processor.id_to_piece(i) for i in range(self.vocab_size)]
        special = set(ids.values())
        not_text = np.array(
            [
                i in special
                or self.processor.is_control(i)
                or self.processor.is_unknown(i)
                or self.processor.is_unused(i)
                for i in range(self.vocab_size)
            ],
            dtype=bool,
        )
        self._word_start_table = np.array([p.startswith("▁") for p in self.pieces], dtype=bool)
        self._word_start_table |= not_text
        # A bare "▁" piece is only the space before something else; never a useful replacement.
        self._ordinary_table = ~not_text & (np.array(self.pieces) != "▁")

    @classmethod
    def from_file(cls, model_file: str, lowercase: bool = False) -> SentencePieceTokenizer:
        with open(model_file, "rb") as f:
            return cls(f.read(), lowercase=lowercase)

    def __getstate__(self) -> dict:
        return {"model_proto": self._model_proto, "lowercase": self.lowercase}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["model_proto"], state["lowercase"])

    def _prepare(self, text: str) -> str:
        return text.lower() if self.lowercase else text

    def tokenize(self, text: str, allow_special: bool = True) -> list[str]:
        # Special pieces are control symbols: SentencePiece never produces them from text, so
        # `allow_special` has nothing to switch off here.
        return self.processor.encode(self._prepare(text), out_type=str)

    def encode(self, text: str, allow_special: bool = True) -> list[int]:
        return self.processor.encode(self._prepare(text), out_type=int)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Many sentences in one C++ call (SentencePiece releases the GIL per batch)."""
        return self.processor.encode([self._prepare(t) for t in texts], out_type=int)

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.pieces[int(i)] if 0 <= int(i) < self.vocab_size else UNK for i in ids]

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        return [self.processor.piece_to_id(t) for t in tokens]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        special = set(self.special_ids.values())
        keep = [int(i) for i in ids if not (skip_special_tokens and int(i) in special)]
        return self.processor.decode(keep)

    def _save_files(self, directory: str) -> None:
        write_bytes_atomic(os.path.join(directory, SPM_NAME), self._model_proto)

    def _fingerprint_bytes(self) -> bytes:
        return self._model_proto


# ----------------------------------------------------------------------------------------------
# Loading and training.
# ----------------------------------------------------------------------------------------------


def load_tokenizer(path: str | os.PathLike, lowercase: bool | None = None) -> Tokenizer:
    """Load a tokenizer directory, a SentencePiece ``.model`` or a WordPiece ``vocab.txt``.

    ``lowercase`` overrides the stored/inferred setting. A model directory or pretraining workdir
    (anything with a ``tokenizer/`` subdirectory) means that subdirectory. A directory is read in
    this order: our ``bert_jax_tokenizer.json``; else ``spiece.model`` or a single ``*.model``;
    else ``vocab.txt`` with Hugging Face's ``tokenizer_config.json`` (``do_lower_case``).
    """
    path = os.fspath(path)
    # A model directory or pretraining workdir keeps its tokenizer in `tokenizer/`.
    nested = os.path.join(path, "tokenizer")
    if os.path.isdir(nested) and not os.path.exists(os.path.join(path, CONFIG_NAME)):
        path = nested
    if os.path.isdir(path):
        config_path = os.path.join(path, CONFIG_NAME)
        if os.path.exists(config_path):
            with open(config_path, encoding="utf-8") as f:
                config = json.load(f)
            stored_lowercase = bool(config.get("lowercase", False))
            lower = stored_lowercase if lowercase is None else lowercase
            kind = config.get("type")
            if kind == "sentencepiece":
                return SentencePieceTokenizer.from_file(os.path.join(path, SPM_NAME), lower)
            if kind == "wordpiece":
                return WordPieceTokenizer.from_file(os.path.join(path, VOCAB_NAME), lower)
            raise ValueError(f"{config_path}: unknown tokenizer type {kind!r}")
        models = sorted(f for f in os.listdir(path) if f.endswith(".model"))
        if SPM_NAME in models:
            models = [SPM_NAME]
        if len(models) == 1:
            return SentencePieceTokenizer.from_file(os.path.join(path, models[0]), bool(lowercase))
        if len(models) > 1:
            raise ValueError(
                f"{path} holds several SentencePiece models ({', '.join(models)}); pass one file"
            )
        vocab_path = os.path.join(path, VOCAB_NAME)
        if os.path.exists(vocab_path):
            if lowercase is None:
                hf_config = os.path.join(path, "tokenizer_config.json")
                if os.path.exists(hf_config):
                    with open(hf_config, encoding="utf-8") as f:
                        value = json.load(f).get("do_lower_case")
                    lowercase = None if value is None else bool(value)
            return WordPieceTokenizer.from_file(vocab_path, lowercase)
        raise FileNotFoundError(
            f"{path} holds no tokenizer: expected {CONFIG_NAME}, a SentencePiece .model file or "
            f"{VOCAB_NAME}"
        )
    if not os.path.exists(path):
        raise FileNotFoundError(f"tokenizer not found: {path}")
    if path.endswith(".model"):
        return SentencePieceTokenizer.from_file(path, bool(lowercase))
    with open(path, "rb") as f:
        head = f.read(64)
    # A serialized SentencePiece ModelProto starts with a length-delimited field 1 (0x0a).
    if head[:1] == b"\n" and b"\x00" in head:
        return SentencePieceTokenizer.from_file(path, bool(lowercase))
    return WordPieceTokenizer.from_file(path, lowercase)


def train_sentencepiece(
    input_files: Sequence[str | os.PathLike],
    vocab_size: int,
    output_dir: str | os.PathLike,
    lowercase: bool = False,
    model_type: str = "unigram",
    character_coverage: float = 0.9995,
    input_sentence_size: int = 2_000_000,
    seed_sentencepiece_size: int = 1_000_000,
    num_threads: int | None = None,
    max_sentence_length: int = 16384,
) -> SentencePieceTokenizer:
    """Train a SentencePiece model on text files (one sentence per line) and save it.

    The five BERT special tokens get fixed ids [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4; [CLS],
    [SEP] and [MASK] are control symbols, so no text can ever encode to them. ``lowercase`` folds
    case inside the model (``nmt_nfkc_cf``) and in Python, so loaders that ignore our JSON still
    lower-case. Blank lines (document breaks) are skipped by SentencePiece. Sentences beyond
    ``input_sentence_size`` are sampled away, which bounds memory on huge corpora.
    """
    import sentencepiece as spm

    if vocab_size < len(SPECIAL_TOKENS) + 1:
        raise ValueError(f"--vocab-size {vocab_size} is too small; it must exceed 5")
    files = [os.fspath(f) for f in input_files]
    if not files:
        raise ValueError("no input files to train the tokenizer on")
    for f in files:
        if not os.path.isfile(f):
            raise FileNotFoundError(f"tokenizer training input not found: {f}")
    output_dir = os.fspath(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output_dir, prefix=".spm-train-") as tmp:
        prefix = os.path.join(tmp, "spiece")
        try:
            spm.SentencePieceTrainer.train(
                input=files,
                model_prefix=prefix,
                vocab_size=vocab_size,
                model_type=model_type,
                character_coverage=character_coverage,
                input_sentence_size=input_sentence_size,
                shuffle_input_sentence=True,
                seed_sentencepiece_size=seed_sentencepiece_size,
                max_sentence_length=max_sentence_length,
                num_threads=num_threads or max(1, os.cpu_count() or 1),
                pad_id=0,
                unk_id=1,
                bos_id=-1,
                eos_id=-1,
                pad_piece=PAD,
                unk_piece=UNK,
                control_symbols=[CLS, SEP, MASK],
                normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
                minloglevel=2,
            )
        except RuntimeError as err:
            raise ValueError(
                f"SentencePiece training failed on {', '.join(files)} with vocab_size "
                f"{vocab_size}: {err}"
            ) from err
        with open(prefix + ".model", "rb") as f:
            tokenizer = SentencePieceTokenizer(f.read(), lowercase=lowercase)
        # The human-readable piece list, for inspection only (loading needs just the model).
        os.replace(prefix + ".vocab", os.path.join(output_dir, "spiece.vocab"))
    tokenizer.save(output_dir)
    return tokenizer


def train_tokenizer(
    sources: Sequence[str | os.PathLike],
    vocab_size: int,
    output_dir: str | os.PathLike,
    lowercase: bool = False,
    tfds_data_dir: str | None = None,
    **sentencepiece_options,
) -> SentencePieceTokenizer:
    """``train_sentencepiece`` over any corpus source (``bert-jax tokenizer train``).

    Plain text files are handed to SentencePiece as they are (one sentence per line); JSONL,
    ``tfds:`` and ``embedded`` sources are first read with the corpus reader (which counts and
    skips bad input) into a temporary one-sentence-per-line file.
    """
    from bert_jax.data import sources as corpus_lib

    resolved = corpus_lib.expand_sources(list(sources))

    def is_plain(source: str) -> bool:
        base = source[:-3] if source.endswith(".gz") else source
        special = source.startswith(corpus_lib.TFDS_PREFIX) or source.split(":", 1)[0] == (
            corpus_lib.EMBEDDED
        )
        return not special and not base.endswith(".jsonl") and not source.endswith(".gz")

    plain = [s for s in resolved if is_plain(s)]
    others = [s for s in resolved if not is_plain(s)]
    if not others:
        return train_sentencepiece(
            plain, vocab_size, output_dir, lowercase, **sentencepiece_options
        )
    output_dir = os.fspath(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    with tempfile.NamedTemporaryFile(
        "w", encoding="utf-8", suffix=".txt", dir=output_dir, prefix=".sentences-", delete=False
    ) as f:
        for document in corpus_lib.iter_documents(others, tfds_data_dir=tfds_data_dir):
            f.writelines(sentence + "\n" for sentence in document)
        sentences_path = f.name
    try:
        return train_sentencepiece(
            [*plain, sentences_path], vocab_size, output_dir, lowercase, **sentencepiece_options
        )
    finally:
        os.remove(sentences_path)


# ----------------------------------------------------------------------------------------------
# Classification / encoding inputs.
# ----------------------------------------------------------------------------------------------


def truncate_pair(tokens_a: list, tokens_b: list, max_tokens: int) -> None:
    """Shorten the longer list from the end until both fit (run_classifier's rule, in place).

    On a tie the second list loses a token, as in the original.
    """
    excess = len(tokens_a) + len(tokens_b) - max_tokens
    if excess <= 0:
        return
    len_a, len_b = len(tokens_a), len(tokens_b)
    while len_a + len_b > max_tokens:
        if len_a > len_b:
            len_a -= 1
        else:
            len_b -= 1
    del tokens_a[len_a:]
    del tokens_b[len_b:]


def encode_pair(
    tokenizer: Tokenizer,
    text_a: str,
    text_b: str | None = None,
    max_seq_length: int = 128,
) -> dict[str, np.ndarray]:
    """``[CLS] A [SEP]`` or ``[CLS] A [SEP] B [SEP]``, truncated and padded to ``max_seq_length``.

    Returns int32 ``input_ids``, ``input_mask``, ``segment_ids`` of shape [max_seq_length].
    """
    if max_seq_length < (5 if text_b is not None else 3):
        raise ValueError(f"max_seq_length {max_seq_length} leaves no room for text")
    tokens_a = tokenizer.encode(text_a)
    if text_b is None:
        del tokens_a[max_seq_length - 2 :]
        ids = [tokenizer.cls_id, *tokens_a, tokenizer.sep_id]
        segments = [0] * len(ids)
    else:
        tokens_b = tokenizer.encode(text_b)
        truncate_pair(tokens_a, tokens_b, max_seq_length - 3)
        ids = [tokenizer.cls_id, *tokens_a, tokenizer.sep_id, *tokens_b, tokenizer.sep_id]
        segments = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
    input_ids = np.full(max_seq_length, tokenizer.pad_id, dtype=np.int32)
    input_mask = np.zeros(max_seq_length, dtype=np.int32)
    segment_ids = np.zeros(max_seq_length, dtype=np.int32)
    input_ids[: len(ids)] = ids
    input_mask[: len(ids)] = 1
    segment_ids[: len(ids)] = segments
    return {"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids}


def encode_pairs(
    tokenizer: Tokenizer,
    texts_a: Sequence[str],
    texts_b: Sequence[str] | None = None,
    max_seq_length: int = 128,
) -> dict[str, np.ndarray]:
    """``encode_pair`` over many examples, stacked into int32 arrays [N, max_seq_length]."""
    if texts_b is not None and len(texts_b) != len(texts_a):
        raise ValueError(f"{len(texts_a)} first texts but {len(texts_b)} second texts")
    rows = [
        encode_pair(tokenizer, a, None if texts_b is None else texts_b[i], max_seq_length)
        for i, a in enumerate(texts_a)
    ]
    if not rows:
        empty = np.zeros((0, max_seq_length), dtype=np.int32)
        return {"input_ids": empty, "input_mask": empty.copy(), "segment_ids": empty.copy()}
    return {key: np.stack([row[key] for row in rows]) for key in rows[0]}
