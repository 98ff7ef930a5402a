"""The pretraining config's settings, each declared once: a section's dataclass of `setting(...)`
fields (default, help, range or choices; runtime/declarations.py).

The config (`config_lib.pretraining_config`) is built from these declarations, then the size's
shapes and the CPU sizes' changes override some of them; the range and choice checks
(`problems`, read by config_checks), the `--config-help` listing (`listing`) and the walking
test come from them too. Defaults owned elsewhere are read, never written again: the model's
from its family's declarations (`BertConfig`'s, `ModernBertConfig`'s; `model.family` picks which
of them a config holds), the data settings that `data prepare`
shares from `PrepareSettings`' (data/preparation/settings.py), the masking and pairing defaults
from data/objectives.py, the optimizer's closed sets from core/optim.py.

Sections: `RunSection` (the top level), `model`, `optimizer`, `phase1`/`phase2` (one
`PhaseSection` used twice: phase 2 is the paper's second phase, `SECOND_PHASE`), `data`,
`eval`, `checkpoint`, `mesh`.

Why this file is long: it is the one table of every pretraining setting, section by section;
the config builder, its checks and `--config-help` walk it whole, and a setting's declaration
belongs beside its section's others.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
from collections.abc import Iterator
from typing import Any

from bert_jax.convert import model_dir
from bert_jax.core import optim, partitioning
from bert_jax.core.bert_config import BertConfig
from bert_jax.core.prng_impls import DROPOUT_RNG_IMPLS
from bert_jax.data import objectives
from bert_jax.data.preparation.settings import PrepareSettings
from bert_jax.data.tokenizers.train_settings import TokenizerTrainSettings
from bert_jax.runtime.declarations import Declaration, declarations, declared_fields, setting

# config.model.vocab_size's default at every size: the model's vocabulary is the run's
# tokenizer's (inputs.follow_tokenizer). A value above 0 is the user's, honoured and checked.
FOLLOW_TOKENIZER = 0
# The vocabulary of the sizes meant for a CPU: the SentencePiece model trained for the run (and
# so the model's embedding rows, padded to 4096 by vocab_pad_multiple).
CPU_VOCAB_SIZE = 4000
MIN_SEQ_LENGTH = 5  # [CLS] A [SEP] B [SEP]


@dataclasses.dataclass(frozen=True)
class RunSection:
    """The top level: the run as a whole."""

    size: str = setting(
        "base",
        "the size preset the config was built from (bert:SIZE); the model's settings override "
        "its shapes",
    )
    seed: int = setting(0, "seeds the parameter init, the dropout keys and the data order")
    # With the default hash masks (model.dropout_impl) it only derives three words per dropout
    # site and step; with "prng" masks it draws every bit: "rbg" through XLA's RngBitGenerator,
    # "threefry2x32" (slower: recomputed in backward fusions). Same masks on any mesh (tested).
    # Parameter init always uses threefry2x32.
    dropout_rng_impl: str = setting(
        "rbg",
        "PRNG of the dropout keys (jax.random key implementations); parameter init always uses "
        "threefry2x32",
        choices=DROPOUT_RNG_IMPLS,
    )
    total_steps: int = setting(1_000_000, "train steps of the whole run, both phases", low=1)
    objective: str = setting(
        objectives.DEFAULT_OBJECTIVE,
        "what pretraining trains (docs/ablations.md): mlm+nsp (the paper's), mlm (masked LM "
        "only: no NSP loss or metrics) or ltr (left-to-right LM: causal attention, every "
        "position predicts the next token; fine-tuning keeps the causal mask)",
        choices=objectives.OBJECTIVES,
    )
    grad_accum_steps: int = setting(
        1, "micro-batches per step (exact: sums divided by the full batch's weights)", low=1
    )
    log_every_steps: int = setting(100, "steps between metrics rows and lines", low=1)
    resume_from: str = setting(
        "", "a checkpoint directory or workdir of another run: state and data position"
    )
    init_from: str = setting("", "a model directory: params only (optimizer and step start anew)")
    max_consecutive_nonfinite: int = setting(
        10, "non-finite steps in a row (each skipped) that stop the run", low=0
    )
    export_model: bool = setting(True, "export a model directory (<workdir>/model) at the end")


# The model families a run pretrains (config.model.family), each by its config class: the model
# directory's own table (config.json's model_type names them the same way).
FAMILIES: dict[str, type] = model_dir.FAMILIES
# Not settings of the run: the model's special-token ids are the tokenizer's; its objective is
# config.objective (the run's).
_NOT_SETTINGS = ("objective", "pad_token_id", "bos_token_id", "eos_token_id", "cls_token_id")
_NOT_SETTINGS += ("sep_token_id",)


def _model_section() -> type:
    """The `model` section: the family, then every family's declared fields (BertConfig's first:
    a name both families have is BertConfig's declaration), with the pretraining recipe's own
    declaration where it differs from the model's, less those the config does not set."""
    own = {
        "family": setting(
            "bert",
            "the model pretrained: bert (the paper's) or modernbert (docs/modernbert.md); "
            "config.model then holds that family's settings",
            choices=tuple(FAMILIES),
        ),
        "vocab_size": setting(
            FOLLOW_TOKENIZER,
            "rows of the word-embedding table; 0: the tokenizer's (a value above 0 is honoured "
            "and checked against it)",
            low=0,
        ),
        # 30522 -> 30592 rows: splits over <= 128 devices (BertConfig.vocab_pad_multiple).
        "vocab_pad_multiple": setting(
            128, "word-embedding rows padded to a multiple of this (1: none)", low=1
        ),
    }
    fields = [("family", str, own["family"])]
    for family in FAMILIES.values():
        for f in declared_fields(family):
            if f.name in _NOT_SETTINGS or f.name in {name for name, _, _ in fields}:
                continue
            declared = dataclasses.field(default=f.default, metadata=f.metadata)
            fields.append((f.name, f.type, own.get(f.name, declared)))
    return dataclasses.make_dataclass(
        "ModelSection",
        fields,
        frozen=True,
        namespace={
            "__doc__": "config.model: the family's settings (core/bert_config.py, "
            "core/modernbert_config.py)."
        },
    )


