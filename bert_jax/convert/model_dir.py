"""The model directory: the format `convert`, `pretrain` (export), `finetune` and `encode` share.

Layout (self-describing: nothing else is needed to load it):

    config.json    the config's fields under their Hugging Face names (vocab_size, hidden_size,
                   num_hidden_layers, hidden_act, ...), the family as `model_type` ("bert":
                   BertConfig; "modernbert": ModernBertConfig), plus a "bert_jax" block:
                   format name and version, whether the MLM/NSP heads are present, the
                   tokenizer's kind and case setting, and free-form `extra` (e.g. where a
                   conversion came from).
    params/        Orbax (StandardCheckpointer) save of the params: the full BertForPreTraining
                   tree {"bert", "predictions", "seq_relationship"}, or encoder-only {"bert"}
                   (ModernBERT: ModernBertForMaskedLM's {"model", "head", "decoder_bias"}, or
                   {"model"}).
    tokenizer/     optional; written by `Tokenizer.save` (vocab.txt, spiece.model or a BPE
                   tokenizer.json, plus bert_jax_tokenizer.json with the kind and lowercase
                   flag), read by `load_tokenizer`.

A fine-tuned model directory (what `bert-jax finetune` writes into `<workdir>/model/`) is this
format with a task head: its params are the fine-tuning state's tree, the encoder under "bert"
and the head under "classifier" in both families (`task_heads`: the shapes of each head kind);
config.json adds transformers' own fields for the head's class (`architectures`, e.g.
["BertForSequenceClassification"], `num_labels`, `id2label`/`label2id` with string keys of ints,
`problem_type` "regression" or "single_label_classification" where the class reads it), and the
"bert_jax" block a `task` entry:

    {"name": the registry's task name, "head": a `task_heads.HEADS` kind (classification,
     regression, multiple_choice, span, tags), "labels": [the label or tag names, index order;
     [] for regression, multiple choice and spans], "max_seq_length": N, "settings": the run's
     FinetuneSettings, "options": the task's own (SQuAD's windows and answers)}

`has_pretraining_heads` is false there. `ModelDir.task` is that entry (None for a pretrained
model); the encoder loads from it as from any model directory (`ModelDir.encoder_params`).

Writes are atomic: everything goes into a hidden sibling directory that is renamed into place at
the end, so a failed save or conversion leaves nothing at the destination. An existing
destination is replaced only when it is a model directory itself (`outputs.check_replaceable`).

`load_model_dir` reads a model directory, or the one a finished pretraining workdir exported
(`<workdir>/model/`). A workdir still without it is read from its latest checkpoint by
`bert_jax.training.load_model.load_model_dir`, the loader the commands use: reading a checkpoint
needs the run's config and the checkpoint layout, which live in training/.

Why this file is long: it is the format's one owner, both ways (the layout, its checks against
the config, a pretrained and a fine-tuned tree, Orbax save and restore onto a mesh); split, the
writer and reader would each restate the layout.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from flax import traverse_util

from bert_jax.convert import mapping, modernbert_names, task_heads
from bert_jax.convert.strict import check_params
from bert_jax.core.model import BertConfig
from bert_jax.core.modernbert_config import ModernBertConfig
from bert_jax.runtime import checkpoint_health, fs
from bert_jax.runtime import outputs as files
from bert_jax.runtime.errors import UserError

FORMAT_NAME = "bert-jax-model"
FORMAT_VERSION = 1
CONFIG_NAME = "config.json"
PARAMS_DIR = "params"
TOKENIZER_DIR = "tokenizer"
WORKDIR_MODEL_SUBDIR = "model"
# config.json's `model_type` -> the family's config class (transformers' names).
FAMILIES: dict[str, type] = {"bert": BertConfig, "modernbert": ModernBertConfig}
# Where each family's encoder lies in a (pretrained) model directory's params.
ENCODER_SUBTREES = {"bert": "bert", "modernbert": "model"}
TASK_KEY = "task"  # the "bert_jax" block's entry of a fine-tuned model (its task head)
ModelConfig = BertConfig | ModernBertConfig


class ModelDirError(UserError):
    """A model directory is missing, incomplete or does not match its config."""


@dataclasses.dataclass
class ModelDir:
    """A loaded model directory. `params` is None when loaded with `load_params=False`, and
    until first used when loaded with `defer_params=True` (`read_params`)."""

    path: str
    config: ModelConfig
    params: dict[str, Any] | None
    has_heads: bool
    info: dict[str, Any]  # the "bert_jax" block of config.json
    _tokenizer: Any = dataclasses.field(default=None, repr=False)
    _read: Callable[[], dict[str, Any]] | None = dataclasses.field(default=None, repr=False)

    @property
    def has_unread_params(self) -> bool:
        """Its params are still in the directory (`load_model_dir(defer_params=True)`)."""
        return self._read is not None

    def read_params(self) -> None:
        """Reads the params now where `load_model_dir(defer_params=True)` left them unread."""
        if self._read is not None:
            self.params, self._read = self._read(), None

    @property
    def tokenizer_path(self) -> str | None:
        path = os.path.join(self.path, TOKENIZER_DIR)
        return path if fs.isdir(path) else None

    @property
    def has_tokenizer(self) -> bool:
        return self.tokenizer_path is not None

    @property
    def tokenizer(self):
        """The model's own tokenizer (a `data.tokenizers.interface.Tokenizer`), loaded when used."""
        if self._tokenizer is None:
            if self.tokenizer_path is None:
                raise ModelDirError(
                    f"model directory {self.path} has no {TOKENIZER_DIR}/ (it was saved without a "
                    "tokenizer); re-convert it with --tokenizer VOCAB_OR_MODEL"
                )
            from bert_jax.data.tokenizers.load_or_train import load_tokenizer

            self._tokenizer = load_tokenizer(self.tokenizer_path)
        return self._tokenizer

    @property
    def extra(self) -> dict[str, Any]:
        return dict(self.info.get("extra") or {})

    @property
    def task(self) -> dict[str, Any] | None:
        """A fine-tuned model's task entry (see the module docstring); None for any other."""
        return self.info.get(TASK_KEY)

    @property
    def encoder_key(self) -> str:
        """Where the encoder's params lie: a fine-tuned model's "bert" (both families), else the
        family's own (BERT's "bert", ModernBERT's "model")."""
        if self.task is not None:
            return task_heads.ENCODER_KEY
        return ENCODER_SUBTREES[model_type(self.config)]

    @property
    def encoder_params(self) -> Any:
        """The encoder's subtree of the params (BERT's with its pooler)."""
        self.read_params()
        if self.params is None or self.encoder_key not in self.params:
            raise ModelDirError(
                f"model directory {self.path} has no {self.encoder_key!r} parameters"
                + ("" if self.params is None else f" (top-level keys: {sorted(self.params)})")
            )
        return self.params[self.encoder_key]


