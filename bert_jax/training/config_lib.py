"""Pretraining configs: the paper's defaults, the phase split, validation, `describe` and sizes.

`configs/bert.py` is thin: `get_config(SIZE)` returns `pretraining_config(SIZE)`, which users then
override from the command line (`--config.optimizer.learning_rate=5e-5`). Defaults are the paper's
(Devlin et al., 2018; the small sizes from Turc et al., 2019): Adam lr 1e-4, b1 0.9, b2 0.999,
eps 1e-6, weight decay 0.01 (not on LayerNorm and biases), 10k warmup steps then linear decay,
global-norm clipping 1.0, dropout 0.1, batch 256, 1M steps, 90% of them at sequence length 128
(20 predictions) and 10% at 512 (80 predictions).

The sizes meant for a CPU (`CPU_SIZES`: tiny, mini, small) change what a laptop cannot afford or a
short trial needs (`CPU_TRIAL`): batches of 32 and 8, a 4,000-piece tokenizer trained for the run,
a warmup of 10% of the run, and log, checkpoint and eval intervals that fit a few hundred steps;
tiny also trains at lr 1e-3. At every size the model's vocabulary is the tokenizer's unless
`model.vocab_size` is set (`vocab_size`).

Why this file is long: the paper's defaults, the CPU sizes' changes to them and the phase split
read as one recipe, and `describe` prints that recipe; the checks live in config_checks.py.
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

from bert_jax.core import optim, partitioning
from bert_jax.core.model import BertConfig
from bert_jax.data import objectives, sentences
from bert_jax.runtime.errors import UserError

log = logging.getLogger("bert_jax")

PHASE_KEYS = ("phase1", "phase2")
# The model's architecture beyond the size preset's shapes: a model directory that a run starts
# from (config.init_from) fixes them (adopt_model_identity).
IDENTITY_FIELDS = (
    "vocab_size",
    "hidden_act",
    "layer_norm_eps",
    "type_vocab_size",
    "max_position_embeddings",
)
_SAME_ACTIVATION = {"gelu_tanh": "gelu_new"}  # two names of one function (bert_config.ACTIVATIONS)
MIN_SEQ_LENGTH = 5  # [CLS] A [SEP] B [SEP]
# The position embeddings of every size preset: the bound for records prepared without a model.
PRESET_MAX_POSITIONS = 512

# config.model.vocab_size's default at every size: the model's vocabulary is the run's tokenizer's
# (inputs.follow_tokenizer). A value above 0 is the user's, honoured and checked against it.
FOLLOW_TOKENIZER = 0
# The vocabulary of the sizes meant for a CPU: the SentencePiece model trained for the run (and
# so the model's embedding rows, padded to 4096 by vocab_pad_multiple).
CPU_VOCAB_SIZE = 4000
# The paper's WordPiece vocabulary: the other sizes' vocabulary where no tokenizer is at hand
# (plan, bench, --compile-only), and that of the parameter counts the paper gives.
PAPER_VOCAB_SIZE = 30522
# name: (layers, hidden, heads); intermediate size is 4 x hidden throughout.
SIZES: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}
# Sizes meant for a CPU trial (docs/pretraining.md): the paper's recipe with CPU_TRIAL on top.
CPU_SIZES = ("tiny", "mini", "small")
# What the CPU sizes change in the paper's recipe, as --config.KEY overrides. Set these back
# (batch 256, warmup_steps 10000, warmup_fraction 0) for the paper's small models.
CPU_TRIAL: dict[str, Any] = {
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


def model_config(size: str) -> ml_collections.ConfigDict:
    if size not in SIZES:
        raise UserError(f"unknown model size {size!r}; choose one of {sorted(SIZES)}")
    layers, hidden, heads = SIZES[size]
    return ml_collections.ConfigDict(
        {
            "vocab_size": FOLLOW_TOKENIZER,  # the tokenizer's (vocab_size)
            "hidden_size": hidden,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "intermediate_size": 4 * hidden,
            "hidden_act": "gelu",
            "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1,
            "max_position_embeddings": 512,
            "type_vocab_size": 2,
            "initializer_range": 0.02,
            "layer_norm_eps": 1e-12,
            "dtype": "float32",
            "param_dtype": "float32",
            "attention_impl": "auto",
            "sparse_last_layer": True,
            "dropout_impl": "hash",
            "vocab_pad_multiple": 128,  # 30522 -> 30592 rows: splits over <= 128 devices
            "remat": "none",  # per-layer rematerialization: none|full|dots (model.BertConfig)
        }
    )


def pretraining_config(size: str) -> ml_collections.ConfigDict:
    """The paper's pretraining recipe for one model size."""
    config = ml_collections.ConfigDict()
    config.size = size
    config.model = model_config(size)
    config.seed = 0
    # PRNG of the dropout keys (jax.random key implementations). With the default hash masks
    # (model.dropout_impl) it only derives three words per dropout site and step; with "prng"
    # masks it draws every bit: "rbg" through XLA's RngBitGenerator, "threefry2x32" (slower:
    # recomputed in backward fusions). Same masks on any mesh (tested). Parameter init always
    # uses threefry2x32.
    config.dropout_rng_impl = "rbg"
    config.total_steps = 1_000_000
    # What pretraining trains (docs/ablations.md): "mlm+nsp" (the paper's), "mlm" (masked LM
    # only: no NSP loss, no NSP metrics) or "ltr" (left-to-right LM: causal attention, every
    # position predicts the next token; fine-tuning keeps the causal mask).
    config.objective = objectives.DEFAULT_OBJECTIVE
    config.optimizer = ml_collections.ConfigDict(
        {
            "name": "adamw",
            "learning_rate": 1e-4,
            "end_learning_rate": 0.0,
            # Warmup: warmup_steps when > 0, else warmup_fraction x total_steps (each phase's steps
            # with schedule "per_phase"); both 0: none (warmup_steps_of).
            "warmup_steps": 10_000,
            "warmup_fraction": 0.0,
            "b1": 0.9,
            "b2": 0.999,
            "eps": 1e-6,
            "weight_decay": 0.01,
            "clip_norm": 1.0,
            "bias_correction": True,
        }
    )
    config.optimizer.schedule = "whole_run"  # or "per_phase" (each phase warms up and decays)
    # The decay's shape after the warmup: core.optim.DECAYS ("linear", the paper's; "cosine").
    config.optimizer.decay = optim.DEFAULT_DECAY
    config.grad_accum_steps = 1
    # Global batch sizes (all hosts together); each phase may name its own data (`data`: '' uses
    # config.data.source) and, with optimizer.schedule="per_phase", its own learning_rate and
    # warmup_steps (-1: the optimizer's).
    phase = lambda fraction, length, predictions: ml_collections.ConfigDict(  # noqa: E731
        {
            "fraction": fraction,
            "max_seq_length": length,
            "max_predictions_per_seq": predictions,
            "batch_size": 256,
            "data": "",
            "learning_rate": -1.0,
            "warmup_steps": -1,
            # Sequence packing (data/pipeline/packing.py): records read per packed row, several
            # instances sharing a row with attention kept within each; 0 = one per row. About
            # 0.95 x max_seq_length / mean instance length fills rows (1.6 for the embedded corpus
            # at 512); instances that do not fit are dropped. Training only, not evaluation.
            "packing_factor": 0.0,
        }
    )
    config.phase1 = phase(0.9, 128, 20)
    config.phase2 = phase(0.1, 512, 80)
    small = size in ("tiny", "mini", "small")
    config.data = ml_collections.ConfigDict(
        {
            # Prepared records (`bert-jax data prepare`), a corpus (text files in the original
            # format, .jsonl, tfds:NAME[/CONFIG][:SPLIT]) prepared on the fly, or "embedded" (text
            # that ships with Python: the default for the small sizes, so they run anywhere).
            "source": "embedded" if small else "",
            # Tokenizer directory, SentencePiece .model or WordPiece vocab.txt. Empty: the one
            # saved next to prepared records, else a SentencePiece model trained on the corpus.
            "tokenizer": "",
            # The pieces of the SentencePiece model a run trains when it has no tokenizer.
            "tokenizer_vocab_size": CPU_VOCAB_SIZE,
            "lowercase": True,
            "dynamic_masking": True,
            "whole_word_mask": False,
            "masked_lm_prob": objectives.MASKED_LM_PROB,
            # The shares of the selected tokens that become [MASK], stay the same, or become a
            # random token: mask_share, same_share, random_share (the paper's 80/10/10,
            # data/objectives.py; its Table 8 tries others). Sum to 1.
            **objectives.DEFAULT_SHARES,
            # Instances: "sentence_pairs" ([CLS] A [SEP] B [SEP], NSP's), "doc_sentences" or
            # "full_sentences" (RoBERTa's, without NSP; data/objectives.py); "": the objective's
            # default (sentence_pairs with NSP, else full_sentences).
            "instance_format": "",
            "short_seq_prob": objectives.SHORT_SEQ_PROB,
            "dupe_factor": -1,  # on-the-fly preparation; -1: 1 with dynamic masking, else 5
            # Sentence splitter for a prose corpus prepared on the fly (data prepare --splitter).
            "splitter": sentences.DEFAULT_SPLITTER,
            "shuffle_buffer_size": 10_000,
            "cache_dir": "",  # default <workdir>/data
            "num_workers": 1,
            # Disjoint input shards the global batch is drawn from (data/pipeline/input_shards.py);
            # 0: one per host. A fixed number (a multiple of every host count you will use) keeps
            # the data order, and exact resume, independent of how many hosts run the job.
            "shards": 0,
            # A damaged TFRecord file (truncated, flipped bytes) stops the run naming the file;
            # True: train on its records before the damage, counted as the iterator's
            # `corrupt_records` (data/records/integrity.py).
            "skip_corrupt_records": False,
        }
    )
    config.eval = ml_collections.ConfigDict(
        {
            "every_steps": 10_000,
            "batches": 20,
            "batch_size": 64,
            "source": "",  # default: embedded:eval when training on the embedded corpus
        }
    )
    config.checkpoint = ml_collections.ConfigDict(
        {"every_steps": 10_000, "keep": 3, "async_save": True}
    )
    config.log_every_steps = 100
    config.resume_from = ""  # a checkpoint directory or workdir of another run
    config.init_from = ""  # a model directory: params only
    config.max_consecutive_nonfinite = 10
    config.export_model = True
    config.mesh = ml_collections.ConfigDict(
        {
            "shape": (-1, 1, 1),  # (data, fsdp, tensor); -1 takes the remaining devices
            # Logical axis -> mesh axes, tried in order (see bert_jax/core/partitioning.py).
            "rules": partitioning.DEFAULT_RULES,
            "shard_optimizer_state": False,  # ZeRO 1: Adam slots split over `data` too
            # XLA:TPU's windowed matmuls for FSDP/tensor axes (partitioning.compiler_options)
            "windowed_einsum": True,
        }
    )
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