def family_fields(family: str) -> tuple[str, ...]:
    """The names of config.model's settings a config of `family` holds: `family` and the
    family's own declared fields (model.family chooses; the rest belong to the other one)."""
    names = {f.name for f in declared_fields(FAMILIES[family])}
    return tuple(n for n in declarations(ModelSection) if n == "family" or n in names)


ModelSection = _model_section()


@dataclasses.dataclass(frozen=True)
class OptimizerSection:
    """config.optimizer: the paper's Adam with weight decay, warmup, decay and clipping."""

    name: str = setting(
        "adamw",
        "adamw (the paper's), lamb for large batches, or stableadamw (ModernBERT's StableAdamW)",
        choices=optim.OPTIMIZERS,
    )
    learning_rate: float = setting(1e-4, "peak learning rate", low=0.0)
    end_learning_rate: float = setting(0.0, "the rate the decay ends at", low=0.0)
    warmup_steps: int = setting(
        10_000,
        "linear warmup steps; 0: optimizer.warmup_fraction of the steps (each phase's with "
        "schedule per_phase); both 0: none",
        low=0,
    )
    warmup_fraction: float = setting(
        0.0, "the warmup as a share of the steps, when warmup_steps is 0", low=0.0, high=1.0
    )
    b1: float = setting(0.9, "Adam's beta1", low=0.0, high=1.0, high_open=True)
    b2: float = setting(0.999, "Adam's beta2", low=0.0, high=1.0, high_open=True)
    eps: float = setting(1e-6, "Adam's epsilon", low=0.0, low_open=True)
    weight_decay: float = setting(
        0.01,
        "decoupled weight decay (not on LayerNorm and biases)",
        low=0.0,
        high=1.0,
        high_open=True,
    )
    decouple_lr: bool = setting(
        False,
        "the weight decay scaled by lr / peak (optimi's decouple_lr, ModernBERT's), not by lr",
    )
    clip_norm: float = setting(1.0, "gradient clipping at this global norm (0: none)", low=0.0)
    bias_correction: bool = setting(
        True, "Adam bias correction (False: the original code's optimizer exactly)"
    )
    schedule: str = setting(
        "whole_run",
        "whole_run (the paper's: one warmup and decay over the run) or per_phase (each phase "
        "warms up and decays on its own)",
        choices=optim.SCHEDULES,
    )
    decay: str = setting(
        optim.DEFAULT_DECAY,
        "the decay's shape after the warmup: linear (the paper's), cosine, or wsd (warmup-"
        "stable-decay, ModernBERT's trapezoid: the peak held, then a 1-sqrt decay over the last "
        "optimizer.decay_fraction of the steps)",
        choices=optim.DECAYS,
    )
    decay_fraction: float = setting(
        0.1,
        "with decay wsd: the share of the steps (each phase's with schedule per_phase) the "
        "rate decays over at the end",
        low=0.0,
        high=1.0,
    )


