"""Any tokenizer from its files, or a SentencePiece model trained from a corpus; and the check
that prepared records were made with a given tokenizer.

Public API:

- ``load_tokenizer(path) -> Tokenizer``: ``path`` is a directory written by ``Tokenizer.save`` /
  ``bert-jax tokenizer train`` (or a model directory, or a Hugging Face BERT directory holding
  ``vocab.txt`` + ``tokenizer_config.json`` or only ``tokenizer.json``), a SentencePiece
  ``.model`` file, a WordPiece ``vocab.txt`` or a Hugging Face ``tokenizer.json``.
  ``lowercase=None`` reads the setting from the directory's JSON, else infers it for a
  ``vocab.txt`` (an uncased Google vocabulary holds no upper-case word pieces).
- ``train_tokenizer(sources, output_dir, settings, ...)``: the one path from a
  corpus (text files, JSONL, ``tfds:``, ``embedded``) to a SentencePiece model
  (``bert-jax tokenizer train``, the pretraining run without a tokenizer, the bench);
  ``train_sentencepiece`` on one-sentence-per-line text files.
- ``check_prepared_with(tokenizer, named_sources, whose)``: prepared records whose recorded
  tokenizer is another are refused in one line naming both (pretraining, ``eval`` and dynamic
  masking share it).
- ``Tokenizer`` (``interface.py``): ``vocab_size``, ``pad_id, unk_id, cls_id, sep_id,
  mask_id``, ``lowercase``, ``tokenize(text) -> list[str]``, ``encode(text) -> list[int]`` (no
  special tokens added), ``encode_batch(texts)`` (many texts at once, special-token strings kept
  as text), ``convert_ids_to_tokens(ids)``, ``convert_tokens_to_ids(tokens)``, ``decode(ids)``,
  ``word_start(ids) -> np.ndarray[bool]`` (which ids begin a new word; whole-word masking),
  ``special_ids``, ``ordinary_ids`` (ids a random MLM replacement may take), ``save(directory)``,
  ``check_vocab_size(model_vocab_size)``. Implementations: ``wordpiece.WordPieceTokenizer``
  (exactly Hugging Face's slow ``BertTokenizer``) and
  ``sentencepiece.SentencePieceTokenizer``.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Sequence

from bert_jax.data.tokenizers.hf_bpe import HfBpeTokenizer, is_bpe_json
from bert_jax.data.tokenizers.interface import CONFIG_NAME, SPM_NAME, VOCAB_NAME, Tokenizer
from bert_jax.data.tokenizers.sentencepiece import (
    SentencePieceTokenizer,
    created_output_dir,
    train_sentencepiece,
)
from bert_jax.data.tokenizers.train_settings import TokenizerTrainSettings
from bert_jax.data.tokenizers.wordpiece import HF_TOKENIZER_JSON, WordPieceTokenizer, read_json
from bert_jax.runtime import declarations, fs
from bert_jax.runtime.errors import UserError, user_path


def has_tokenizer_files(directory: str | os.PathLike) -> bool:
    """Whether ``load_tokenizer(directory)`` finds a tokenizer there (without loading it)."""
    directory = os.fspath(directory)
    if not fs.isdir(directory):
        return False
    names = fs.listdir(directory)
    known = (CONFIG_NAME, VOCAB_NAME, HF_TOKENIZER_JSON, "tokenizer")
    return any(name in known or name.endswith(".model") for name in names)


def load_tokenizer(path: str | os.PathLike, lowercase: bool | None = None) -> Tokenizer:
    """Load a tokenizer directory, a SentencePiece ``.model`` or a WordPiece ``vocab.txt``.

    ``lowercase`` overrides the stored/inferred setting. A model directory or pretraining workdir
    (anything with a ``tokenizer/`` subdirectory) means that subdirectory. A directory is read in
    this order: our ``bert_jax_tokenizer.json``; else ``spiece.model`` or a single ``*.model``;
    else ``vocab.txt`` with Hugging Face's ``tokenizer_config.json`` (``do_lower_case``); else
    Hugging Face's ``tokenizer.json`` (a BERT WordPiece model and its lowercase setting, or a BPE
    model such as ModernBERT's: ``hf_bpe.HfBpeTokenizer``).
    """
    with user_path(path, "tokenizer"):
        return _load_tokenizer(os.fspath(path), lowercase)


def _load_tokenizer(path: str, lowercase: bool | None) -> Tokenizer:
    # A model directory or pretraining workdir keeps its tokenizer in `tokenizer/`.
    nested = os.path.join(path, "tokenizer")
    if fs.isdir(nested) and not fs.exists(os.path.join(path, CONFIG_NAME)):
        path = nested
    if fs.isdir(path):
        config_path = os.path.join(path, CONFIG_NAME)
        if fs.exists(config_path):
            config = read_json(config_path)
            stored_lowercase = bool(config.get("lowercase", False))
            lower = stored_lowercase if lowercase is None else lowercase
            kind = config.get("type")
            if kind == "sentencepiece":
                return SentencePieceTokenizer.from_file(os.path.join(path, SPM_NAME), lower)
            if kind == "wordpiece":
                return WordPieceTokenizer.from_file(os.path.join(path, VOCAB_NAME), lower)
            if kind == HfBpeTokenizer.kind:
                return HfBpeTokenizer.from_file(os.path.join(path, HF_TOKENIZER_JSON), lowercase)
            raise UserError(f"{config_path}: unknown tokenizer type {kind!r}")
        models = sorted(f for f in fs.listdir(path) if f.endswith(".model"))
        if SPM_NAME in models:
            models = [SPM_NAME]
        if len(models) == 1:
            return SentencePieceTokenizer.from_file(os.path.join(path, models[0]), bool(lowercase))
        if len(models) > 1:
            raise UserError(
                f"{path} holds several SentencePiece models ({', '.join(models)}); pass one file"
            )
        vocab_path = os.path.join(path, VOCAB_NAME)
        if fs.exists(vocab_path):
            if lowercase is None:
                hf_config = os.path.join(path, "tokenizer_config.json")
                if fs.exists(hf_config):
                    value = read_json(hf_config).get("do_lower_case")
                    lowercase = None if value is None else bool(value)
            return WordPieceTokenizer.from_file(vocab_path, lowercase)
        hf_json = os.path.join(path, HF_TOKENIZER_JSON)
        if fs.exists(hf_json):
            if is_bpe_json(hf_json):
                return HfBpeTokenizer.from_file(hf_json, lowercase)
            return WordPieceTokenizer.from_hf_json(hf_json, lowercase)
        raise UserError(
            f"{path} holds no tokenizer: expected {CONFIG_NAME}, a SentencePiece .model file, "
            f"{VOCAB_NAME} or {HF_TOKENIZER_JSON}"
        )
    if not fs.exists(path):
        raise UserError(f"tokenizer not found: {path}")
    if path.endswith(".model"):
        return SentencePieceTokenizer.from_file(path, bool(lowercase))
    if path.endswith(".json"):
        if is_bpe_json(path):
            return HfBpeTokenizer.from_file(path, lowercase)
        return WordPieceTokenizer.from_hf_json(path, lowercase)
    with fs.open(path, "rb") as f:
        head = f.read(64)
    # A serialized SentencePiece ModelProto starts with a length-delimited field 1 (0x0a).
    if head[:1] == b"\n" and b"\x00" in head:
        return SentencePieceTokenizer.from_file(path, bool(lowercase))
    return WordPieceTokenizer.from_file(path, lowercase)


def train_tokenizer(
    sources: Sequence[str | os.PathLike],
    output_dir: str | os.PathLike,
    settings: TokenizerTrainSettings,
    tfds_data_dir: str | None = None,
    log: Callable[[str], None] | None = None,
    size_setting: str = "--vocab-size",
) -> SentencePieceTokenizer:
    """``train_sentencepiece`` over any corpus source with ``settings`` (``bert-jax tokenizer
    train``; a pretraining run without a tokenizer; the bench).

    Plain text files are handed to SentencePiece as they are (one sentence per line); JSONL,
    ``tfds:`` and ``embedded`` sources are first read with the corpus reader (which counts and
    skips bad input) into a temporary one-sentence-per-line file. ``log`` receives progress
    lines: what is read (every few seconds while a reader works), then the training's start and
    end. A failure names ``sources`` (never the temporary file) and ``size_setting`` (what set
    ``vocab_size``), and leaves no output directory that this call created. A setting out of
    its range is refused before anything is read.
    """
    from bert_jax.data.records import manifest
    from bert_jax.data.sources import kinds as sources_lib

    settings.check(size_setting)
    named = _listed([os.fspath(s) for s in sources])
    resolved = sources_lib.expand_sources(list(sources))
    manifest.check_text_inputs(resolved)  # binary or non-UTF-8 files: refused, nothing written

    def is_plain(source: str) -> bool:  # original-format text: SentencePiece reads it as it is
        kind = sources_lib.source_kind(source)
        return kind == "text" and sources_lib.is_original_format(source)

    plain = [s for s in resolved if is_plain(s)]
    others = [s for s in resolved if not is_plain(s)]
    say = log or (lambda line: None)
    # The settings' names are train_sentencepiece's arguments.
    options = dict(
        declarations.as_dict(settings), log=log, inputs_named=named, size_setting=size_setting
    )
    if plain:
        say(f"reading {len(plain)} text file(s) as they are: {_listed(plain)}")
    if not others:
        return train_sentencepiece(plain, output_dir=output_dir, **options)
    output_dir = os.fspath(output_dir)
    with created_output_dir(output_dir):
        with tempfile.NamedTemporaryFile(
            "w",
            encoding="utf-8",
            suffix=".txt",
            dir=None if fs.is_remote(output_dir) else output_dir,
            prefix=".sentences-",
            delete=False,
        ) as f:
            sentences_path = f.name
            try:
                _write_sentences(f, others, tfds_data_dir, say)
            except BaseException:
                f.close()
                os.remove(sentences_path)
                raise
        try:
            return train_sentencepiece([*plain, sentences_path], output_dir=output_dir, **options)
        finally:
            os.remove(sentences_path)


def _write_sentences(f, sources: Sequence[str], tfds_data_dir, say: Callable[[str], None]) -> None:
    """The sources' documents into ``f``, a sentence a line, with progress lines."""
    from bert_jax.data.sources import documents as sources_lib

    say(f"reading {_listed(sources)} into sentences")
    started = last = time.monotonic()
    documents = sentences = 0
    for document in sources_lib.iter_documents(sources, tfds_data_dir=tfds_data_dir):
        f.writelines(sentence + "\n" for sentence in document)
        documents, sentences = documents + 1, sentences + len(document)
        if time.monotonic() - last >= _PROGRESS_SECONDS:
            last = time.monotonic()
            rate = sentences / (last - started)
            say(f"  {documents:,} documents, {sentences:,} sentences ({rate:,.0f}/s)")
    say(
        f"read {documents:,} documents, {sentences:,} sentences in "
        f"{time.monotonic() - started:.1f} s"
    )


