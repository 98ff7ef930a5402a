"""Fine-tuned models to and from transformers' task classes, in both families.

`bert-jax convert --from bert-jax FINETUNED --to hf OUT` writes a fine-tuned model directory
(`model_dir`: the fine-tuning state's params {"bert": encoder, "classifier": head} and a task
entry) as the transformers class of its head kind (`task_heads.HEADS`:
BertForSequenceClassification, BertForMultipleChoice, BertForQuestionAnswering,
BertForTokenClassification and the ModernBertFor... classes), with transformers' `id2label`,
`label2id`, `num_labels`, `problem_type` (`task_heads.transformers_fields`), `finetuning_task`
(the task's name) and the tokenizer; weights are named by each family's one table
(`mapping.task_entries`, `modernbert_names.task_entries`). `--from hf DIR` of such a class
(fine-tuned anywhere: config.json's `architectures` names it) reads it back strictly into a
fine-tuned model directory that `predict` and `finetune --model` read. transformers'
BertForQuestionAnswering and BertForTokenClassification have no pooler: the export leaves it out,
the import starts a fresh one (as transformers initializes a head it does not find; unused by
those heads). `--drop-heads` converts the encoder alone, into a pretrained model directory or
transformers' BertModel / ModernBertModel.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from flax import traverse_util

from bert_jax.convert import (
    hf,
    hf_modernbert,
    hf_tokenizer,
    mapping,
    model_dir,
    modernbert_names,
    strict,
    task_heads,
)
from bert_jax.convert.request import Request, source_tokenizer, write_output
from bert_jax.convert.safetensors import write_safetensors
from bert_jax.convert.strict import ConversionError, ConversionReport
from bert_jax.core.modernbert_config import ModernBertConfig
from bert_jax.runtime import fs
from bert_jax.runtime.errors import UserError

# The longest sequence an imported model's task entry records where its tokenizer names none.
DEFAULT_MAX_SEQ_LENGTH = 512


def head_of(values: Mapping[str, Any]) -> str | None:
    """The head kind of a transformers config.json whose `architectures` names a task class
    (None for any other); a SequenceClassification class is "regression" where transformers
    reads it so (problem_type "regression", or one label and no problem_type)."""
    architectures = values.get("architectures") or [None]
    kinds = [k.name for k in task_heads.HEADS.values() if architectures[0] in k.classes.values()]
    if len(kinds) <= 1:
        return kinds[0] if kinds else None
    problem = values.get("problem_type")
    regression = problem == "regression" or (problem is None and _count(values) == 1)
    return "regression" if regression else "classification"


def _count(values: Mapping[str, Any]) -> int:
    """transformers' num_labels: the length of id2label where config.json has one."""
    return len(values.get("id2label") or {}) or int(values.get("num_labels", 2))


def is_finetuned(src_format: str, src: str | os.PathLike) -> bool:
    """Whether `convert --from src_format src` reads a fine-tuned model: a bert-jax model
    directory (or finetune workdir) with a task entry, or a transformers directory of a task
    class."""
    src = os.fspath(src)
    if src_format == "bert-jax":
        try:
            return model_dir.read_config(model_dir.resolve(src))[1].get("task") is not None
        except UserError:
            return False  # the pretrained path names what is wrong with it
    if src_format != "hf":
        return False
    values = hf_modernbert.read_config_json(src)
    return values is not None and head_of(values) is not None


# --- Names ---


def _table(config: Any, task: Mapping[str, Any]) -> list[tuple[Any, Callable, Callable, tuple]]:
    """(entry, to bert-jax, from bert-jax, transformers' shape) for every weight of the task's
    transformers class, from the family's table."""
    outputs = task_heads.get(task["head"]).num_outputs(task["labels"])
    if isinstance(config, ModernBertConfig):
        return [
            (
                entry,
                lambda e, v: modernbert_names.to_bert_jax(e, v, config),
                lambda e, v: modernbert_names.from_bert_jax(e, v, config),
                entry.hf_shape,
            )
            for entry in modernbert_names.task_entries(config, outputs, task_heads.ENCODER_KEY)
        ]
    return [
        (
            entry,
            lambda e, v: mapping.to_bert_jax(e, v, config, "hf"),
            lambda e, v: mapping.from_bert_jax(e, v, config, "hf"),
            mapping.task_source_shape(entry, config, outputs),
        )
        for entry in mapping.task_entries(config, task["head"])
    ]


def state_dict_from(
    params: Mapping[str, Any], config: Any, task: Mapping[str, Any]
) -> dict[str, np.ndarray]:
    """transformers' state dict (float32 NumPy) of the task's class from a fine-tuned model's
    params (its pooler left out where the class has none)."""
    return {
        entry.hf: np.ascontiguousarray(
            from_ours(entry, np.asarray(mapping.get_path(params, entry.path), np.float32)),
            dtype=np.float32,
        )
        for entry, _, from_ours, _ in _table(config, task)
    }


