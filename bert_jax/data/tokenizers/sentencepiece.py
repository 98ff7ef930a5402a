"""SentencePiece models with BERT's five special pieces: loading, encoding and training.

``train_sentencepiece`` trains on one-sentence-per-line text files
(``load_or_train.train_tokenizer`` is the one path from any corpus source to it). Encoding many
sentences is one C++ call (``encode_batch``), which is what data preparation uses.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np

from bert_jax.data.tokenizers.interface import (
    CLS,
    MASK,
    PAD,
    SEP,
    SPECIAL_TOKENS,
    SPM_NAME,
    UNK,
    Tokenizer,
    special_token_pattern,
)
from bert_jax.data.tokenizers.train_settings import TokenizerTrainSettings
from bert_jax.runtime import fs
from bert_jax.runtime.errors import UserError, user_path
from bert_jax.runtime.outputs import write_bytes_atomic

# SentencePiece models from other projects (ALBERT, T5) spell pad/unk differently.
_SPM_ALIASES = {PAD: (PAD, "<pad>"), UNK: (UNK, "<unk>")}


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
            raise UserError(
                f"SentencePiece model lacks the special piece(s) {', '.join(missing)}; train it "
                "with `bert-jax tokenizer train`, which reserves [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 "
                "[MASK]=4."
            )
        self.pad_id, self.unk_id = ids[PAD], ids[UNK]
        self.cls_id, self.sep_id, self.mask_id = ids[CLS], ids[SEP], ids[MASK]
        self.pieces = [self.processor.id_to_piece(i) for i in range(self.vocab_size)]
        # Special tokens written in text, under the spelling the model holds ("<pad>" in an
        # ALBERT or T5 model): what the exported Hugging Face tokenizer names them.
        self._special_in_text = {self.pieces[i]: i for i in ids.values()}
        self._special_re = special_token_pattern(self._special_in_text)
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
        with fs.open(model_file, "rb") as f:
            proto = f.read()
        try:
            return cls(proto, lowercase=lowercase)
        except RuntimeError as err:  # SentencePiece's "INTERNAL: ... ParseFromArray" and kin
            raise UserError(
                f"{model_file} is not a SentencePiece model (it does not parse as one); give a "
                "model written by `bert-jax tokenizer train` or spm_train, or a vocab.txt"
            ) from err

    def __getstate__(self) -> dict:
        return {"model_proto": self._model_proto, "lowercase": self.lowercase}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["model_proto"], state["lowercase"])

    def _prepare(self, text: str) -> str:
        return text.lower() if self.lowercase else text

    def tokenize(self, text: str, allow_special: bool = True) -> list[str]:
        return self.convert_ids_to_tokens(self.encode(text, allow_special))

    def encode(self, text: str, allow_special: bool = True) -> list[int]:
        if not allow_special:
            # Special pieces are control symbols: SentencePiece never produces them from text.
            return self.processor.encode(self._prepare(text), out_type=int)
        # Text between special tokens is encoded on its own, as Hugging Face does with added
        # tokens: "a [MASK] b" is "▁a", [MASK], "▁b" (SentencePiece drops the spaces around).
        ids: list[int] = []
        for index, part in enumerate(self._special_re.split(text)):
            if index % 2 == 1:
                ids.append(self._special_in_text[part])
            elif part:
                ids += self.processor.encode(self._prepare(part), out_type=int)
        return ids

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


def train_sentencepiece(
    input_files: Sequence[str | os.PathLike],
    vocab_size: int,
    output_dir: str | os.PathLike,
    lowercase: bool = TokenizerTrainSettings.lowercase,
    model_type: str = TokenizerTrainSettings.model_type,
    character_coverage: float = TokenizerTrainSettings.character_coverage,
    input_sentence_size: int = TokenizerTrainSettings.input_sentence_size,
    seed_sentencepiece_size: int = 1_000_000,
    num_threads: int | None = None,
    max_sentence_length: int = 16384,
    log: Callable[[str], None] | None = None,
    inputs_named: str | None = None,
    size_setting: str = "--vocab-size",
) -> SentencePieceTokenizer:
    """Train a SentencePiece model on text files (one sentence per line) and save it.

    The five BERT special tokens get fixed ids [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4; [CLS],
    [SEP] and [MASK] are control symbols, so no text can ever encode to them. ``lowercase`` folds
    case inside the model (``nmt_nfkc_cf``) and in Python, so loaders that ignore our JSON still
    lower-case. Blank lines (document breaks) are skipped by SentencePiece. Sentences beyond
    ``input_sentence_size`` (0: none) are sampled away, which bounds memory on huge corpora. The
    settings' defaults and ranges are ``TokenizerTrainSettings``' (train_settings.py). ``log``
    receives progress lines: the sentences counted in the inputs, the start and end of training.

    A corpus too small for ``vocab_size`` (a unigram model finds fewer pieces in it; only the
    training itself can tell) is a ``UserError`` saying the largest size it supports, naming
    the inputs (``inputs_named``: how to call them, default the files' names) and the setting
    (``size_setting``). A failed training leaves no output directory that it created.
    """
    import sentencepiece as spm

    TokenizerTrainSettings(
        vocab_size, lowercase, model_type, character_coverage, input_sentence_size
    ).check(size_setting)
    files = [os.fspath(f) for f in input_files]
    if not files:
        raise UserError("no input files to train the tokenizer on")
    for f in files:
        if not fs.isfile(f):
            raise UserError(f"tokenizer training input not found: {f}")
    named = inputs_named or ", ".join(files)
    output_dir = os.fspath(output_dir)
    # SentencePiece reads and writes local files only: inputs in a bucket are copied here first.
    local_dir = None if fs.is_remote(output_dir) else output_dir
    with (
        created_output_dir(output_dir),
        tempfile.TemporaryDirectory(dir=local_dir, prefix=".spm-train-") as tmp,
    ):
        files = [
            fs.copy_to_local(f, os.path.join(tmp, f"input-{i}.txt")) if fs.is_remote(f) else f
            for i, f in enumerate(files)
        ]
        prefix = os.path.join(tmp, "spiece")
        threads = num_threads or max(1, os.cpu_count() or 1)
        if log is not None:
            sentences = sum(count_sentences(f) for f in files)
            sampled = (
                f" (a sample of {input_sentence_size:,} of them)"
                if 0 < input_sentence_size < sentences
                else ""
            )
            log(
                f"training SentencePiece ({model_type}, {vocab_size:,} pieces) on {sentences:,} "
                f"sentences{sampled}, {threads} threads"
            )
        started = time.monotonic()
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
                num_threads=threads,
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
            raise _training_error(err, named, vocab_size, size_setting, model_type) from None
        if log is not None:
            log(f"trained in {time.monotonic() - started:.1f} s")
        with open(prefix + ".model", "rb") as f:
            tokenizer = SentencePieceTokenizer(f.read(), lowercase=lowercase)
        # The human-readable piece list, for inspection only (loading needs just the model).
        if fs.is_remote(output_dir):
            fs.upload(prefix + ".vocab", os.path.join(output_dir, "spiece.vocab"))
        else:
            os.replace(prefix + ".vocab", os.path.join(output_dir, "spiece.vocab"))
        tokenizer.save(output_dir)
    return tokenizer


# SentencePiece's words (trainer_interface.cc) when a corpus has fewer pieces than asked for,
# and when the size cannot hold the characters the vocabulary must cover.
_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")
_TOO_LOW = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")


def _training_error(
    err: RuntimeError, named: str, vocab_size: int, size_setting: str, model_type: str
) -> UserError:
    """SentencePiece's failure as one line naming the inputs and the setting, not its files."""
    too_high = _TOO_HIGH.search(str(err))
    if too_high:
        largest = int(too_high.group(2))
        return UserError(
            f"{size_setting} {vocab_size} is more than {named} supports: SentencePiece's "
            f"{model_type} model finds at most {largest:,} pieces in it (the five special tokens "
            f"included); give {size_setting} {largest} or less, or train on more text"
        )
    too_low = _TOO_LOW.search(str(err))
    if too_low:
        smallest = int(too_low.group(2))  # the characters and the special pieces together
        return UserError(
            f"{size_setting} {vocab_size} is less than {named} needs: the characters the "
            f"vocabulary must cover and the five special tokens take {smallest:,} pieces; give "
            f"{size_setting} {smallest} or more (a useful vocabulary is far larger), or a lower "
            "--character-coverage"
        )
    reason = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
    return UserError(
        f"SentencePiece training failed on {named} with {size_setting} {vocab_size}: {reason}"
    )


@contextlib.contextmanager
def created_output_dir(output_dir: str) -> Iterator[None]:
    """Creates ``output_dir`` (the ``--output`` flag named in a refusal) for the block; when the
    block fails, removes what was created here (the directory, with whatever was written into
    it, and any parent made for it). A directory that already existed is never removed."""
    created = _first_missing(output_dir)
    with user_path(output_dir, "--output", writing=True):
        fs.makedirs(output_dir, exist_ok=True)
    try:
        yield
    except BaseException:
        if created is not None:
            fs.rmtree(created, ignore_errors=True)
        raise


def _first_missing(path: str) -> str | None:
    """The outermost directory that creating ``path`` makes (``path`` itself in a bucket, which
    has no directories of its own), or None when it exists."""
    if fs.exists(path):
        return None
    if fs.is_remote(path):
        return path
    missing = path = fs.abspath(path)
    while not os.path.exists(os.path.dirname(path)) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
        missing = path
    return missing


def count_sentences(path: str) -> int:
    """Non-blank lines of a local text file (what SentencePiece trains on: one sentence a line)."""
    count = 0
    with open(path, "rb") as f:
        for line in f:
            count += bool(line.strip())
    return count
