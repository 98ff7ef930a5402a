"""Pretraining configs: the paper's recipe at each size, the phase split, and the model config.

`configs/bert.py` is thin: `get_config(SIZE)` returns `pretraining_config(SIZE)`, which users then
override from the command line (`--config.optimizer.learning_rate=5e-5`). Every setting is
declared once, with its default (the paper's), help and range, in config_schema.py; the config is
built from those declarations, then the size's shapes (`SIZES`) and, for the sizes meant for a
CPU, `CPU_TRIAL` override some of them. The paper's recipe (Devlin et al., 2018; the small sizes
from Turc et al., 2019): Adam lr 1e-4, b1 0.9, b2 0.999, eps 1e-6, weight decay 0.01 (not on
LayerNorm and biases), 10k warmup steps then linear decay, global-norm clipping 1.0, dropout 0.1,
batch 256, 1M steps, 90% of them at sequence length 128 (20 predictions) and 10% at 512 (80).

The sizes meant for a CPU (`CPU_SIZES`: tiny, mini, small) change what a laptop cannot afford or a
short trial needs (`CPU_TRIAL`): 1,000 steps, the embedded corpus, batches of 32 and 8, a warmup
of 10% of the run, and log, checkpoint and eval intervals that fit a few hundred steps; tiny also
trains at lr 1e-3. At every size the model's vocabulary is the tokenizer's unless
`model.vocab_size` is set (`vocab_size`): a run with no tokenizer trains one of
`data.tokenizer_vocab_size` pieces.

Why this file is long: the sizes, the phase split, the warmup and the model's identity read as one
recipe; the declarations live in config_schema.py, the checks in config_checks.py.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import traverse_util

from bert_jax.core import modernbert_config
from bert_jax.core.model import BertConfig
from bert_jax.core.modernbert_config import ModernBertConfig
from bert_jax.data import objectives
from bert_jax.runtime import declarations
from bert_jax.runtime.errors import UserError
from bert_jax.training import config_schema
from bert_jax.training.config_schema import (
    CPU_VOCAB_SIZE,
    FOLLOW_TOKENIZER,
    PHASE_KEYS,
)

log = logging.getLogger("bert_jax")

# The model's architecture beyond the size preset's shapes: a model directory that a run starts
# from (config.init_from) fixes them (adopt_model_identity); BertConfig's declarations mark them.
IDENTITY_FIELDS = declarations.marked(BertConfig, "identity")
_SAME_ACTIVATION = {"gelu_tanh": "gelu_new"}  # two names of one function (bert_config.ACTIVATIONS)
# The position embeddings of every size preset: the bound for records prepared without a model.
PRESET_MAX_POSITIONS = config_schema.default("model.max_position_embeddings")
# The paper's WordPiece vocabulary (BertConfig's): the other sizes' vocabulary where no tokenizer
# is at hand (plan, bench, --compile-only), and that of the parameter counts the paper gives.
PAPER_VOCAB_SIZE = BertConfig.vocab_size
# name: (layers, hidden, heads); intermediate size is 4 x hidden throughout.
SIZES: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}
# ModernBERT's sizes (config.model.family "modernbert"): base and large are the published models
# (core/modernbert_config.py), tiny the CPU size: BERT-Tiny's shapes with a GeGLU 1.5 x hidden
# wide (base's ratio) and a sliding-window layer after the global one.
MODERNBERT_SIZES: dict[str, dict[str, int]] = {
    "tiny": {
        "num_hidden_layers": 2,
        "hidden_size": 128,
        "num_attention_heads": 2,
        "intermediate_size": 192,
        "global_attn_every_n_layers": 2,
        "local_attention": 64,
    },
    **modernbert_config.SIZES,
}
# Sizes meant for a CPU trial (docs/pretraining.md): the paper's recipe with CPU_TRIAL on top.
CPU_SIZES = ("tiny", "mini", "small")
# What the CPU sizes change in the paper's recipe, as --config.KEY overrides. Set these back
# (total_steps 1000000, batch 256, warmup_steps 10000, warmup_fraction 0) for the paper's small
# models. The embedded
# corpus (text that ships with Python) lets them run anywhere.
CPU_TRIAL: dict[str, Any] = {
    "total_steps": 1000,  # a trial of minutes, not the paper's 1,000,000 steps
    "data.source": "embedded",
    "phase1.batch_size": 32,
    "phase2.batch_size": 8,
    "optimizer.warmup_steps": 0,
    "optimizer.warmup_fraction": 0.1,
    "log_every_steps": 10,
    "checkpoint.every_steps": 50,
    "eval.every_steps": 100,
    "eval.batches": 10,
    "eval.batch_size": 32,
}
# The smallest size at a higher rate: docs/pretraining.md's 200-step trial beats the most-frequent-
# token baseline with it (60 steps, at 1e-3 to 4e-3, stay at the baseline).
CPU_LEARNING_RATE = {"tiny": 1e-3}


def _shapes(size: str) -> dict[str, int]:
    """The model settings a size preset sets: its layers, hidden size, heads, FFN (4 x hidden)."""
    if size not in SIZES:
        raise UserError(f"unknown model size {size!r}; choose one of {sorted(SIZES)}")
    layers, hidden, heads = SIZES[size]
    return {
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": 4 * hidden,
    }


def model_config(size: str, family: str | None = None) -> ml_collections.ConfigDict:
    """config.model of a size preset of `family` (None: the declared default, BERT): the declared
    settings of that family with the size's shapes. A ModernBERT size takes its published
    config's values (ModernBertConfig.size) where the section's declaration is BERT's."""
    family = family or config_schema.default("model.family")
    declared = config_schema.section_defaults("model")
    names = config_schema.family_fields(family)
    values = {name: declared[name] for name in names}
    values["family"] = family
    if family == "modernbert":
        if size not in MODERNBERT_SIZES:
            raise UserError(
                f"unknown ModernBERT size {size!r}; choose one of {sorted(MODERNBERT_SIZES)}"
            )
        preset = ModernBertConfig(**MODERNBERT_SIZES[size])
        own = ("family", "vocab_size", "vocab_pad_multiple")  # the recipe's own declarations
        values.update({name: getattr(preset, name) for name in names if name not in own})
    else:
        values.update(_shapes(size))
    return ml_collections.ConfigDict(values)