def params_from_state(
    shapes: Mapping[str, tuple[int, ...]],
    read: Callable[[str], np.ndarray],
    config: Any,
    task: Mapping[str, Any],
    origin: str,
    report: ConversionReport | None = None,
    drop_heads: bool = False,
) -> dict[str, Any]:
    """A fine-tuned model's params from the tensors of a transformers task class, strictly:
    every weight of the class present with its shape, every tensor used; a `ConversionError`
    naming each problem before anything is read otherwise (with `strict.DROP_HEADS_HINT` where
    the encoder alone would convert). `drop_heads`: the encoder alone, the head's tensors
    ignored."""
    table = _table(config, task)
    encoder = [row for row in table if row[0].path[0] == task_heads.ENCODER_KEY]
    if drop_heads:
        table = encoder
    problems = []
    encoder_problems = 0
    for entry, _, _, shape in table:
        if entry.hf not in shapes:
            problems.append(f"missing tensor {entry.hf!r} (shape {shape})")
        elif tuple(int(n) for n in shapes[entry.hf]) != tuple(shape):
            problems.append(
                f"tensor {entry.hf!r} has shape {tuple(shapes[entry.hf])} but this config and "
                f"head need {tuple(shape)}"
            )
        else:
            continue
        encoder_problems += entry.path[0] == task_heads.ENCODER_KEY
    wanted = {entry.hf for entry, *_ in table}
    prefix = encoder[0][0].hf.split(".")[0] + "."  # the encoder's names: "bert." or "model."
    ignored = {
        name: "head dropped on request (encoder-only output)"
        for name in shapes
        if drop_heads and name not in wanted and not name.startswith(prefix)
    }
    unused = sorted(name for name in shapes if name not in wanted and name not in ignored)
    if unused:
        shown = ", ".join(repr(name) for name in unused[:8])
        problems.append(
            f"{len(unused)} tensor(s) have no place in a {task['head']} model with this config: "
            f"{shown}{' and more' if len(unused) > 8 else ''}"
        )
    if problems:
        hint = "" if drop_heads or encoder_problems else f"\n{strict.DROP_HEADS_HINT}"
        raise ConversionError(
            f"{origin} does not match the model ({len(problems)} problem(s)):\n  - "
            + "\n  - ".join(problems)
            + hint
        )
    params: dict[str, Any] = {}
    for entry, to_ours, _, _ in table:
        value = np.asarray(read(entry.hf))
        if value.dtype.kind in "biuSUOc":
            raise ConversionError(f"tensor {entry.hf!r} has dtype {value.dtype}, expected floats")
        mapping.set_path(
            params, entry.path, np.ascontiguousarray(to_ours(entry, value), np.float32)
        )
    fresh = _fresh_pooler(params, config)
    if report is not None:
        report.config, report.has_heads = config, False
        report.tensors_read, report.used = len(shapes), sorted(wanted)
        report.ignored = dict(sorted(ignored.items()))
        report.num_parameters = sum(int(np.prod(shape)) for *_, shape in table)
        if fresh:  # with --drop-heads, the output's only weights not read from the source
            where = " (random) in the encoder-only output" if drop_heads else ""
            report.notes.append(
                f"no pooler in transformers' class: {', '.join(fresh)} fresh{where}"
            )
    return params


def _fresh_pooler(params: dict[str, Any], config: Any) -> list[str]:
    """BERT's pooler, where the class had none (QA, token classification), drawn as
    transformers initializes one (normal at initializer_range, zero bias); the names filled."""
    encoder = params[task_heads.ENCODER_KEY]
    if isinstance(config, ModernBertConfig) or "pooler" in encoder:
        return []
    rng = np.random.default_rng(0)
    d = config.hidden_size
    kernel = rng.normal(0.0, config.initializer_range, (d, d)).astype(np.float32)
    encoder["pooler"] = {"kernel": kernel, "bias": np.zeros(d, np.float32)}
    return ["bert/pooler/kernel", "bert/pooler/bias"]


# --- Directories ---


