"""What a fine-tuning run is given: its settings (`FinetuneSettings`, each task's recipe over
them) and the pretrained encoder it starts from (`PretrainedEncoder`, `load_pretrained`: a BERT
or ModernBERT model directory's encoder).

Every setting is declared once, as a field of `FinetuneSettings` made by `setting(...)`: its
default, help, allowed range or choices, and what it shapes (a trial's result, the compiled step,
or swept by `bert-jax glue`). Everything else reads the declaration: the `finetune` and `glue`
flags and their help (`cli/finetune.py`), the checks (`FinetuneSettings.__post_init__`), which
settings a finished run must match to be reused (`TRIAL_SETTINGS`), the compiled step's cache key
(`step_settings`), the sweep's lists and their defaults (`SWEPT`), and the reports' protocol
block (`to_dict`). This module imports no NumPy or JAX: `--help` reads it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from bert_jax.core.prng_impls import DROPOUT_IMPLEMENTATIONS
from bert_jax.finetune.tasks.task import Task
from bert_jax.runtime.declarations import Declaration, setting
from bert_jax.runtime.errors import UserError

if TYPE_CHECKING:
    from bert_jax.core.model import BertConfig
    from bert_jax.core.modernbert_config import ModernBertConfig

# The values of the `optimizer` setting. "bert": BERT AdamW (bias correction as
# `adam_bias_correction` says) with google-research/bert's warmup (int(proportion * steps)) and
# linear decay as `decay_from` says. "adamw-hf": Hugging Face's Trainer: torch AdamW (bias
# correction) with `get_linear_schedule_with_warmup` (ceil(proportion * steps) warmup steps,
# decay from the warmup's end) and `clip_grad_norm_`. Both take Adam's epsilon from
# `adam_epsilon` and skip weight decay on biases and LayerNorm parameters. (`tuning.tuning_loop`
# builds them.)
OPTIMIZERS = ("bert", "adamw-hf")
# The values of the `keep_models` setting: which fine-tuned model directories a run keeps
# (runs/finetuned_model.py writes them).
KEEP_MODELS = ("selected", "all", "none")


def _mesh_shape(text: str) -> tuple[int, int, int]:
    """`-1,1,1` -> (-1, 1, 1): the data, FSDP and tensor axes (-1: every device left)."""
    try:
        shape = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise UserError(f"--mesh-shape {text!r}: three integers DATA,FSDP,TENSOR") from None
    return shape  # type: ignore[return-value]


@dataclasses.dataclass(frozen=True)
class FinetuneSettings:
    """One fine-tuning run's hyperparameters; the defaults are the paper's GLUE recipe (a task's
    registered recipe, `Task.defaults`, replaces some of them)."""

    learning_rate: float = setting(
        2e-5,
        "peak learning rate",
        low=0.0,
        low_open=True,
        swept=(5e-5, 4e-5, 3e-5, 2e-5),  # the paper's GLUE grid
        metavar="LR",
    )
    seed: int = setting(
        0, "seed of the head's init, shuffling and dropout", swept=(0,), metavar="SEED"
    )
    epochs: float = setting(3.0, "passes over the training set", low=0.0, low_open=True, trial=True)
    batch_size: int = setting(32, "training batch size (global)", low=1, trial=True)
    eval_batch_size: int = setting(32, "evaluation and prediction batch size (global)", low=1)
    max_seq_length: int = setting(128, "tokens per example (sub-tokens)", low=2, trial=True)
    warmup_proportion: float = setting(
        0.1, "share of the steps with a linear warmup", low=0.0, high=1.0, trial=True
    )
    weight_decay: float = setting(
        0.01, "AdamW weight decay (not on LayerNorm and biases)", low=0.0, trial=True, step=True
    )
    dropout: float = setting(
        0.1,
        "dropout of the encoder and the head",
        low=0.0,
        high=1.0,
        high_open=True,
        trial=True,
        step=True,
    )
    # The hash by default, as in pretraining: its steps are faster (prng's take 1.25-1.30x on
    # CPU), and over 110 seeds of the negation set the scores' mean and spread are the same with
    # either (docs/finetuning.md). prng is Flax's nn.Dropout, for runs that want JAX's PRNG.
    dropout_impl: str = setting(
        "hash",
        "where the dropout masks come from: hash (bert-jax's keyed counter hash, fused into "
        "the op; pretraining's default) or prng (Flax's nn.Dropout, JAX's PRNG; slower steps)",
        choices=DROPOUT_IMPLEMENTATIONS,
        trial=True,
        step=True,
        metavar="IMPL",
    )
    clip_norm: float = setting(
        1.0, "gradient clipping at this global norm (0: none)", low=0.0, trial=True, step=True
    )
    # The paper says Adam; the original code's optimizer skips bias correction (False matches
    # it; the missing correction is a known cause of failed runs on small tasks).
    adam_bias_correction: bool = setting(
        True,
        "Adam bias correction (--no-adam-bias-correction matches the original code's optimizer)",
        trial=True,
        step=True,
    )
    # The paper does not give Adam's epsilon. The original code's 1e-6 damps the steps of the
    # parameters whose gradients are small beside it; with transformers' 1e-8, runs that start
    # from a head pointing against the labels turn it round more often (docs/finetuning.md has
    # the measured figures).
    adam_epsilon: float = setting(
        1e-8,
        "Adam's epsilon, added outside the square root (1e-8: torch's and transformers' "
        "Trainer's; 1e-6: the original code's)",
        low=0.0,
        low_open=True,
        trial=True,
        step=True,
        metavar="EPS",
    )
    optimizer: str = setting(
        "bert",
        "bert: BERT AdamW, the original's warmup rounding (down); adamw-hf: Hugging Face "
        "Trainer's torch AdamW, warmup rounded up, linear decay after the warmup",
        choices=OPTIMIZERS,
        trial=True,
        step=True,
        metavar="NAME",
    )
    # google-research/bert's polynomial_decay measures the decay from step 0, so after a 10%
    # warmup the rate drops to 90% of the stated peak and never runs at it; on short runs that
    # lower area costs accuracy (docs/finetuning.md has the measured figures).
    decay_from: str = setting(
        "warmup-end",
        "where the linear decay to 0 starts: warmup-end (the rate reaches the peak learning "
        "rate, then decays, as transformers' schedule does) or step-0 (google-research/bert's: "
        "after a 0.1 warmup the rate is 0.9 of the peak; optimizer bert only)",
        choices=("warmup-end", "step-0"),
        trial=True,
        metavar="START",
    )
    # Batches are padded to a length bucket (`batches.bucket_lengths`); the padding is masked, so
    # this changes how fast a run is, not what it computes (to float rounding): no trial key.
    pad_to_max_length: bool = setting(
        False,
        "pad every batch to --max-seq-length (one compiled shape) instead of to the shortest "
        "length bucket that holds its longest row",
    )
    # Packing changes which positions a row's tokens take, so with dropout on the masks drawn
    # differ; with dropout off a packed step is the bucketed one (to float rounding): no trial
    # key, and the compiled step is the same function (its batches carry the packing arrays).
    packing: bool = setting(
        True,
        "pack several examples into each sequence (attention kept within each example; "
        "positions restart per example) instead of padding each to its length bucket: fewer "
        "padded positions and compiled shapes, so less time (on by default for that); "
        "--pad-to-max-length turns it off",
    )
    # A split batch's rows draw other dropout masks than the whole batch's, so this shapes the
    # step; with dropout off the update is the whole batch's (to float rounding). 1024: on the
    # 2-core CPU, all-MiniLM-L6-v2's 16 x 128 bucketed step held 0.47 GB less at 512 than at
    # 2048, but packed batches round their sequences up to equal micro-batches, which at 512
    # computed padding: SWAG (160 examples, packed) took 201 CPU-s at 1024 against 236 at 512,
    # RTE 65 against 72, peak memory 0.05 GB higher.
    micro_batch_tokens: int = setting(
        1024,
        "padded positions a training micro-batch holds at most: a batch with more runs as "
        "micro-batches whose gradients add up to the whole batch's, which caps the step's "
        "memory (0: never split)",
        low=0,
        step=True,
        metavar="N",
    )
    # transformers' name. It changes which rows share a batch, so what a run computes.
    group_by_length: bool = setting(
        False,
        "draw training batches of similar length (each mega-batch of 50 shuffled batches sorted "
        "by length, as transformers' LengthGroupedSampler): shorter padded steps, another order",
        trial=True,
    )
    eval_every_epoch: bool = setting(False, "also evaluate on dev after every epoch")
    mesh_shape: tuple[int, int, int] = setting(
        (-1, 1, 1),
        "device mesh (-1: data parallel over every device left)",
        parse=_mesh_shape,
        metavar="DATA,FSDP,TENSOR",
    )
    log_every: int = setting(100, "steps between progress lines", low=1)
    keep_models: str = setting(
        "selected",
        "the fine-tuned model directories kept: selected (finetune: the run's, in DIR/model; "
        "glue: each task's selected trial's), all (glue: every trial's), none",
        choices=KEEP_MODELS,
        metavar="WHICH",
    )

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value, declared = getattr(self, field.name), declaration(field.name)
            if not declared.allows(value):
                verb = "is not" if declared.choices is not None else "must be"
                raise UserError(
                    f"{field.name}={value!r} {verb} {declared.range_text()} "
                    f"(--{flag_name(field.name)})"
                )
        if len(self.mesh_shape) != 3:
            raise UserError(
                f"mesh_shape={self.mesh_shape!r} (--mesh-shape) needs three axes: DATA,FSDP,TENSOR"
            )

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        values["mesh_shape"] = list(self.mesh_shape)
        return values

    def step_settings(self) -> FinetuneSettings:
        """These settings with every one that does not shape the compiled step at its default:
        the key a tuner is cached by, so a sweep's trials (other rates, seeds) share one."""
        return dataclasses.replace(
            self,
            **{
                field.name: field.default
                for field in dataclasses.fields(self)
                if not declaration(field.name).step
            },
        )


