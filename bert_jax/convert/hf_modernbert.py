"""transformers' ModernBERT directories in and out, and `bert-jax convert` for that family.

`--from hf DIR` reads a `ModernBertForMaskedLM` directory (config.json, model.safetensors or
pytorch_model.bin, tokenizer.json) strictly through `modernbert_names.py`: every parameter filled
with its shape, every tensor used (the tied decoder checked to be a copy); an encoder-only
`ModernBertModel` directory converts as the encoder alone, and `--drop-heads` leaves out any head.
`--to hf` writes config.json (transformers 5's `layer_types` and `rope_parameters`, and the
older `global_attn_every_n_layers` / `*_rope_theta` keys), model.safetensors (the tied decoder
left for transformers to tie) and the tokenizer's files, which transformers loads strictly. A
bert-jax model directory records the family as config.json's `model_type` (`model_dir.py`).

`is_modernbert` tells a ModernBERT source from a BERT one; `bert-jax convert` hands those here
(BERT's path is `between_formats.py`, whose output rules this follows: checked before anything
is written, written atomically, an earlier export of the same kind replaced only on request).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from bert_jax.convert import hf, hf_tokenizer, model_dir, modernbert_names, strict
from bert_jax.convert.mapping import get_path, set_path
from bert_jax.convert.request import Request, source_tokenizer, write_output
from bert_jax.convert.safetensors import read_safetensors, write_safetensors
from bert_jax.convert.strict import ConversionError, ConversionReport
from bert_jax.core.modernbert_config import COMPUTATION, GLOBAL, SLIDING, ModernBertConfig
from bert_jax.runtime import fs
from bert_jax.runtime.declarations import declared_fields
from bert_jax.runtime.errors import UserError

MODEL_TYPE = "modernbert"
# config.json's keys that give the weights' shapes: a directory's config.json must name them.
SHAPE_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)
# What ModernBERT's forward takes (no token types): its tokenizer returns these alone.
MODEL_INPUT_NAMES = ("input_ids", "attention_mask")
# Settings config.json spells its own way (layer_types, rope_parameters): read apart.
_DERIVED = ("global_attn_every_n_layers", "global_rope_theta", "local_rope_theta")
_HF_ACTIVATION_ALIASES = {"gelu_pytorch_tanh": "gelu_new", "gelu_fast": "gelu_new"}
_HF_ACTIVATIONS = {"gelu_tanh": "gelu_new"}  # ours -> transformers' name of the same function


class ModernBertReport(ConversionReport):
    """A conversion's report, with ModernBERT's shape and head in its words."""

    def summary(self) -> str:
        cfg = self.config
        lines = [
            f"converted {self.source_format} {self.source} -> {self.target_format} {self.target}"
        ]
        if cfg is not None:
            every = cfg.global_attn_every_n_layers
            attention = (
                "global attention in every layer"
                if every == 1 or cfg.num_hidden_layers == 1
                else f"global attention every {every} layers, a {cfg.local_attention}-token "
                "window elsewhere"
            )
            lines.append(
                f"  model: ModernBERT, {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
                f"{cfg.num_attention_heads} heads, GeGLU {cfg.intermediate_size}, vocab "
                f"{cfg.vocab_size}, {attention}"
            )
        head = self.task_head or (
            "MLM head converted" if self.has_heads else "encoder only (no MLM head)"
        )
        lines.append(f"  heads: {head}")
        lines.append(
            f"  tensors: {self.tensors_read} read, {len(self.used)} used, "
            f"{len(self.ignored)} ignored; {self.num_parameters:,} parameters (vocabulary "
            "padding rows not counted)"
        )
        for reason, count in sorted(self.ignored_by_reason().items()):
            lines.append(f"    ignored {count}: {reason}")
        lines.append(f"  tokenizer: {self.tokenizer or 'none'}")
        lines += [f"  note: {note}" for note in self.notes]
        if self.written:
            lines.append(f"  wrote: {', '.join(self.written)}")
        return "\n".join(lines)


# --- Configs ---


def _every_n(layer_types: Any, layers: int) -> int:
    """global_attn_every_n_layers from transformers 5's `layer_types`, which must follow it."""
    types = list(layer_types)
    for every in range(1, max(layers, 1) + 1):
        if types == [GLOBAL if i % every == 0 else SLIDING for i in range(layers)]:
            return every
    raise ConversionError(
        f"config.json: layer_types {types} is not global attention every N layers (layer 0 "
        "global), the one pattern ModernBertConfig.global_attn_every_n_layers describes"
    )