def family_of(config: ml_collections.ConfigDict) -> str:
    """`config.model.family` (configs written before the setting: the declared default, BERT)."""
    return str(config.model.get("family", config_schema.default("model.family")))


def pretraining_config(size: str | None = None, family: str | None = None):
    """The paper's recipe for one model size of `family` (None: the declared defaults, BERT at
    base): every declared setting (config_schema.py), the family's model section with the
    size's shapes and, for a CPU size, CPU_TRIAL. ModernBERT's own recipe goes on top of this
    in bert_jax/configs/modernbert.py."""
    size = size or config_schema.default("size")
    config = ml_collections.ConfigDict(config_schema.defaults_tree())
    config.size = size
    config.model = model_config(size, family)
    if size in CPU_SIZES:
        for key, value in CPU_TRIAL.items():
            _set(config, key, value)
        config.optimizer.learning_rate = CPU_LEARNING_RATE.get(size, config.optimizer.learning_rate)
    return config


def _set(config: ml_collections.ConfigDict, key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    for part in parents:
        config = config[part]
    config[leaf] = value


def warmup_steps_of(optimizer, steps: int, phase=None) -> int:
    """The warmup of a run (or, with `phase`, of that phase's own schedule) of `steps` steps:
    the phase's warmup_steps where set (>= 0), else optimizer.warmup_steps when > 0, else
    optimizer.warmup_fraction x steps (rounded)."""
    own = int(phase.get("warmup_steps", -1)) if phase is not None else -1
    if own >= 0:
        return own
    if int(optimizer.warmup_steps) > 0:
        return int(optimizer.warmup_steps)
    return int(round(float(optimizer.get("warmup_fraction", 0.0)) * steps))


def resolved_optimizer(
    config: ml_collections.ConfigDict, phases: list[Phase]
) -> tuple[ml_collections.ConfigDict, list[ml_collections.ConfigDict]]:
    """(optimizer, phase configs) with every warmup in steps (warmup_steps_of), as
    core.optim.from_config reads them: the whole run's, or each phase's with "per_phase"."""
    optimizer = ml_collections.ConfigDict(config.optimizer.to_dict())
    total = sum(p.steps for p in phases)
    optimizer.warmup_steps = warmup_steps_of(config.optimizer, total)
    specs = []
    for phase in phases:
        spec = ml_collections.ConfigDict(config[phase.name].to_dict())
        if optimizer.schedule == "per_phase":
            spec.warmup_steps = warmup_steps_of(config.optimizer, phase.steps, config[phase.name])
        specs.append(spec)
    return optimizer, specs


def warmup_warning(config: ml_collections.ConfigDict, phases: list[Phase]) -> str | None:
    """A line when the warmup is not shorter than the run (the rate would never peak)."""
    optimizer, specs = resolved_optimizer(config, phases)
    total = sum(p.steps for p in phases)
    if optimizer.schedule == "per_phase":
        late = [
            f"config.{p.name}: warmup {s.warmup_steps} >= its {p.steps} steps"
            for p, s in zip(phases, specs)
            if s.warmup_steps >= p.steps
        ]
        text = "; ".join(late)
    else:
        text = f"warmup {optimizer.warmup_steps} >= config.total_steps={total}" * (
            optimizer.warmup_steps >= total
        )
    if not text:
        return None
    return (
        f"warning: {text}: the learning rate never reaches config.optimizer.learning_rate="
        f"{config.optimizer.learning_rate:g}; lower config.optimizer.warmup_steps or set it to 0 "
        "and use config.optimizer.warmup_fraction"
    )


def preset_vocab_size(size: str | None, family: str | None = None) -> int:
    """A size's vocabulary where no tokenizer is at hand: the 4,000 pieces the CPU sizes train,
    else the paper's 30522 (ModernBERT's published 50368 for a ModernBERT size)."""
    if size in CPU_SIZES:
        return CPU_VOCAB_SIZE
    return ModernBertConfig.vocab_size if family == "modernbert" else PAPER_VOCAB_SIZE


def vocab_size(config: ml_collections.ConfigDict) -> int:
    """The model's vocabulary: `config.model.vocab_size` when set (> 0); while it follows the
    tokenizer (0) and no tokenizer has been resolved, the size's (preset_vocab_size)."""
    own = int(config.model.vocab_size)
    if own != FOLLOW_TOKENIZER:
        return own
    return preset_vocab_size(config.get("size"), family_of(config))


def bert_config(config: ml_collections.ConfigDict, tokenizer=None) -> BertConfig | ModernBertConfig:
    """The frozen model config of the config's family (BertConfig, or ModernBertConfig): the
    ConfigDict stops at the model's door. A ModernBERT config takes its special-token ids from
    `tokenizer` (they are written into its export); without one they stay the published ones."""
    model = {**config.model.to_dict(), "vocab_size": vocab_size(config)}
    model.pop("family", None)
    if family_of(config) != "modernbert":
        return BertConfig(**model, objective=objective(config))
    if tokenizer is not None:
        model.update(
            pad_token_id=tokenizer.pad_id,
            bos_token_id=tokenizer.cls_id,
            eos_token_id=tokenizer.sep_id,
            cls_token_id=tokenizer.cls_id,
            sep_token_id=tokenizer.sep_id,
        )
    return ModernBertConfig(**model)


def objective(config: ml_collections.ConfigDict) -> str:
    """`config.objective` (configs without the key: the paper's "mlm+nsp")."""
    return objectives.check_objective(
        str(config.get("objective", objectives.DEFAULT_OBJECTIVE)), "config.objective"
    )


def instance_format(config: ml_collections.ConfigDict) -> str:
    """The instance format records are made in for this config (data/objectives.py)."""
    return objectives.instance_format(
        objective(config),
        str(config.data.get("instance_format", "")),
        "config.data.instance_format",
    )


def mask_shares(config: ml_collections.ConfigDict) -> dict[str, float]:
    """The MASK/SAME/RND shares (mask_share, same_share, random_share), validated."""
    from bert_jax.data.masking.settings import check_shares

    shares = {k: config.data.get(k, d) for k, d in objectives.DEFAULT_SHARES.items()}
    check_shares(*shares.values(), tuple(f"config.data.{k}" for k in shares))
    return {k: float(v) for k, v in shares.items()}


def data_shards(config: ml_collections.ConfigDict) -> int:
    """`config.data.shards` (0: one input shard per host; see data/pipeline/input_shards.py)."""
    return int(config.data.get("shards", 0))


@dataclasses.dataclass(frozen=True)
class Phase:
    index: int
    name: str
    start: int  # first step (0-based) of the phase
    steps: int
    max_seq_length: int
    max_predictions_per_seq: int
    batch_size: int  # global
    source: str

    @property
    def end(self) -> int:
        return self.start + self.steps


def split_phases(config: ml_collections.ConfigDict) -> list[Phase]:
    """Phases with their step ranges: phase 1 gets round(fraction x total_steps)."""
    total = int(config.total_steps)
    if total <= 0:
        raise UserError(f"config.total_steps={total} must be positive")
    specs = [(key, config[key]) for key in PHASE_KEYS if key in config]
    fractions = [float(spec.fraction) for _, spec in specs]
    if any(f < 0 for f in fractions) or not math.isclose(sum(fractions), 1.0, abs_tol=1e-6):
        raise UserError(
            "config.phase1.fraction + config.phase2.fraction must be 1, got "
            + " + ".join(str(f) for f in fractions)
        )
    _check_phase_data(config, specs)
    phases, start = [], 0
    for i, (key, spec) in enumerate(specs):
        steps = total - start if i == len(specs) - 1 else int(round(spec.fraction * total))
        if steps <= 0:
            continue
        source = spec.get("data", "") or config.data.source
        phases.append(
            Phase(
                index=i,
                name=key,
                start=start,
                steps=steps,
                max_seq_length=int(spec.max_seq_length),
                max_predictions_per_seq=int(spec.max_predictions_per_seq),
                batch_size=int(spec.batch_size),
                source=source,
            )
        )
        start += steps
    return phases


def _check_phase_data(config: ml_collections.ConfigDict, specs) -> None:
    """Refuses a phase that would read the size preset's default corpus ('embedded') because
    it names no data while another phase names its own: it would train on data nobody chose."""
    own = [key for key, spec in specs if spec.get("data", "") and float(spec.fraction) > 0]
    bare = [key for key, spec in specs if not spec.get("data", "") and float(spec.fraction) > 0]
    family = family_of(config)
    sizes = MODERNBERT_SIZES if family == "modernbert" else SIZES
    default = (
        pretraining_config(config.size, family).data.source if config.get("size") in sizes else ""
    )
    if own and bare and config.data.source and config.data.source == default:
        raise UserError(
            f"config.{own[0]}.data={config[own[0]].data} is set but config.{bare[0]}.data is "
            f"empty, so {bare[0]} would train on config.data.source={config.data.source!r} (the "
            f"{config.size} preset's default): set config.{bare[0]}.data too, or "
            "config.data.source"
        )


def phase_at(phases: list[Phase], step: int) -> Phase:
    """The phase that runs step `step` (0-based); the last phase past the end."""
    for phase in phases:
        if step < phase.end:
            return phase
    return phases[-1]


def adopt_model_identity(
    config: ml_collections.ConfigDict,
    model: Mapping[str, Any],
    source: str,
    explicit: Iterable[str] = (),
) -> list[str]:
    """Makes config.model agree with the model a run starts from in IDENTITY_FIELDS (`model`:
    its config.json values). A field that still holds the size preset's default takes the model's
    value (returned as "config.model.F: old -> new"); one set otherwise (a config file's value
    other than the preset's, or a --config.model.F override listed in `explicit`, even when equal
    to the preset's) is refused with UserError naming both values."""
    family = family_of(config)
    sizes = MODERNBERT_SIZES if family == "modernbert" else SIZES
    preset = model_config(config.size, family) if config.get("size") in sizes else {}
    explicit = set(explicit)
    adopted, conflicts = [], []
    for field in IDENTITY_FIELDS:
        if field not in model:
            continue
        ours, theirs = config.model[field], model[field]
        if _SAME_ACTIVATION.get(ours, ours) == _SAME_ACTIVATION.get(theirs, theirs):
            continue
        key = f"config.model.{field}"
        if key in explicit or field not in preset or preset[field] != ours:
            conflicts.append(f"{key}={ours!r} but the model has {field}={theirs!r}")
        else:
            config.model[field] = type(ours)(theirs)
            adopted.append(f"{key}: {ours!r} -> {theirs!r}")
    if conflicts:
        raise UserError(
            f"{source} conflicts with the config: {'; '.join(conflicts)} (leave these settings "
            "out to take the model's values)"
        )
    return adopted


def model_label(model_config) -> str:
    """The model in a few words: its family and layers/hidden/heads ("ModernBERT 22/768/12")."""
    family = "ModernBERT" if isinstance(model_config, ModernBertConfig) else "BERT"
    shape = (model_config.num_hidden_layers, model_config.hidden_size)
    return f"{family} {shape[0]}/{shape[1]}/{model_config.num_attention_heads}"


def count_parameters(model_config) -> int:
    """Parameters of the pretraining model (BertForPreTraining, ModernBertForMaskedLM), not
    counting vocabulary padding rows."""
    import flax.linen as nn

    from bert_jax.core.trainer import dummy_batch, model_inputs, pretraining_model

    shapes = jax.eval_shape(
        lambda: pretraining_model(model_config.replace(vocab_pad_multiple=1)).init(
            jax.random.key(0), **model_inputs(dummy_batch(1, 8, 2))
        )
    )
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(nn.meta.unbox(shapes)["params"])))


def flat_settings(config: ml_collections.ConfigDict) -> list[tuple[str, Any]]:
    """(dotted key, value) for every setting, in the order of the nested keys."""
    flat = traverse_util.flatten_dict(config.to_dict())
    return [(".".join(path), flat[path]) for path in sorted(flat)]