# --- The model directory as an output (runtime.outputs holds the one replacement rule) ---


def is_model_dir(path: str | os.PathLike) -> bool:
    """`path` carries a model directory's marker: config.json with this format's bert_jax block."""
    config_path = os.path.join(os.fspath(path), CONFIG_NAME)
    try:
        info = read_json(config_path).get("bert_jax")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(info, dict) and info.get("format") == FORMAT_NAME


MODEL_DIR_KIND = files.OutputKind(
    name="model directory",
    marker=f"{CONFIG_NAME} with a bert_jax block",
    is_own=is_model_dir,
    holds=lambda name: name in (CONFIG_NAME, PARAMS_DIR, TOKENIZER_DIR),
    marker_file=CONFIG_NAME,
)


# --- Save ---


def _as_tokenizer(tokenizer: Any):
    if tokenizer is None or hasattr(tokenizer, "save"):
        return tokenizer
    from bert_jax.data.tokenizers.load_or_train import load_tokenizer

    return load_tokenizer(os.fspath(tokenizer))


def _unbox(params: Mapping[str, Any]) -> dict[str, Any]:
    import flax.linen as nn
    from flax.core import unfreeze

    return unfreeze(nn.meta.unbox(params))


def model_type(config: ModelConfig) -> str:
    """The family of `config`, as config.json's `model_type` names it."""
    return next(name for name, cls in FAMILIES.items() if isinstance(config, cls))