def _theta(values: Mapping[str, Any], kind: str, old_key: str, default: float) -> float:
    """A rotary base from rope_parameters[kind] (transformers 5) or the older `old_key`."""
    params = (values.get("rope_parameters") or {}).get(kind)
    if params is None:
        return float(values.get(old_key, default))
    if params.get("rope_type", "default") != "default":
        raise ConversionError(
            f"config.json: rope_parameters.{kind}.rope_type={params['rope_type']!r}; only "
            "'default' (plain rotary positions, as ModernBERT trains) is supported"
        )
    return float(params.get("rope_theta", values.get(old_key, default)))


def config_from_hf(values: Mapping[str, Any]) -> ModernBertConfig:
    """ModernBertConfig from transformers' config.json (either version's spelling)."""
    if values.get("model_type") != MODEL_TYPE:
        raise ConversionError(
            f"config.json has model_type={values.get('model_type')!r}, not 'modernbert'"
        )
    if values.get("tie_word_embeddings", True) is False:
        raise ConversionError(
            "config.json has tie_word_embeddings=false; bert-jax ties the MLM decoder to the "
            "token embeddings, as ModernBERT does"
        )
    defaults = ModernBertConfig()
    # bert-jax's computation settings are never read from it (its "dtype" is the dtype the
    # weights were saved in).
    names = {f.name for f in declared_fields(ModernBertConfig)} - {*COMPUTATION, *_DERIVED}
    # A token id may be null or a list in transformers' config: the default then stands.
    settings = {
        name: values[name]
        for name in names
        if name in values and not (name.endswith("_token_id") and not isinstance(values[name], int))
    }
    for name in ("hidden_activation", "classifier_activation"):
        if name in settings:
            settings[name] = _HF_ACTIVATION_ALIASES.get(settings[name], settings[name])
    layers = int(values.get("num_hidden_layers", defaults.num_hidden_layers))
    if values.get("layer_types") is not None:
        settings["global_attn_every_n_layers"] = _every_n(values["layer_types"], layers)
    elif "global_attn_every_n_layers" in values:
        settings["global_attn_every_n_layers"] = values["global_attn_every_n_layers"]
    settings["global_rope_theta"] = _theta(
        values, GLOBAL, "global_rope_theta", defaults.global_rope_theta
    )
    settings["local_rope_theta"] = _theta(
        values, SLIDING, "local_rope_theta", defaults.local_rope_theta
    )
    try:
        return ModernBertConfig(**settings)
    except (TypeError, UserError) as err:  # a range, a closed set, a wrong type
        raise ConversionError(f"config.json: {err}") from err


def hf_config_from(config: ModernBertConfig, with_heads: bool = True) -> dict[str, Any]:
    """transformers' config.json for `config` (ModernBertForMaskedLM, or ModernBertModel)."""
    values = {
        f.name: getattr(config, f.name)
        for f in declared_fields(ModernBertConfig)
        if f.name not in COMPUTATION
    }
    for name in ("hidden_activation", "classifier_activation"):
        values[name] = _HF_ACTIVATIONS.get(values[name], values[name])
    return {
        **values,
        "architectures": ["ModernBertForMaskedLM" if with_heads else "ModernBertModel"],
        "model_type": MODEL_TYPE,
        "layer_types": list(config.layer_types),
        "rope_parameters": {
            GLOBAL: {"rope_type": "default", "rope_theta": config.global_rope_theta},
            SLIDING: {"rope_type": "default", "rope_theta": config.local_rope_theta},
        },
        "tie_word_embeddings": True,
        "dtype": "float32",
    }


# --- Directories ---