@dataclasses.dataclass(frozen=True)
class PhaseSection:
    """config.phase1 and config.phase2: one phase of the run (the paper's first by default;
    `SECOND_PHASE` holds what the second changes)."""

    fraction: float = setting(0.9, "share of config.total_steps", low=0.0, high=1.0)
    max_seq_length: int = setting(
        objectives.MAX_SEQ_LENGTH,
        f"tokens per instance (at least {MIN_SEQ_LENGTH}: [CLS] A [SEP] B [SEP])",
        low=MIN_SEQ_LENGTH,
    )
    max_predictions_per_seq: int = setting(
        objectives.MAX_PREDICTIONS_PER_SEQ,
        "masked positions per instance at most (at most max_seq_length)",
        low=1,
    )
    batch_size: int = setting(256, "global batch size (all hosts together)", low=1)
    data: str = setting("", "the phase's own data ('': config.data.source)")
    learning_rate: float = setting(
        -1.0,
        "the phase's peak rate with optimizer.schedule per_phase (-1: the optimizer's)",
        low=0.0,
        also=(-1,),
    )
    warmup_steps: int = setting(
        -1,
        "the phase's warmup with optimizer.schedule per_phase (-1: the optimizer's)",
        low=0,
        also=(-1,),
    )
    # Sequence packing (data/pipeline/packing.py): several instances share a row with attention
    # kept within each. About 0.95 x max_seq_length / mean instance length fills rows (1.6 for
    # the embedded corpus at 512); instances that do not fit are dropped.
    packing_factor: float = setting(
        0.0,
        "records read per packed row, several instances sharing a row (0: one per row); "
        "training only, not evaluation",
        low=1.0,
        also=(0,),
    )


# The paper's second phase: the rest of the steps at the model's full length (every preset's
# position embeddings), with 80 predictions.
SECOND_PHASE = {
    "fraction": round(1.0 - PhaseSection.fraction, 6),
    "max_seq_length": BertConfig.max_position_embeddings,
    "max_predictions_per_seq": 80,
}


def _from_prepare(name: str) -> dataclasses.Field:
    """A data setting `data prepare` shares: its declaration in PrepareSettings, as it is."""
    field = next(f for f in declared_fields(PrepareSettings) if f.name == name)
    return dataclasses.field(default=field.default, metadata=field.metadata)


