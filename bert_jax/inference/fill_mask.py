"""Masked-token prediction (`bert-jax fill-mask`): the most likely tokens for each [MASK] in text.

The Python entry point is `fill_mask(model, texts, top_k=5)`:

    from bert_jax.inference.fill_mask import fill_mask

    for result in fill_mask("runs/tiny/model", ["The capital of France is [MASK]."]):
        for mask in result.masks:
            print([(c.token_str, round(c.score, 3)) for c in mask.candidates])

`model` is MODEL as every command takes it (a model directory, or a pretraining workdir: its
exported model, else its latest checkpoint) or a `ModelDir` already loaded with its params. Each
text becomes `[CLS] text [SEP]` with the model's own tokenizer, the special tokens written in the
text ("[MASK]", "[SEP]", ...) read as the exported Hugging Face tokenizer reads them; the masked-LM
head scores every [MASK] from one forward pass (each independently, as transformers'
`pipeline("fill-mask")` does), and a candidate's `score` is its softmax probability over the
model's vocabulary, computed in float32. A candidate's `token_str` is the token decoded as text
("the"), as the pipeline's `token_str`; `token` keeps the vocabulary entry ("▁the", "##ing"). The
command prints `token_str`. The same model exported with `bert-jax convert --to hf`
gives the same token ids, in the same order, with the same probabilities in transformers
(tests/test_fill_mask.py).

A ModernBERT model fills masks the same way, with its own tokenizer's [CLS], [SEP] and [MASK]
(its tokenizer.json may strip the space before a [MASK], as ModernBERT's does) and its tied
masked-LM head; `convert --to hf` of it gives the same ids and probabilities in transformers.

A text without [MASK], a text longer than the model's positions, a model without its masked-LM
head (an encoder-only export) and a left-to-right model (its head predicts the next token) are
refused in one line.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from bert_jax.runtime import declarations, fs
from bert_jax.runtime.declarations import setting
from bert_jax.runtime.errors import UserError, user_path

if TYPE_CHECKING:  # the command's parser reads this module's defaults without importing JAX
    import numpy as np

    from bert_jax.core.model import BertConfig
    from bert_jax.core.modernbert_config import ModernBertConfig

STDIN = "-"  # --input - reads the texts from standard input
# Rows are padded to a multiple of this many tokens, and the [MASK] positions of a batch to a
# multiple of _MASKS_MULTIPLE: a few compiled shapes serve inputs of any length.
_LENGTH_MULTIPLE = 8
_MASKS_MULTIPLE = 4


@dataclasses.dataclass(frozen=True)
class FillMaskSettings:
    """How `fill-mask` predicts, each setting declared once: its flags, their help and the checks
    (a bad value refused in one line naming its flag) derive from these declarations, and
    `fill_mask()` takes its defaults from them."""

    top_k: int = setting(5, "candidates per [MASK]", low=1)
    batch_size: int = setting(32, "texts per forward pass", low=1)

    def __post_init__(self):
        for problem in declarations.problems(self):
            raise UserError(problem)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One prediction for a [MASK]: a vocabulary entry, the text it decodes to, its probability."""

    token_id: int
    token: str  # the vocabulary entry ("paris", "##ing", "▁paris")
    token_str: str  # the entry decoded, as transformers' fill-mask pipeline shows it ("paris")
    score: float  # softmax probability over the model's vocabulary


@dataclasses.dataclass(frozen=True)
class MaskPrediction:
    """The candidates for one [MASK], most likely first."""

    position: int  # in the model's input, [CLS] at 0
    candidates: tuple[Candidate, ...]


@dataclasses.dataclass(frozen=True)
class FilledText:
    """A text and the candidates for each of its [MASK]s, in order."""

    text: str
    masks: tuple[MaskPrediction, ...]

    def to_json(self) -> dict[str, Any]:
        """What `--json` prints for the text: one JSON object per line of input."""
        return {
            "text": self.text,
            "masks": [
                {
                    "position": mask.position,
                    "predictions": [dataclasses.asdict(c) for c in mask.candidates],
                }
                for mask in self.masks
            ],
        }