def read_config_json(path: str) -> dict[str, Any] | None:
    """config.json in the directory `path` as a dict, or None where there is none to read."""
    config_path = os.path.join(path, "config.json")
    try:
        with fs.open(config_path, encoding="utf-8") as f:
            values = json.load(f)
    except (OSError, ValueError):
        return None
    return values if isinstance(values, dict) else None


def is_modernbert(src_format: str, src: str | os.PathLike) -> bool:
    """Whether `bert-jax convert --from src_format src` reads a ModernBERT model: a transformers
    directory or a bert-jax model directory whose config.json says model_type modernbert."""
    src = os.fspath(src)
    if src_format == "bert-jax":
        try:
            src = model_dir.resolve(src)
        except UserError:
            return False  # the BERT path names what is wrong with it
    elif src_format != "hf":
        return False
    values = read_config_json(src)
    return values is not None and values.get("model_type") == MODEL_TYPE


def open_weights(path: str) -> tuple[dict[str, tuple[int, ...]], Callable[[str], np.ndarray]]:
    """Every tensor's shape in a transformers directory's weight files, and a reader of one."""
    shapes: dict[str, tuple[int, ...]] = {}
    readers: dict[str, Callable[[], np.ndarray]] = {}
    for file in hf.weight_files(path):
        if file.endswith(".safetensors"):
            st = read_safetensors(file)
            file_shapes, read_one = st.shapes, st.read
        else:
            state = hf.load_torch_bin(file)
            file_shapes = {key: tuple(value.shape) for key, value in state.items()}
            read_one = lambda key, state=state: hf.to_numpy(state[key])  # noqa: E731
        for key, shape in file_shapes.items():
            if key in shapes:
                raise ConversionError(f"tensor {key!r} appears in more than one weight file")
            shapes[key] = tuple(shape)
            readers[key] = lambda read_one=read_one, key=key: read_one(key)
    # A ModernBertModel directory names the encoder's tensors without "model.".
    if not any(key.startswith("model.") for key in shapes):
        readers = {f"model.{key}": read for key, read in readers.items()}
        shapes = {f"model.{key}": shape for key, shape in shapes.items()}
    return shapes, lambda name: np.asarray(readers[name]())


def check_shape_keys(values: Mapping[str, Any], path: str) -> None:
    """A ConversionError naming the directory's config.json and the first of `SHAPE_KEYS` it
    lacks: a default (ModernBERT-base's) would be blamed on whatever reads it next."""
    missing = [key for key in SHAPE_KEYS if key not in values]
    if missing:
        raise ConversionError(
            f"{os.path.join(path, 'config.json')} has no {missing[0]!r}: the model's shape is "
            f"read from {', '.join(SHAPE_KEYS)}, which transformers writes into every ModernBERT "
            "config.json"
        )


def params_from_hf_dir(
    path: str, *, drop_heads: bool = False, report: ConversionReport | None = None
) -> tuple[ModernBertConfig, dict[str, Any]]:
    """The config and bert-jax params of a transformers ModernBERT directory, strictly."""
    values = read_config_json(path)
    if values is None:
        raise ConversionError(f"{path} has no readable config.json")
    check_shape_keys(values, path)
    config = config_from_hf(values)
    shapes, read = open_weights(path)
    heads = any(not key.startswith("model.") and key not in modernbert_names.TIED for key in shapes)
    with_heads = heads and not drop_heads
    for copy, original in modernbert_names.TIED.items():
        if with_heads and copy in shapes and original in shapes:
            if not np.array_equal(read(copy), read(original)):
                raise ConversionError(
                    f"tensor {copy!r} differs from {original!r}: an untied MLM decoder, but "
                    "bert-jax ties it to the token embeddings (as ModernBERT does)"
                )

    def ignore(name: str) -> str | None:
        if name in modernbert_names.TIED:
            return f"tied copy of {modernbert_names.TIED[name]}"
        if drop_heads and not name.startswith("model."):
            return "head dropped on request (encoder-only output)"
        return None

    origin = f"transformers checkpoint {', '.join(hf.weight_files(path))}"
    try:
        params = modernbert_names.import_params(
            shapes, read, config, with_heads=with_heads, ignore=ignore, report=report, origin=origin
        )
    except ConversionError as err:
        if heads and not drop_heads and modernbert_names.encoder_matches(shapes, config):
            raise ConversionError(f"{err}\n{strict.DROP_HEADS_HINT}") from None
        raise
    if report is not None and not with_heads:
        report.notes.append(
            "the checkpoint's heads were dropped" if heads else "encoder-only checkpoint"
        )
    return config, params