def declaration(name: str) -> Declaration:
    """The declaration of the setting `name` (a KeyError for an unknown one)."""
    return DECLARATIONS[name]


def flag_name(name: str) -> str:
    """The command line's spelling of a setting: `learning_rate` -> `learning-rate`."""
    return name.replace("_", "-")


DECLARATIONS: dict[str, Declaration] = {
    field.name: field.metadata["declaration"] for field in dataclasses.fields(FinetuneSettings)
}
DEFAULTS: dict[str, Any] = {
    field.name: field.default for field in dataclasses.fields(FinetuneSettings)
}
# The settings a finished run must share with the settings now to be reused (beside the model,
# and the trial's own learning rate and seed): those that change what it computes.
TRIAL_SETTINGS = tuple(name for name, declared in DECLARATIONS.items() if declared.trial)
# The settings `bert-jax glue` sweeps (a list each, `--learning-rates`, `--seeds`): their lists
# by default.
SWEPT: dict[str, tuple[Any, ...]] = {
    name: declared.swept for name, declared in DECLARATIONS.items() if declared.swept is not None
}


def swept_option(name: str) -> str:
    """A swept setting's sweep option: `learning_rate` -> `learning_rates`."""
    return f"{name}s"


# What a single-run encoder holds once its params went into a run's training state.
_HANDED_OVER = "handed over to the run's training state"