def fill_mask(
    model: Any,
    texts: Sequence[str],
    settings: FillMaskSettings | None = None,
    *,
    names: Sequence[str] | None = None,
    **options: Any,
) -> list[FilledText]:
    """The `top_k` candidates for every [MASK] of every text (see the module's doc).

    `settings` (default: the declared defaults), with `options` (`top_k=3`, `batch_size=8`: its
    fields) replacing some of them. `names` say where each text came from in a refusal
    ("notes.txt line 3"; default "text 1", "text 2", ...).
    """
    from bert_jax.runtime import topology
    from bert_jax.training.load_model import load_model_dir

    topology.quiet_library_runtime()  # before JAX starts its backends: no libtpu noise
    settings = dataclasses.replace(settings or FillMaskSettings(), **options)
    names = list(names) if names is not None else [f"text {i + 1}" for i in range(len(texts))]
    if isinstance(model, (str, os.PathLike)):
        # The checks first, from the config and the tokenizer alone: a refusal reads no weights.
        source = os.fspath(model)
        described = load_model_dir(source, load_params=False)
        check_model(described.config, described.has_heads, source)
        rows = encode_texts(described.tokenizer, texts, names, described.config)
        if not rows:
            return []
        loaded = dataclasses.replace(load_model_dir(source), _tokenizer=described.tokenizer)
    else:
        loaded, source = model, model.path
        if loaded.params is None:
            raise ValueError(f"{source} was loaded without params")
        check_model(loaded.config, loaded.has_heads, source)
        rows = encode_texts(loaded.tokenizer, texts, names, loaded.config)
        if not rows:
            return []
    top_k = min(settings.top_k, loaded.config.vocab_size)
    return _predict(loaded, texts, rows, top_k, settings.batch_size)


def check_model(config: BertConfig | ModernBertConfig, has_heads: bool, where: str) -> None:
    """Refuses a model whose head cannot fill a [MASK], naming it and why."""
    if not has_heads:
        raise UserError(
            f"{where} has no masked-LM head (an encoder-only model, as converted from a "
            "sentence-transformers checkpoint or with --drop-heads): fill-mask needs a model "
            "with its pretraining heads"
        )
    if config.is_decoder:
        raise UserError(
            f"{where} is a left-to-right model (objective 'ltr'): its head predicts the next "
            "token, not a [MASK]"
        )


def encode_texts(
    tokenizer: Any,
    texts: Sequence[str],
    names: Sequence[str],
    config: BertConfig | ModernBertConfig,
) -> list[list[int]]:
    """`[CLS] text [SEP]` ids for each text; a text without [MASK] or longer than the model's
    positions is refused, named by `names`."""
    rows = []
    for text, name in zip(texts, names, strict=True):
        ids = [tokenizer.cls_id, *tokenizer.encode(text, allow_special=True), tokenizer.sep_id]
        if tokenizer.mask_id not in ids:
            raise UserError(f"{name} has no [MASK] to fill: {_shortened(text)!r}")
        if len(ids) > config.max_position_embeddings:
            raise UserError(
                f"{name} is {len(ids)} tokens with [CLS] and [SEP], more than the model's "
                f"{config.max_position_embeddings} positions (max_position_embeddings); "
                "shorten it"
            )
        rows.append(ids)
    return rows


