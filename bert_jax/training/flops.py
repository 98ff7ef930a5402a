"""FLOPs per trained token, and what a window of steps does with them: tokens, sequences and
model FLOP/s per second, and MFU against the chips' peak (the hardware table, runtime/hardware.py).

FLOPs per trained token (forward + backward = 3x forward, 2 FLOPs per multiply-add):

    F = 6 * L * (4 d^2 + 2 d f)  +  12 * L * s * d  +  6 * m * (d^2 + d V)

with L layers, hidden d, feed-forward f (4d in BERT, which gives the usual 72 L d^2), sequence
length s, vocabulary V and m the share of positions that reach the MLM head (predictions / s when
masked positions are gathered). MFU = real (non-pad) tokens/s x F / peak FLOP/s of the chips.
"""

from __future__ import annotations

import time

from bert_jax.core.model import BertConfig
from bert_jax.runtime import hardware


def peak_flops_per_chip(device_kind: str) -> float | None:
    """Peak bf16 FLOP/s of one chip, or None when unknown (e.g. CPU: no MFU is reported); from
    the hardware table (`runtime/hardware.py`), by exact device kind."""
    return hardware.peak_flops(device_kind)


def head_share(config: BertConfig, seq_len: int, predictions: int) -> float:
    """The share of positions that reach the MLM head: every one for the left-to-right
    objective (each predicts the next token), else the masked-LM slots."""
    return 1.0 if config.objective == "ltr" else predictions / seq_len


def flops_per_token(
    config: BertConfig, seq_len: int, mlm_fraction: float, last_layer_fraction: float = 1.0
) -> float:
    """Training FLOPs per token (model FLOPs: no recomputation counted).

    `last_layer_fraction` < 1 counts what a sparse last layer computes (`sparse_last_layer`):
    keys and values at every position, the rest of the layer at that share of positions only.
    """
    d, f, n_layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    dense = 6 * n_layers * (4 * d * d + 2 * d * f)
    attention = 12 * n_layers * seq_len * d
    head = 6 * mlm_fraction * (d * d + d * config.vocab_size)
    # Skipped in the last layer: queries, attention output, FFN, and the attention itself.
    skipped = (1.0 - last_layer_fraction) * (6 * (2 * d * d + 2 * d * f) + 12 * seq_len * d)
    return float(dense + attention + head - skipped)


class Throughput:
    """Tokens and sequences per second over a window of steps, and MFU when the chip is known."""

    def __init__(self, config: BertConfig, num_chips: int, device_kind: str):
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
