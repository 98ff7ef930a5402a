"""FLOPs per trained token, and what a window of steps does with them: tokens, sequences and
model FLOP/s per second, and MFU against the chips' peak (the hardware table, runtime/hardware.py).

FLOPs per trained token (forward + backward = 3x forward, 2 FLOPs per multiply-add):

    F = 6 * L * (4 d^2 + 2 d f)  +  12 * L * s * d  +  6 * m * (d^2 + d V)

with L layers, hidden d, feed-forward f (4d in BERT, which gives the usual 72 L d^2), sequence
length s, vocabulary V and m the share of positions that reach the MLM head (predictions / s when
masked positions are gathered). MFU = real (non-pad) tokens/s x F / peak FLOP/s of the chips.

ModernBERT (Warner et al., 2024) differs in two terms. Its GeGLU has three d x f matrices (Wi
makes the input and its gate, Wo reads them back): 6 * L * (4 d^2 + 3 d f). Its attention term
counts the keys each query attends: s in a global layer; in a sliding-window layer those within
`local_attention / 2` positions, averaged over the row (fewer at the edges), so
12 * d * sum over layers of keys per query. The window is counted, not the s x s scores the XLA
path computes under a mask: model FLOPs are the architecture's work, as recomputation is not
counted either.
"""

from __future__ import annotations

import time

from bert_jax.core.model import BertConfig
from bert_jax.core.modernbert_config import SLIDING, ModernBertConfig
from bert_jax.runtime import hardware


def peak_flops_per_chip(device_kind: str) -> float | None:
    """Peak bf16 FLOP/s of one chip, or None when unknown (e.g. CPU: no MFU is reported); from
    the hardware table (`runtime/hardware.py`), by exact device kind."""
    return hardware.peak_flops(device_kind)


def head_share(config: BertConfig | ModernBertConfig, seq_len: int, predictions: int) -> float:
    """The share of positions that reach the MLM head: every one for the left-to-right
    objective (each predicts the next token), else the masked-LM slots."""
    return 1.0 if config.objective == "ltr" else predictions / seq_len


def window_keys(seq_len: int, window: int) -> float:
    """Keys per query, averaged over a row of `seq_len`, when a query sees the positions
    `window // 2` away or fewer (ModernBERT's sliding window): s + 2 * sum_i min(i, h), over s."""
    half = window // 2
    if seq_len - 1 <= half:
        below = seq_len * (seq_len - 1) / 2
    else:
        below = half * (half + 1) / 2 + (seq_len - 1 - half) * half
    return (seq_len + 2 * below) / seq_len


def attended_keys(config: BertConfig | ModernBertConfig, seq_len: int) -> float:
    """Keys per query summed over the layers: every position in each BERT or global layer,
    the window's in a ModernBERT sliding-window layer (window_keys)."""
    if not isinstance(config, ModernBertConfig):
        return float(config.num_hidden_layers * seq_len)
    local = window_keys(seq_len, config.local_attention)
    return float(sum(local if kind == SLIDING else seq_len for kind in config.layer_types))


def flops_per_token(
    config: BertConfig | ModernBertConfig,
    seq_len: int,
    mlm_fraction: float,
    last_layer_fraction: float = 1.0,
) -> float:
    """Training FLOPs per token (model FLOPs: no recomputation counted), of either family.

    `last_layer_fraction` < 1 counts what a sparse last layer computes (`sparse_last_layer`):
    keys and values at every position, the rest of the layer at that share of positions only.
    """
    d, f, n_layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    ffn_matrices = 3 if isinstance(config, ModernBertConfig) else 2  # GeGLU's Wi is two wide
    dense = 6 * n_layers * (4 * d * d + ffn_matrices * d * f)
    attention = 12 * attended_keys(config, seq_len) * d
    head = 6 * mlm_fraction * (d * d + d * config.vocab_size)
    # Skipped in the last layer: queries, attention output, FFN, and the attention itself.
    skipped = (1.0 - last_layer_fraction) * (6 * (2 * d * d + 2 * d * f) + 12 * seq_len * d)
    return float(dense + attention + head - skipped)


class Throughput:
    """Tokens and sequences per second over a window of steps, and MFU when the chip is known."""

    def __init__(self, config: BertConfig | ModernBertConfig, num_chips: int, device_kind: str):
        self.config = config
        self.num_chips = num_chips
        self.peak = peak_flops_per_chip(device_kind)
        self.reset()

    def reset(self) -> None:
        self._start = time.perf_counter()
        self._real_tokens = 0
        self._padded_tokens = 0
        self._sequences = 0
        self._flops = 0.0

    def add(self, real_tokens: int, batch_size: int, seq_len: int, predictions: int) -> None:
        self._real_tokens += real_tokens
        self._padded_tokens += batch_size * seq_len
        self._sequences += batch_size
        share = head_share(self.config, seq_len, predictions)
        self._flops += real_tokens * flops_per_token(self.config, seq_len, share)

    def summary(self) -> dict[str, float]:
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        out = {
            "tokens_per_sec": self._real_tokens / elapsed,
            "padded_tokens_per_sec": self._padded_tokens / elapsed,
            "sequences_per_sec": self._sequences / elapsed,
            "model_tflops_per_sec": self._flops / elapsed / 1e12,
        }
        if self.peak:
            out["mfu"] = self._flops / elapsed / (self.peak * self.num_chips)
        return out