def write_hf_dir(
    path: str, config: ModernBertConfig, params: Mapping[str, Any], tokenizer: Any = None
) -> list[str]:
    """config.json, model.safetensors and the tokenizer's files into the existing directory
    `path`; returns the names written. A BPE tokenizer is written as tokenizer.json with a
    `PreTrainedTokenizerFast` tokenizer_config.json (what ModernBERT's directory holds)."""
    with_heads = "head" in params
    state = modernbert_names.state_dict_from(params, config)
    with fs.open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(hf_config_from(config, with_heads), f, indent=2, sort_keys=True)
        f.write("\n")
    write_safetensors(os.path.join(path, hf.SAFETENSORS_NAME), state, {"format": "pt"})
    written = ["config.json", hf.SAFETENSORS_NAME]
    if tokenizer is None:
        return written
    return written + hf_tokenizer.write_hf_tokenizer(
        path, tokenizer, config.max_position_embeddings, MODEL_INPUT_NAMES
    )


# --- `bert-jax convert` ---


def _repad(params: dict[str, Any], config: ModernBertConfig) -> dict[str, Any]:
    """`params` with the vocabulary rows cut to vocab_size, then padded as `config` says."""
    out: dict[str, Any] = {}
    rows = config.padded_vocab_size - config.vocab_size
    for entry in modernbert_names.entries(config, "head" in params):
        value = np.asarray(get_path(params, entry.path))
        if entry.path[-1] in ("embedding", "decoder_bias"):
            value = np.pad(value[: config.vocab_size], [(0, rows)] + [(0, 0)] * (value.ndim - 1))
        set_path(out, entry.path, value)
    return out


def convert(request: Request) -> ConversionReport:
    """`bert-jax convert` for a ModernBERT source (`is_modernbert`), "hf" or "bert-jax" in,
    "bert-jax" or "hf" out, once `between_formats.convert` has checked the request's
    destination: checked before anything is written, written atomically."""
    from bert_jax.data.tokenizers.load_or_train import has_tokenizer_files

    src_format, src = request.src_format, request.src
    report = ModernBertReport(source_format=src_format, source=src)
    tok_origin = None
    if src_format == "hf":
        config, params = params_from_hf_dir(src, drop_heads=request.drop_heads, report=report)
        tok_origin = src if has_tokenizer_files(src) else None
    else:
        loaded = request.load_model_dir(src)
        if not isinstance(loaded.config, ModernBertConfig):
            raise UserError(f"{src} holds a {type(loaded.config).__name__}, not ModernBERT")
        config, params = loaded.config, jax.tree.map(np.asarray, loaded.params)
        if request.drop_heads and loaded.has_heads:
            params = {"model": params["model"]}
            report.notes.append("the model's MLM head was dropped")
        report.source, report.config, report.has_heads = loaded.path, config, "head" in params
        report.used = ["/".join(e.path) for e in modernbert_names.entries(config, report.has_heads)]
        report.tensors_read = len(report.used)
        report.num_parameters = modernbert_names.count_parameters(config, report.has_heads)
        tok_origin = loaded.tokenizer_path
    tok = source_tokenizer(tok_origin, request.tokenizer, request.lowercase, config, report)
    if request.vocab_pad_multiple is not None:
        config = config.replace(vocab_pad_multiple=request.vocab_pad_multiple)
        params = _repad(params, config)
        report.config = config
    modernbert_names.check_params(params, config, f"converted {src_format} params")
    write_output(
        request,
        report,
        config,
        params,
        tok,
        lambda folder: write_hf_dir(folder, config, params, tok),
    )
    if request.dst_format == "hf" and not report.has_heads:
        report.notes.append("written as a ModernBertModel checkpoint (no MLM head)")
    return report