def task_from_hf(values: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The task entry of a transformers task class's config.json (`path`: its directory)."""
    head = head_of(values)
    kind = task_heads.get(head)
    count = _count(values)
    where = os.path.join(path, "config.json")
    if kind.outputs is not None and count != kind.outputs and head != "regression":
        raise ConversionError(
            f"{where}: {values['architectures'][0]} with {count} labels; its {head} head has "
            f"{kind.outputs} output(s)"
        )
    names = values.get("id2label") or {}
    labels = [str(names.get(str(i), f"LABEL_{i}")) for i in range(count)]
    return {
        "name": str(values.get("finetuning_task") or values["architectures"][0]),
        "head": head,
        "labels": labels if kind.outputs is None else [],
        "max_seq_length": _max_seq_length(path, int(values.get("max_position_embeddings", 512))),
        "settings": {},
        "options": {},
    }


def _max_seq_length(path: str, positions: int) -> int:
    """The tokenizer's model_max_length where tokenizer_config.json gives a real one, else
    `DEFAULT_MAX_SEQ_LENGTH`; never more than the model's positions."""
    try:
        with fs.open(os.path.join(path, "tokenizer_config.json"), encoding="utf-8") as f:
            length = json.load(f).get("model_max_length")
    except (OSError, ValueError):
        length = None
    if not isinstance(length, int) or not 0 < length < 1_000_000:  # transformers' "no limit"
        length = DEFAULT_MAX_SEQ_LENGTH
    return min(length, positions)


def _read_hf(
    path: str, report: ConversionReport, drop_heads: bool = False
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """(config, params, task) of a transformers task-class directory (`drop_heads`: the
    encoder's params alone)."""
    values = hf_modernbert.read_config_json(path)
    if values is None:
        raise ConversionError(f"{path} has no readable config.json")
    origin = f"transformers checkpoint {', '.join(hf.weight_files(path))}"
    if values.get("model_type") == hf_modernbert.MODEL_TYPE:
        hf_modernbert.check_shape_keys(values, path)
        config = hf_modernbert.config_from_hf(values)
        shapes, read = hf_modernbert.open_weights(path)
    else:
        checkpoint = hf.read_hf_dir(path)
        config = hf.config_from_hf(checkpoint.config)
        shapes, read = checkpoint.shapes, checkpoint.read
    task = task_from_hf(values, path)
    params = params_from_state(shapes, read, config, task, origin, report, drop_heads)
    return config, params, task


def write_hf_dir(
    path: str, config: Any, params: Mapping[str, Any], task: Mapping[str, Any], tokenizer: Any
) -> list[str]:
    """config.json, model.safetensors and the tokenizer's files of the task's transformers
    class into the existing directory `path`; the names written."""
    family = model_dir.model_type(config)
    if family == hf_modernbert.MODEL_TYPE:
        values = hf_modernbert.hf_config_from(config, with_heads=False)
    else:
        values = hf.hf_config_from(config, with_heads=False)
    values.update(task_heads.transformers_fields(family, task))
    values["finetuning_task"] = task["name"]
    with fs.open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(values, f, indent=2, sort_keys=True)
        f.write("\n")
    state = state_dict_from(params, config, task)
    write_safetensors(os.path.join(path, hf.SAFETENSORS_NAME), state, {"format": "pt"})
    written = ["config.json", hf.SAFETENSORS_NAME]
    if tokenizer is None:
        return written
    inputs = hf_modernbert.MODEL_INPUT_NAMES if family == hf_modernbert.MODEL_TYPE else None
    return written + hf_tokenizer.write_hf_tokenizer(
        path, tokenizer, config.max_position_embeddings, inputs
    )


# --- `bert-jax convert` ---


def convert(request: Request) -> ConversionReport:
    """`bert-jax convert` for a fine-tuned source (`is_finetuned`), "hf" or "bert-jax" in and
    out, once `between_formats.convert` has checked the request's destination: checked before
    anything is written, written atomically."""
    from bert_jax.data.tokenizers.load_or_train import has_tokenizer_files

    src_format, src, drop_heads = request.src_format, request.src, request.drop_heads
    if src_format == "hf":
        values = hf_modernbert.read_config_json(src) or {}
        modern = values.get("model_type") == hf_modernbert.MODEL_TYPE
        report = (hf_modernbert.ModernBertReport if modern else ConversionReport)("hf", src)
        config, params, task = _read_hf(src, report, drop_heads)
        tok_origin = src if has_tokenizer_files(src) else None
    else:
        loaded = request.load_model_dir(src)
        config, params, task = loaded.config, jax.tree.map(np.asarray, loaded.params), loaded.task
        modern = isinstance(config, ModernBertConfig)
        report = (hf_modernbert.ModernBertReport if modern else ConversionReport)(
            "bert-jax", loaded.path
        )
        flat = traverse_util.flatten_dict(params, sep="/")
        report.config, report.tensors_read, report.used = config, len(flat), sorted(flat)
        report.num_parameters = sum(int(np.size(v)) for v in flat.values())
        tok_origin = loaded.tokenizer_path
    tok = source_tokenizer(tok_origin, request.tokenizer, request.lowercase, config, report)
    family = model_dir.model_type(config)
    architecture = task_heads.get(task["head"]).architecture(family)
    if drop_heads:  # the encoder alone, as a pretrained model of the family
        encoder = params[task_heads.ENCODER_KEY]
        params = {model_dir.ENCODER_SUBTREES[family]: encoder}
        task = None
        report.notes.append(f"the {architecture} head was dropped")
    else:
        labels = ", ".join(task["labels"]) or "none named"
        report.task_head = f"{task['head']} head ({architecture}; labels: {labels})"
        if request.dst_format == "hf" and not modern and not mapping.TASK_OUTPUTS[task["head"]][1]:
            report.notes.append(f"BERT's pooler left out: {architecture} has none")

    def write_hf(folder: str) -> list[str]:
        if task is None and modern:
            return hf_modernbert.write_hf_dir(folder, config, params, tok)
        if task is None:
            return hf.write_hf_dir(folder, config, params, tok)
        return write_hf_dir(folder, config, params, task, tok)

    write_output(request, report, config, params, tok, write_hf, task=task)
    return report