@dataclasses.dataclass(frozen=True)
class DataSection:
    """config.data: what a run trains on, and how a corpus is prepared on the fly."""

    source: str = setting(
        "",
        "prepared records (`bert-jax data prepare`), a corpus prepared on the fly (text files, "
        ".jsonl, tfds:NAME[/CONFIG][:SPLIT]) or embedded (text that ships with Python)",
    )
    tokenizer: str = setting(
        "",
        "tokenizer directory, SentencePiece .model or WordPiece vocab.txt ('': the one saved "
        "next to prepared records, else a SentencePiece model trained on the corpus)",
    )
    tokenizer_vocab_size: int = setting(
        CPU_VOCAB_SIZE,
        "pieces of the SentencePiece model a run trains when it has none",
        low=declarations(TokenizerTrainSettings)["vocab_size"].low,  # the trainer's own floor
    )
    lowercase: bool = setting(True, "the tokenizer a run trains lowercases")
    dynamic_masking: bool = setting(True, "masks drawn anew each epoch in the pipeline")
    whole_word_mask: bool = _from_prepare("whole_word_mask")
    masked_lm_prob: float = _from_prepare("masked_lm_prob")
    # The shares of the selected tokens that become [MASK], stay the same, or become a random
    # token (the paper's 80/10/10; its Table 8 tries others). They sum to 1.
    mask_share: float = _from_prepare("mask_share")
    same_share: float = _from_prepare("same_share")
    random_share: float = _from_prepare("random_share")
    instance_format: str = _from_prepare("instance_format")
    short_seq_prob: float = _from_prepare("short_seq_prob")
    random_next_prob: float = _from_prepare("random_next_prob")
    dupe_factor: int = setting(
        -1,
        "passes over a corpus prepared on the fly (-1: 1 with dynamic masking, else data "
        "prepare's default)",
        low=1,
        also=(-1,),
    )
    splitter: str = _from_prepare("splitter")
    shuffle_buffer_size: int = setting(10_000, "records shuffled together", low=1)
    cache_dir: str = setting("", "where a corpus is prepared ('': <workdir>/data)")
    num_workers: int = _from_prepare("num_workers")
    # data/pipeline/input_shards.py. A fixed number (a multiple of every host count you will
    # use) keeps the data order, and exact resume, independent of how many hosts run the job.
    shards: int = setting(
        0, "disjoint input shards the global batch is drawn from (0: one per host)", low=0
    )
    skip_corrupt_records: bool = setting(
        False,
        "train on a damaged TFRecord file's records before the damage, counted as "
        "corrupt_records (False: the run stops naming the file)",
    )


@dataclasses.dataclass(frozen=True)
class EvalSection:
    """config.eval: held-out evaluation during the run (eval_choice.py decides on what)."""

    # Not bounded here: with evaluation off, batches and batch_size are not read (a check
    # across the keys asks for them only when every_steps > 0).
    every_steps: int = setting(10_000, "steps between evaluations, and at the end (0: none)")
    batches: int = setting(20, "batches per evaluation")
    batch_size: int = setting(64, "global batch size of an evaluation")
    source: str = setting(
        "",
        "what to evaluate on ('': the records' held-out records, or the embedded corpus's "
        "held-out split)",
    )


@dataclasses.dataclass(frozen=True)
class CheckpointSection:
    """config.checkpoint: Orbax checkpoints of the run."""

    every_steps: int = setting(10_000, "steps between checkpoints, and at the end", low=1)
    keep: int = setting(3, "checkpoints kept", low=1)
    async_save: bool = setting(True, "save while training continues")


@dataclasses.dataclass(frozen=True)
class MeshSection:
    """config.mesh: the device mesh and the sharding rules."""

    shape: tuple[int, int, int] = setting(
        (-1, 1, 1), "(data, fsdp, tensor) sizes; -1 takes the remaining devices"
    )
    rules: tuple = setting(
        partitioning.DEFAULT_RULES,
        "logical axis -> mesh axes, tried in order (core/partitioning.py)",
    )
    shard_optimizer_state: bool = setting(False, "ZeRO 1: Adam slots split over `data` too")
    windowed_einsum: bool = setting(
        True, "XLA:TPU's windowed matmuls for FSDP/tensor axes (other backends ignore it)"
    )