def _shortened(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


@functools.cache
def _top_candidates():
    """The jitted step: the top-k probabilities and ids at the [MASK] positions."""
    import jax
    import jax.numpy as jnp

    from bert_jax.core.trainer import pretraining_model

    @functools.partial(jax.jit, static_argnames=("config", "top_k"))
    def top_candidates(params, input_ids, input_mask, masked_lm_positions, *, config, top_k):
        # The family's pretraining model: BERT's MLM and NSP heads, or ModernBERT's MLM head.
        outputs = pretraining_model(config).apply(
            {"params": params},
            input_ids,
            input_mask,
            jnp.zeros_like(input_ids),
            masked_lm_positions,
            deterministic=True,
        )
        probabilities = jax.nn.softmax(outputs["mlm_logits"].astype(jnp.float32), axis=-1)
        return jax.lax.top_k(probabilities, top_k)

    return top_candidates


def _predict(loaded, texts, rows, top_k: int, batch_size: int) -> list[FilledText]:
    import jax
    import numpy as np

    from bert_jax.core.model import BertConfig

    # Float32 compute, whatever the model trained in: scores to compare, not speed (dropout is
    # off in the deterministic forward; BERT's rates are zeroed too, as its other readers do).
    config = loaded.config.replace(dtype="float32")
    if isinstance(config, BertConfig):
        config = config.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    tokenizer = loaded.tokenizer
    device = jax.devices()[0]
    params = jax.device_put(loaded.params, device)
    batch_size = min(batch_size, len(rows))  # a few texts: no rows of padding to compute
    results = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        positions = [[i for i, t in enumerate(ids) if t == tokenizer.mask_id] for ids in chunk]
        length = _round_up(max(len(ids) for ids in chunk), _LENGTH_MULTIPLE)
        length = min(length, config.max_position_embeddings)
        masks = _round_up(max(len(p) for p in positions), _MASKS_MULTIPLE)
        input_ids = np.zeros((batch_size, length), np.int32)
        input_mask = np.zeros((batch_size, length), np.int32)
        input_mask[:, 0] = 1  # padding rows get one visible token: no fully masked attention row
        masked_lm_positions = np.zeros((batch_size, masks), np.int32)
        for row, (ids, where) in enumerate(zip(chunk, positions)):
            input_ids[row, : len(ids)] = ids
            input_mask[row, : len(ids)] = 1
            masked_lm_positions[row, : len(where)] = where
        scores, ids = _top_candidates()(
            params,
            jax.device_put(input_ids, device),
            jax.device_put(input_mask, device),
            jax.device_put(masked_lm_positions, device),
            config=config,
            top_k=top_k,
        )
        scores, ids = np.asarray(scores), np.asarray(ids)
        for row, where in enumerate(positions):
            predictions = []
            for slot, position in enumerate(where):
                tokens = _tokens(tokenizer, ids[row, slot])
                candidates = tuple(
                    Candidate(int(i), token, _decoded(tokenizer, int(i), token), float(s))
                    for i, token, s in zip(ids[row, slot], tokens, scores[row, slot])
                )
                predictions.append(MaskPrediction(position, candidates))
            results.append(FilledText(texts[start + row], tuple(predictions)))
    return results


def _tokens(tokenizer: Any, ids: np.ndarray) -> list[str]:
    """Vocabulary entries; a model with more rows than its tokenizer has entries (a vocabulary
    padded by hand) can score an id past the tokenizer, shown as "<id N>"."""
    tokens = tokenizer.convert_ids_to_tokens(ids)
    return [t if i < tokenizer.vocab_size else f"<id {i}>" for i, t in zip(ids.tolist(), tokens)]


def _decoded(tokenizer: Any, token_id: int, token: str) -> str:
    """The token as text, as transformers' fill-mask pipeline gives its `token_str`
    (`tokenizer.decode([id])`: "▁the" is "the"); an id past the tokenizer as `_tokens` shows it."""
    return tokenizer.decode([token_id]) if token_id < tokenizer.vocab_size else token


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def read_texts(path: str) -> tuple[list[str], list[str]]:
    """The non-blank lines of `path` (standard input for "-") and their names ("FILE line N")."""
    if path == STDIN:
        lines = sys.stdin.read().splitlines()
    else:
        with user_path(path, "--input"), fs.open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    where = "standard input" if path == STDIN else path
    if not numbered:
        raise UserError(f"--input {where} holds no text (one text with [MASK] a line)")
    return [line for _, line in numbered], [f"{where} line {n}" for n, _ in numbered]


def format_text(result: FilledText) -> str:
    """A text and its candidates for people: a line per [MASK], percentages."""
    lines = [result.text]
    several = len(result.masks) > 1
    for number, mask in enumerate(result.masks, 1):
        label = f"[MASK] {number}" if several else "[MASK]"
        shown = "  ".join(f"{c.token_str} {100 * c.score:.3g}%" for c in mask.candidates)
        lines.append(f"  {label}: {shown}")
    return "\n".join(lines)