@dataclasses.dataclass(frozen=True)
class PretrainedEncoder:
    """What fine-tuning needs from a model directory: config, the encoder's params (BERT's `bert`
    subtree, ModernBERT's `model`, a fine-tuned model's `bert`: `ModelDir.encoder_params`) and
    tokenizer.

    `single_run`: the encoder was loaded by one run for itself (`load_pretrained(path,
    single_run=True)`: `bert-jax finetune`), which reads `bert_params` once, to place them in its
    training state. Read, the encoder lets go of them, so the run holds one copy of the weights
    (its state's) instead of two for its whole length; a second read is a bug (RuntimeError).
    A sweep's encoder (the default) keeps its params for every trial.

    Loaded from a model directory, the params are read from it when first used (`read_params`,
    which `run_steps` calls while the first step compiles), its stored tree checked at load."""

    config: BertConfig | ModernBertConfig
    params: Any = dataclasses.field(repr=False)  # read as `bert_params`
    tokenizer: Any
    source: str = ""
    single_run: bool = False

    def read_params(self) -> None:
        """Reads the params from the model directory now, if they are still unread there."""
        if isinstance(self.params, _Unread):
            object.__setattr__(self, "params", self.params.model_dir.encoder_params)

    @property
    def bert_params(self) -> Any:
        self.read_params()
        params = self.params
        if self.single_run:
            if params is _HANDED_OVER:
                raise RuntimeError(
                    f"the params of the encoder from {self.source or 'memory'} were {params}: "
                    "a single-run encoder is read once (load it with single_run=False to reuse it)"
                )
            object.__setattr__(self, "params", _HANDED_OVER)  # the state holds the only copy
        return params

    @classmethod
    def from_model_dir(cls, model_dir: Any, single_run: bool = False) -> PretrainedEncoder:
        """From `load_model.load_model_dir(...)`'s ModelDir of either family (its params read
        when first used where the ModelDir left them unread)."""
        encoder = _Unread(model_dir) if model_dir.has_unread_params else model_dir.encoder_params
        return cls(model_dir.config, encoder, model_dir.tokenizer, str(model_dir.path), single_run)


@dataclasses.dataclass(frozen=True)
class _Unread:
    """A `PretrainedEncoder`'s params still in their model directory."""

    model_dir: Any

    def __repr__(self) -> str:
        return f"<unread params of {self.model_dir.path}>"


def load_pretrained(path: str, single_run: bool = False) -> PretrainedEncoder:
    """A model directory or pretraining workdir, through `load_model.load_model_dir` (the loader
    every command uses); the params come to the host when first used (a model directory's; a
    workdir's checkpoint now) and are placed on the mesh per trial (`single_run`: by the one run
    that loads it, see `PretrainedEncoder`)."""
    from bert_jax.training import load_model

    model_dir = load_model.load_model_dir(path, defer_params=True)
    return PretrainedEncoder.from_model_dir(model_dir, single_run)


def task_settings(task: Task, overrides: Mapping[str, Any] | None = None) -> FinetuneSettings:
    """A run's settings: the task's recipe (`Task.defaults`) over the paper's GLUE defaults above,
    then the overrides that are not None."""
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    values = {**task.defaults, **given}
    if "mesh_shape" in values:
        values["mesh_shape"] = tuple(int(x) for x in values["mesh_shape"])
    return FinetuneSettings(**values)