def preset_vocab_size(size: str | None) -> int:
    """A size's vocabulary where no tokenizer is at hand: the 4,000 pieces the CPU sizes train,
    else the paper's 30522."""
    return CPU_VOCAB_SIZE if size in CPU_SIZES else PAPER_VOCAB_SIZE


def vocab_size(config: ml_collections.ConfigDict) -> int:
    """The model's vocabulary: `config.model.vocab_size` when set (> 0); while it follows the
    tokenizer (0) and no tokenizer has been resolved, the size's (preset_vocab_size)."""
    own = int(config.model.vocab_size)
    return own if own != FOLLOW_TOKENIZER else preset_vocab_size(config.get("size"))


def bert_config(config: ml_collections.ConfigDict) -> BertConfig:
    """The frozen model config: the ConfigDict stops at the model's door."""
    model = {**config.model.to_dict(), "vocab_size": vocab_size(config)}
    return BertConfig(**model, objective=objective(config))


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
    default = pretraining_config(config.size).data.source if config.get("size") in SIZES else ""
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
    preset = model_config(config.size) if config.get("size") in SIZES else {}
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


def count_parameters(model_config) -> int:
    """Parameters of BertForPreTraining, not counting vocabulary padding rows."""
    import flax.linen as nn

    from bert_jax.core.model import BertForPreTraining
    from bert_jax.core.trainer import dummy_batch, model_inputs

    shapes = jax.eval_shape(
        lambda: BertForPreTraining(model_config.replace(vocab_pad_multiple=1)).init(
            jax.random.key(0), **model_inputs(dummy_batch(1, 8, 2))
        )
    )
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(nn.meta.unbox(shapes)["params"])))


def setting_value(config, key: str):
    """The value at a dotted key, None where the config lacks it."""
    for part in key.split("."):
        config = config.get(part) if hasattr(config, "get") else None
    return config


def flat_settings(config: ml_collections.ConfigDict) -> list[tuple[str, Any]]:
    """(dotted key, value) for every setting, in the order of the nested keys."""
    flat = traverse_util.flatten_dict(config.to_dict())
    return [(".".join(path), flat[path]) for path in sorted(flat)]