def config_dict(
    config: ModelConfig, has_heads: bool, tokenizer: Any, extra: Any, task: Any = None
) -> dict:
    """The contents of a model directory's config.json (a fine-tuned one's with `task`)."""
    values = config.to_dict()
    values["model_type"] = model_type(config)
    if task is not None:
        values.update(task_heads.transformers_fields(values["model_type"], task))
    values["bert_jax"] = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "has_pretraining_heads": bool(has_heads),
        "params": PARAMS_DIR,
        "tokenizer": None
        if tokenizer is None
        else {"path": TOKENIZER_DIR, "type": tokenizer.kind, "lowercase": tokenizer.lowercase},
        "extra": dict(extra or {}),
    }
    if task is not None:
        values["bert_jax"][TASK_KEY] = dict(task)
    return values


def save_model_dir(
    path: str | os.PathLike,
    config: ModelConfig,
    params: Mapping[str, Any],
    tokenizer: Any = None,
    *,
    extra: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    what: str = "model directory",
    task: Mapping[str, Any] | None = None,
) -> str:
    """Writes a model directory at `path` (atomically) and returns its absolute path.

    `what` names where the path came from (a flag) in a refusal to write there.

    `params`: the BertForPreTraining tree or an encoder-only {"bert": ...} tree, as NumPy or
    (possibly sharded, possibly boxed) jax arrays; it is checked against `config` first, naming any
    missing, extra or mis-shaped parameter. `tokenizer`: a `Tokenizer`, a path `load_tokenizer`
    accepts, or None. `extra`: JSON-serializable notes stored in config.json. `task`: a
    fine-tuned model's task entry (the module docstring); `params` is then the fine-tuning
    state's tree {"bert": encoder, "classifier": head}, checked against the head's kind.

    Written by the calling process alone (no cross-host barriers): in a multi-host job, gather
    the params to host-local arrays (`multihost_utils.process_allgather`) and call this from one
    process.
    """
    params = _unbox(params)
    if task is not None:
        task = check_task(task, "the task to save")
        _check_finetuned(params, config, task)
        has_heads = False
    else:
        family = model_type(config)
        checks = modernbert_names.check_params if family == "modernbert" else check_params
        has_heads = checks(params, config, "params to save")
    tokenizer = _as_tokenizer(tokenizer)
    if tokenizer is not None and tokenizer.vocab_size > config.vocab_size:
        raise ModelDirError(
            f"the tokenizer has {tokenizer.vocab_size} entries but the model's vocab_size is "
            f"{config.vocab_size}: ids past the embedding table would be produced"
        )
    payload = config_dict(config, has_heads, tokenizer, extra, task)
    json.dumps(payload)  # fail on non-serializable `extra` before writing anything
    with files.atomic_output_dir(path, MODEL_DIR_KIND, overwrite, what=what) as tmp:
        with _checkpointer(process_local=True) as checkpointer:
            checkpointer.save(os.path.join(tmp, PARAMS_DIR), params)
            checkpointer.wait_until_finished()
        if tokenizer is not None:
            tokenizer.save(os.path.join(tmp, TOKENIZER_DIR))
        with fs.open(os.path.join(tmp, CONFIG_NAME), "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2, sort_keys=True)
            f.write("\n")
    return fs.abspath(os.fspath(path))


# --- Load ---


def read_json(path: str) -> dict[str, Any]:
    try:
        with fs.open(path, encoding="utf-8") as f:
            values = json.load(f)
    except ValueError as err:  # truncated, not JSON, not UTF-8
        raise ModelDirError(f"{path} is damaged: not a JSON object ({err})") from None
    if not isinstance(values, dict):
        raise ModelDirError(f"{path} is damaged: not a JSON object")
    return values


def is_unexported_workdir(path: str | os.PathLike) -> bool:
    """A pretraining workdir with checkpoints but no exported `model/` (a run in progress or
    preempted): `bert_jax.training.load_model.load_model_dir` reads its latest checkpoint."""
    path = os.fspath(path)
    return (
        fs.isdir(os.path.join(path, "checkpoints"))
        and fs.exists(os.path.join(path, CONFIG_NAME))
        and not fs.exists(os.path.join(path, WORKDIR_MODEL_SUBDIR, CONFIG_NAME))
        and "bert_jax" not in read_json(os.path.join(path, CONFIG_NAME))
    )


def resolve(path: str | os.PathLike) -> str:
    """The model directory `path` names: itself, or `<path>/model` for a pretraining workdir.

    Raises `ModelDirError` saying what was found instead (and how to convert it) otherwise.
    """
    path = fs.abspath(os.fspath(path))
    if not fs.isdir(path):
        raise ModelDirError(f"model directory not found: {path}")
    for candidate in (path, os.path.join(path, WORKDIR_MODEL_SUBDIR)):
        config_path = os.path.join(candidate, CONFIG_NAME)
        if fs.exists(config_path) and "bert_jax" in read_json(config_path):
            return candidate
    if is_unexported_workdir(path):
        raise ModelDirError(
            f"{path} is a pretraining workdir with no exported {WORKDIR_MODEL_SUBDIR}/ yet: read "
            "its latest checkpoint with bert_jax.training.load_model.load_model_dir (as the "
            "commands do), or wait for the run to finish and export"
        )
    if fs.exists(os.path.join(path, CONFIG_NAME)):
        raise ModelDirError(
            f"{path} looks like a Hugging Face model directory, not a bert-jax one; convert it "
            f"first: bert-jax convert --from hf {path} --to bert-jax OUT"
        )
    if fs.exists(os.path.join(path, "bert_config.json")):
        raise ModelDirError(
            f"{path} looks like a Google TF1 BERT checkpoint; convert it first: "
            f"bert-jax convert --from tf1 {path} --to bert-jax OUT"
        )
    raise ModelDirError(
        f"{path} is not a bert-jax model directory (no {CONFIG_NAME} with a 'bert_jax' block) "
        f"and not a pretraining workdir with an exported model at "
        f"{os.path.join(path, WORKDIR_MODEL_SUBDIR)}/"
    )


def read_config(path: str | os.PathLike) -> tuple[ModelConfig, dict[str, Any]]:
    """A model directory's config (its family's class, by `model_type`; "bert" when absent) and
    its "bert_jax" block, without reading the params."""
    directory = resolve(path)
    values = read_json(os.path.join(directory, CONFIG_NAME))
    info = values.pop("bert_jax")
    if info.get("format") != FORMAT_NAME or not isinstance(info.get("format_version"), int):
        raise ModelDirError(f"{directory}/{CONFIG_NAME}: not a {FORMAT_NAME} config")
    if info["format_version"] > FORMAT_VERSION:
        raise ModelDirError(
            f"{directory} uses model-directory format version {info['format_version']}; this "
            f"bert-jax reads up to version {FORMAT_VERSION} (upgrade bert-jax)"
        )
    if info.get(TASK_KEY) is not None:
        info[TASK_KEY] = check_task(info[TASK_KEY], f"{directory}/{CONFIG_NAME}")
    family = values.get("model_type", "bert")
    if family not in FAMILIES:
        raise ModelDirError(
            f"{directory}/{CONFIG_NAME}: model_type {family!r} is not one of {', '.join(FAMILIES)}"
        )
    try:
        config = FAMILIES[family].from_dict(values)
    except (TypeError, ValueError) as err:
        raise ModelDirError(f"{directory}/{CONFIG_NAME}: {err}") from err
    return config, info


def expected_tree(
    config: ModelConfig, has_heads: bool, task: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The params' shapes (nested dict of tuples): the pretraining tree (with or without its
    heads), or with `task` a fine-tuned model's {"bert": encoder, "classifier": head}."""
    if task is not None:
        encoder = expected_tree(config, has_heads=False)
        return {
            task_heads.ENCODER_KEY: encoder[ENCODER_SUBTREES[model_type(config)]],
            task_heads.HEAD_KEY: task_heads.head_tree(config, task["head"], task["labels"]),
        }
    if model_type(config) == "modernbert":
        return modernbert_names.expected_tree(config, has_heads)
    tree: dict[str, Any] = {}
    for entry in mapping.entries(config, with_heads=has_heads):
        mapping.set_path(tree, entry.path, mapping.expected_shape(entry, config))
    return tree


def check_task(task: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A fine-tuned model's task entry, checked: a known head kind, its labels a list of names,
    a name and a sequence length; a ModelDirError naming `where` otherwise."""
    task = dict(task)
    problems = []
    if task.get("head") not in task_heads.HEADS:
        problems.append(f"head {task.get('head')!r} is not one of {', '.join(task_heads.HEADS)}")
    labels = task.get("labels")
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
        problems.append(f"labels {labels!r} is not a list of names")
    if not isinstance(task.get("name"), str):
        problems.append("it has no task name")
    if not isinstance(task.get("max_seq_length"), int):
        problems.append("it has no max_seq_length")
    if problems:
        raise ModelDirError(f"{where}: the fine-tuned task entry is damaged: {'; '.join(problems)}")
    return task


def _check_finetuned(params: Mapping[str, Any], config: ModelConfig, task: Mapping) -> None:
    want = traverse_util.flatten_dict(expected_tree(config, False, task), sep="/")
    found = {
        path: tuple(np.shape(leaf))
        for path, leaf in traverse_util.flatten_dict(dict(params), sep="/").items()
    }
    problems = [f"missing parameter {p} {s}" for p, s in want.items() if p not in found]
    problems += [
        f"parameter {p} has shape {found[p]} but the config needs {s}"
        for p, s in want.items()
        if p in found and found[p] != tuple(s)
    ]
    problems += [f"unexpected parameter {p} {s}" for p, s in found.items() if p not in want]
    if problems:
        raise ModelDirError(
            f"the fine-tuned params to save do not match the {task['head']} head's tree "
            f"({len(problems)} problem(s)): " + "; ".join(problems[:5])
        )


def _checkpointer(process_local: bool):
    """Orbax's StandardCheckpointer; `process_local` keeps it to this process in a multi-host job
    (no barriers with processes that do not take part)."""
    import orbax.checkpoint as ocp

    if not process_local or jax.process_count() == 1:
        return ocp.StandardCheckpointer()
    me = jax.process_index()
    options = ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})
    return ocp.StandardCheckpointer(multiprocessing_options=options)


def _stored_tree(params_dir: str) -> dict[str, Any]:
    # Missing or corrupt Orbax metadata files: one line naming params_dir.
    return _read_params(params_dir, lambda: checkpoint_health.stored_tree(params_dir))


def _read_params(params_dir: str, read: Any) -> Any:
    """read(), or a one-line ModelDirError naming `params_dir` and what is wrong with it."""
    value, problem = checkpoint_health.read_or_problem(read)
    if problem is not None:
        raise ModelDirError(
            f"cannot read the saved params in {params_dir} (damaged or incomplete copy?): {problem}"
        )
    return value


def _restore(params_dir: str, target: Any, process_local: bool) -> Any:
    with _checkpointer(process_local) as checkpointer:
        return checkpointer.restore(params_dir, target)


def _select_shardings(sharding: Any, structure: dict[str, Any]) -> Any:
    """One sharding for every leaf, or the matching subtree of a (possibly larger) tree."""
    if sharding is None:
        sharding = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    if isinstance(sharding, jax.sharding.Sharding):
        return jax.tree.map(lambda _: sharding, structure, is_leaf=lambda x: isinstance(x, tuple))
    out = {}
    for key, sub in structure.items():
        if key not in sharding:
            raise ModelDirError(f"the given shardings have no entry for parameter {key!r}")
        out[key] = (
            sharding[key] if isinstance(sub, tuple) else _select_shardings(sharding[key], sub)
        )
    return out


def load_model_dir(
    path: str | os.PathLike,
    *,
    sharding: Any = None,
    load_params: bool = True,
    load_tokenizer: bool = False,
    defer_params: bool = False,
) -> ModelDir:
    """Loads a model directory (or `<workdir>/model`, what a finished pretraining run exported).

    Params are restored with Orbax against an abstract target built from config.json (shape,
    stored dtype, sharding), after checking the stored tree names exactly the parameters the
    config implies. `sharding`: None restores onto the CPU; a single `jax.sharding.Sharding` is
    used for every parameter; a tree of shardings (e.g. from `param_shardings` for a mesh, for the
    full BertForPreTraining tree) restores each parameter straight onto the mesh; for an
    encoder-only directory the matching subtree is used. The tokenizer loads on first use of
    `ModelDir.tokenizer`, or now with `load_tokenizer=True`. `defer_params`: the stored tree is
    checked now, its arrays read on first use (`ModelDir.read_params`, `encoder_params`).
    """
    directory = resolve(path)
    config, info = read_config(directory)
    has_heads = bool(info.get("has_pretraining_heads"))
    params = read = None
    if load_params:
        params_dir = os.path.join(directory, info.get("params", PARAMS_DIR))
        if not fs.isdir(params_dir):
            raise ModelDirError(f"{directory} has no {PARAMS_DIR}/ directory (incomplete copy?)")
        expected = expected_tree(config, has_heads, info.get(TASK_KEY))
        stored = _stored_tree(params_dir)
        dtypes = _check_stored(stored, expected, directory)
        shardings = _select_shardings(sharding, expected)
        target = jax.tree.map(
            lambda shape, dtype, s: jax.ShapeDtypeStruct(shape, dtype, sharding=s),
            expected,
            dtypes,
            shardings,
            is_leaf=lambda x: isinstance(x, tuple),
        )
        # A target sharded over a (multi-host) mesh needs every process; a local one does not.
        local = sharding is None or isinstance(sharding, jax.sharding.SingleDeviceSharding)

        def read() -> Any:
            return _read_params(params_dir, lambda: _restore(params_dir, target, local))

        if not defer_params:
            params, read = read(), None
    model = ModelDir(directory, config, params, has_heads, info, _read=read)
    if load_tokenizer and model.has_tokenizer:
        model.tokenizer  # noqa: B018 (loads and caches)
    return model


def _check_stored(stored: dict, expected: dict, directory: str) -> dict[str, Any]:
    """Compares stored Orbax metadata with the config's tree; returns the stored dtypes."""
    have = traverse_util.flatten_dict(stored, sep="/")
    want = traverse_util.flatten_dict(expected, sep="/")
    problems = checkpoint_health.param_problems(have, want, "config.json")
    if problems:
        shown = "; ".join(problems[:5]) + ("; ..." if len(problems) > 5 else "")
        raise ModelDirError(
            f"{directory}: the saved params do not match config.json ({len(problems)} "
            f"problem(s)): {shown}"
        )
    return traverse_util.unflatten_dict(
        {name: np.dtype(have[name].dtype) for name in want}, sep="/"
    )


def param_shardings(config: ModelConfig, mesh: jax.sharding.Mesh, rules: Any = None) -> Any:
    """NamedShardings for the full param tree (BertForPreTraining's, or ModernBertForMaskedLM's)
    on `mesh` (the model's logical axes mapped through `rules`, default
    `partitioning.DEFAULT_RULES`); checks divisibility."""
    from bert_jax.core import partitioning, trainer
    from bert_jax.core.model import BertForPreTraining
    from bert_jax.core.modernbert import ModernBertForMaskedLM

    rules = partitioning.DEFAULT_RULES if rules is None else rules
    family = ModernBertForMaskedLM if model_type(config) == "modernbert" else BertForPreTraining
    model = family(config)
    batch = trainer.dummy_batch(1, 8, 2)
    abstract = jax.eval_shape(
        lambda: model.init(jax.random.key(0), **trainer.model_inputs(batch), deterministic=True)
    )["params"]
    return partitioning.mesh_shardings(abstract, mesh, rules)


def load_params_for_mesh(
    path: str | os.PathLike, mesh: jax.sharding.Mesh, rules: Any = None
) -> ModelDir:
    """`load_model_dir` with every parameter restored straight onto `mesh`, sharded as the
    training state is (so fine-tuning and pretraining can start from it without a host copy)."""
    config, _ = read_config(path)
    return load_model_dir(path, sharding=param_shardings(config, mesh, rules))