PHASE_KEYS = ("phase1", "phase2")
# Section -> its declarations ("": the top level). The config's keys, in this order.
SECTIONS: dict[str, type] = {
    "": RunSection,
    "model": ModelSection,
    "optimizer": OptimizerSection,
    "phase1": PhaseSection,
    "phase2": PhaseSection,
    "data": DataSection,
    "eval": EvalSection,
    "checkpoint": CheckpointSection,
    "mesh": MeshSection,
}
# What a section's values change from its declared defaults.
_SECTION_CHANGES = {"phase2": SECOND_PHASE}


def section_defaults(section: str) -> dict[str, Any]:
    """name -> default of every setting of `section` (phase2 with SECOND_PHASE)."""
    values = {f.name: f.default for f in declared_fields(SECTIONS[section])}
    return {**values, **_SECTION_CHANGES.get(section, {})}


def defaults_tree() -> dict[str, Any]:
    """The config's nested dict of declared defaults: the recipe before any size."""
    tree: dict[str, Any] = dict(section_defaults(""))
    for section in SECTIONS:
        if section:
            tree[section] = section_defaults(section)
    return tree


def keys(family: str | None = None) -> Iterator[str]:
    """Every declared key, dotted (`total_steps`, `phase1.batch_size`), in SECTIONS' order; with
    `family`, those a config of that model family holds (family_fields)."""
    for section, cls in SECTIONS.items():
        for name in declarations(cls):
            if section == "model" and family is not None and name not in family_fields(family):
                continue
            yield f"{section}.{name}" if section else name


def declaration(key: str) -> Declaration:
    """The declaration of the dotted key `key` (KeyError for one that is not declared)."""
    section, _, name = key.rpartition(".")
    return declarations(SECTIONS[section])[name]


def default(key: str) -> Any:
    """The declared default of the dotted key `key` (phase2's own where it differs)."""
    section, _, name = key.rpartition(".")
    return section_defaults(section)[name]


def choices() -> dict[str, tuple[Any, ...]]:
    """Dotted key -> allowed values, for every setting with a closed set."""
    return {key: declaration(key).choices for key in keys() if declaration(key).choices}


def setting_value(config: Any, key: str) -> Any:
    """The value at a dotted key, None where the config lacks it."""
    for part in key.split("."):
        config = config.get(part) if hasattr(config, "get") else None
    return config


def choice_problems(config: Any) -> list[str]:
    """One line per declared setting of `config` outside its closed set, named `config.KEY`
    (a setting the config lacks, or holds as None, is not checked)."""
    found = []
    for key in keys():
        declared, value = declaration(key), setting_value(config, key)
        if declared.choices is not None and not declared.allows(value):
            listed = ", ".join(repr(choice) for choice in declared.choices)
            found.append(f"config.{key}={value!r} is not one of {listed}")
    return found


def range_problems(config: Any) -> list[str]:
    """One line per declared setting of `config` outside its range, named `config.KEY`."""
    found = []
    for key in keys():
        declared, value = declaration(key), setting_value(config, key)
        if declared.choices is None and not declared.allows(value):
            limits = declared.range_text()
            found.append(f"config.{key}={value!r} must be {limits}")
    return found


def listing(config: Any = None) -> str:
    """Every setting, a few lines each: `key = default`, its range or choices, its help; with
    `config`, the config's value where it differs from the declared default (`bert-jax
    pretrain --config-help`)."""
    lines = [
        "Settings of the pretraining config, each a --config.KEY=VALUE override (a size preset "
        "sets the model's shapes; tiny, mini and small also change the batches and intervals):"
        if config is None
        else "Settings of this config, each a --config.KEY=VALUE override:"
    ]
    for key in keys():
        declared, value = declaration(key), default(key)
        text = f"{key} = {value!r}"
        if config is not None:
            own = setting_value(config, key)
            if own is not None and not _same(own, value):
                text = f"{key} = {own!r} (declared default {value!r})"
        limits = declared.range_text()
        lines.append(text + (f"  [{limits}]" if limits else ""))
        about = declared.help + (f" ({declared.zero})" if declared.zero else "")
        lines.append(textwrap.fill(about, 100, initial_indent=" " * 4, subsequent_indent=" " * 4))
    return "\n".join(lines)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b
