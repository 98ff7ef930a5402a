"""`convert(src_format, src, dst_format, dst)`: one checkpoint format to another, with a report.

Sources: "tf1" (Google's checkpoint directory), "hf" (a Hugging Face BERT directory), "bert-jax"
(a model directory; a pretraining workdir too with the loader that reads one, which `bert-jax
convert` passes: `training.load_model.load_model_dir`). Targets: "bert-jax" (a model directory)
and "hf" (config.json + model.safetensors + tokenizer files, loadable by transformers'
`BertForPreTraining.from_pretrained`, or `BertModel` for an encoder-only model). A ModernBERT
source, "hf" or "bert-jax" (config.json's model_type), converts through `hf_modernbert.convert`.

Everything is read and checked before anything is written, and the destination is written
atomically: a refused conversion leaves nothing at `dst`. `overwrite` replaces only an earlier
output of the same kind (`runtime.outputs.check_replaceable`); a Hugging Face export carries
`bert_jax_export.json` for that.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from flax import traverse_util

from bert_jax.convert import hf, hf_finetuned, hf_modernbert, mapping, model_dir
from bert_jax.convert.hf import HF_EXPORT_KIND, HF_EXPORT_MARKER  # noqa: F401 (read from here)
from bert_jax.convert.request import Request, source_tokenizer, write_output
from bert_jax.convert.strict import ConversionReport, check_params
from bert_jax.core.model import BertConfig
from bert_jax.runtime import fs
from bert_jax.runtime import outputs as files
from bert_jax.runtime.errors import UserError

SOURCE_FORMATS = ("tf1", "hf", "bert-jax")
TARGET_FORMATS = ("bert-jax", "hf")


@dataclasses.dataclass
class Loaded:
    """A source checkpoint in memory: bert-jax params (NumPy) plus config and tokenizer."""

    config: BertConfig
    params: dict[str, Any]
    tokenizer: Any  # data.tokenizers.interface.Tokenizer or None
    report: ConversionReport


def load_source(
    src_format: str,
    src: str | os.PathLike,
    *,
    drop_heads: bool = False,
    tokenizer: str | os.PathLike | None = None,
    lowercase: bool | None = None,
    load_model_dir: Callable[[str], model_dir.ModelDir] = model_dir.load_model_dir,
) -> Loaded:
    """Reads and strictly converts a source checkpoint into bert-jax params (nothing written).

    `tokenizer` replaces the source's own tokenizer files; `lowercase` overrides the case setting
    (a Google vocab.txt does not record it: it is inferred from the vocabulary unless given).
    `load_model_dir` reads a "bert-jax" source: by default a model directory (or the one a
    finished pretraining workdir exported); `training.load_model.load_model_dir` also reads an
    unexported workdir's latest checkpoint.
    """
    src = os.fspath(src)
    report = ConversionReport(source_format=src_format, source=fs.abspath(src))
    tok_origin = None
    if src_format == "tf1":
        from bert_jax.convert import tf1

        checkpoint = tf1.read_tf1_dir(src)
        report.source = fs.abspath(checkpoint.prefix)
        config = checkpoint.config
        params = tf1.params_from_tf1(checkpoint, drop_heads=drop_heads, report=report)
        if checkpoint.vocab_file is not None:
            tok_origin = checkpoint.vocab_file
    elif src_format == "hf":
        checkpoint = hf.read_hf_dir(src)
        config = hf.config_from_hf(checkpoint.config)
        params = hf.import_state(
            checkpoint.shapes,
            checkpoint.read,
            config,
            drop_heads=drop_heads,
            report=report,
            origin=f"Hugging Face checkpoint {', '.join(checkpoint.weight_files)}",
        )
        from bert_jax.data.tokenizers.load_or_train import has_tokenizer_files

        if has_tokenizer_files(src):  # vocab.txt, tokenizer.json or a SentencePiece .model
            tok_origin = src
    elif src_format == "bert-jax":
        loaded = load_model_dir(src)
        report.source = loaded.path
        config = loaded.config
        params = jax.tree.map(np.asarray, loaded.params)
        if drop_heads and loaded.has_heads:
            params = {"bert": params["bert"]}
            report.notes.append("the model's MLM/NSP heads were dropped")
        report.config = config
        report.has_heads = "predictions" in params
        names = sorted(traverse_util.flatten_dict(params, sep="/"))
        report.tensors_read = len(names)
        report.used = names
        report.num_parameters = count_parameters(params, config)
        if not report.has_heads:
            report.notes.append("encoder-only model: no MLM/NSP pretraining heads")
        if loaded.has_tokenizer:
            tok_origin = loaded.tokenizer_path
    else:
        raise UserError(f"unknown source format {src_format!r}; expected one of {SOURCE_FORMATS}")

    tok = source_tokenizer(tok_origin, tokenizer, lowercase, config, report)
    return Loaded(config, params, tok, report)


def convert(
    src_format: str,
    src: str | os.PathLike,
    dst_format: str,
    dst: str | os.PathLike,
    *,
    drop_heads: bool = False,
    tokenizer: str | os.PathLike | None = None,
    lowercase: bool | None = None,
    overwrite: bool = False,
    vocab_pad_multiple: int | None = None,
    load_model_dir: Callable[[str], model_dir.ModelDir] = model_dir.load_model_dir,
) -> ConversionReport:
    """Converts `src` (in `src_format`) into `dst` (in `dst_format`) and returns the report.

    `vocab_pad_multiple` (bert-jax targets only) pads the word-embedding rows as
    `BertConfig.vocab_pad_multiple` says, e.g. 128 to match the pretraining configs; default:
    the source's padding (none for Google and Hugging Face checkpoints). `load_model_dir`: how a
    "bert-jax" source is read (see `load_source`).

    A ModernBERT source (config.json's model_type, `hf_modernbert.is_modernbert`) goes to
    `hf_modernbert.convert`, a fine-tuned one of either family (a task entry, or a transformers
    task class: `hf_finetuned.is_finetuned`) to `hf_finetuned.convert`, after the destination's
    checks here; both read and write as this path does (`request.py`).

    Raises `ConversionError` (naming the tensor or setting) before writing anything when the
    source does not convert exactly; `UserError` when `dst` exists and not `overwrite`.
    """
    finetuned = hf_finetuned.is_finetuned(src_format, src)
    if finetuned and vocab_pad_multiple is not None:
        raise UserError("--vocab-pad-multiple applies to pretrained models, not fine-tuned ones")
    modern = not finetuned and hf_modernbert.is_modernbert(src_format, src)
    if dst_format not in TARGET_FORMATS:
        raise UserError(f"unknown target format {dst_format!r}; expected one of {TARGET_FORMATS}")
    if vocab_pad_multiple is not None and dst_format != "bert-jax":
        raise UserError(
            f"--vocab-pad-multiple applies to --to bert-jax only (a {dst_format} checkpoint "
            "holds exactly vocab_size rows)"
        )
    request = Request(
        src_format,
        fs.abspath(os.fspath(src)),
        dst_format,
        fs.abspath(os.fspath(dst)),
        drop_heads=drop_heads,
        tokenizer=tokenizer,
        lowercase=lowercase,
        overwrite=overwrite,
        vocab_pad_multiple=vocab_pad_multiple,
        load_model_dir=load_model_dir,
    )
    dst = request.dst
    if (fs.exists(dst) if fs.is_remote(dst) else os.path.lexists(dst)) and not overwrite:
        raise UserError(f"{dst} already exists (pass --overwrite to replace it)")
    # Refuse a destination bert-jax did not write before reading anything (the write checks again).
    files.check_replaceable(
        dst, model_dir.MODEL_DIR_KIND if dst_format == "bert-jax" else HF_EXPORT_KIND
    )
    if request.src == dst:
        raise UserError(f"source and destination are the same path: {dst}")
    if finetuned:
        return hf_finetuned.convert(request)
    if modern:
        return hf_modernbert.convert(request)
    loaded = load_source(
        src_format,
        request.src,
        drop_heads=drop_heads,
        tokenizer=tokenizer,
        lowercase=lowercase,
        load_model_dir=load_model_dir,
    )
    report = loaded.report
    if vocab_pad_multiple is not None:
        config = loaded.config.replace(vocab_pad_multiple=vocab_pad_multiple)
        loaded = dataclasses.replace(
            loaded, config=config, params=mapping.repad_vocab(loaded.params, config)
        )
        report.config = config
    check_params(loaded.params, loaded.config, f"converted {src_format} params")
    write_output(
        request,
        report,
        loaded.config,
        loaded.params,
        loaded.tokenizer,
        lambda folder: hf.write_hf_dir(folder, loaded.config, loaded.params, loaded.tokenizer),
    )
    if dst_format == "hf" and not report.has_heads:
        report.notes.append("written as a BertModel checkpoint (no pretraining heads)")
    return report


def count_parameters(params, config) -> int:
    """Parameters as every direction of `convert` counts them: a vocabulary-padding row of a
    bert-jax model (config.vocab_pad_multiple) is not a parameter of the model it converts to or
    from."""
    total = 0
    for path, value in traverse_util.flatten_dict(params).items():
        shape = np.shape(value)
        if mapping.is_vocab_path(path) and shape:
            shape = (min(shape[0], config.vocab_size), *shape[1:])
        total += int(np.prod(shape))
    return total