_PROGRESS_SECONDS = 5.0  # between reading lines


def _listed(sources: Sequence[str], shown: int = 3) -> str:
    names = ", ".join(os.fspath(s) for s in sources[:shown])
    return names + (f" and {len(sources) - shown} more" if len(sources) > shown else "")


def check_prepared_with(tokenizer: Tokenizer, named_sources, whose: str) -> None:
    """Refuses prepared records (``named_sources``: (what, path) pairs) whose recorded tokenizer
    is not ``tokenizer`` (``whose``: what it belongs to, e.g. "--model M's tokenizer"), naming
    both: the one check of pretraining, ``eval`` and dynamic masking. Corpora and foreign records
    (no recorded tokenizer) pass."""
    from bert_jax.data.layout import TOKENIZER_SUBDIR, read_prepare_config
    from bert_jax.data.sources.kinds import source_kind

    mine = tokenizer.fingerprint()
    for what, source in named_sources:
        if not source or source_kind(source) != "records" or not fs.isdir(source):
            continue
        theirs = (read_prepare_config(source) or {}).get("tokenizer_fingerprint")
        if theirs and theirs != mine:
            saved = os.path.join(source, TOKENIZER_SUBDIR)
            described = (
                _described(load_tokenizer(saved)) if fs.isdir(saved) else f"fingerprint {theirs}"
            )
            raise UserError(
                f"{what} {source} was prepared with another tokenizer ({described}) than "
                f"{whose} ({_described(tokenizer)}): prepare the records with {whose}"
            )


def _described(tokenizer: Tokenizer) -> str:
    """ "sentencepiece, 4000 pieces, fingerprint ..." """
    return f"{tokenizer.kind}, {tokenizer.vocab_size} pieces, fingerprint {tokenizer.fingerprint()}"
