"""The peer of `bert-jax bench --peer hf-torch`: Hugging Face's PyTorch BertForPreTraining (or
ModernBertForMaskedLM for a ModernBERT spec), trained.

This file is the peer's process; `peer.PeerRunner` drives it over pipes with the same JSON-line
protocol as the Flax peer (`peer.py`'s docstring). It runs in this project's own environment
(torch and transformers are dev dependencies; on a GPU machine, the image's CUDA torch):

    python -m bert_jax.bench.peer_torch --spec SPEC.json --batches BATCHES.npz \
        --mode {eager,compiled} [--weights WEIGHTS.npz]

The step a PyTorch user who reads NVIDIA's BERT recipe writes, built from the spec's model size:
`transformers.BertForPreTraining` with `attn_implementation="sdpa"` in train mode (dropout as
configured); its encoder, then the MLM head on the gathered `masked_lm_positions` (as ours,
weighted by `masked_lm_weights`) and the NSP head on the pooled [CLS]; `torch.optim.AdamW`
(fused where torch has it) with decoupled weight decay on weights and embeddings only (no decay
on LayerNorm and biases), the global gradient norm clipped to `clip_norm`, and our warmup +
linear decay as a LambdaLR. A ModernBERT spec trains `transformers.ModernBertForMaskedLM` (SDPA)
the same way, its head and tied decoder at the gathered positions, masked LM alone.
`--mode compiled` puts the loss (forward and, through AOTAutograd,
backward) under `torch.compile`; the first step compiles, and its time is reported as the
compile time. Compute is float32, with bf16 autocast when ours computes in bfloat16 (`config.
model.dtype`). `--weights` holds our initial parameters as a Hugging Face state dict, so both
sides start from the same point and their first-step losses compare.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

from bert_jax.bench.peer import emit, load_batches, serve_windows

MODES = ("eager", "compiled")


def decays(name: str, parameter: Any) -> bool:
    """Weight decay on matrices (dense weights, embeddings); none on LayerNorm and biases: the
    parameters `optim.decay_mask` decays."""
    return parameter.ndim >= 2 and "LayerNorm" not in name


def torch_batch(batch: dict[str, np.ndarray], device: Any) -> dict[str, Any]:
    """Our batch as torch tensors (int64 ids: what embedding and gather take)."""
    import torch

    def ids(key: str) -> Any:
        return torch.from_numpy(np.asarray(batch[key], np.int64)).to(device)

    return {
        "input_ids": ids("input_ids"),
        "attention_mask": ids("input_mask"),
        "token_type_ids": ids("segment_ids"),
        "masked_lm_positions": ids("masked_lm_positions"),
        "masked_lm_ids": ids("masked_lm_ids"),
        "masked_lm_weights": torch.from_numpy(np.asarray(batch["masked_lm_weights"], np.float32))
        .to(device),
        "next_sentence_labels": ids("next_sentence_labels").reshape(-1),
    }  # fmt: skip


def build_model(spec: Any, weights: dict[str, np.ndarray] | None) -> Any:
    """BertForPreTraining, or ModernBertForMaskedLM for a ModernBERT spec, of the spec's size
    (SDPA attention), with `weights` if given."""
    import torch
    import transformers

    from bert_jax.bench.spec import is_modernbert
    from bert_jax.convert import hf, hf_modernbert

    modern = is_modernbert(spec)
    values = (hf_modernbert if modern else hf).hf_config_from(spec.model)
    values.pop("architectures", None)
    torch.manual_seed(spec.seed)
    if modern:
        config = transformers.ModernBertConfig(**values, attn_implementation="sdpa")
        model = transformers.ModernBertForMaskedLM(config)
    else:
        config = transformers.BertConfig(**values, attn_implementation="sdpa")
        model = transformers.BertForPreTraining(config)
    if weights is not None:
        state = {name: torch.from_numpy(value) for name, value in weights.items()}
        missing, unexpected = model.load_state_dict(state, strict=False)
        # The decoder is tied to the word (token) embeddings; BERT's bias to
        # cls.predictions.bias.
        tied = "decoder.weight" if modern else "cls.predictions.decoder"
        missing = [k for k in missing if not k.startswith(tied)]
        missing = [k for k in missing if not k.endswith(("position_ids", "token_type_ids"))]
        if missing or unexpected:
            raise RuntimeError(f"weights do not fit: missing {missing}, unexpected {unexpected}")
        model.tie_weights()
    return model


def weighted_mlm_loss(mlm_logits: Any, masked_lm_ids: Any, masked_lm_weights: Any) -> Any:
    """Cross-entropy at the gathered slots, averaged over masked_lm_weights (as ours)."""
    import torch.nn.functional as F

    token_nll = F.cross_entropy(
        mlm_logits.float().flatten(0, 1), masked_lm_ids.flatten(), reduction="none"
    )
    weights = masked_lm_weights.flatten()
    return (token_nll * weights).sum() / weights.sum().clamp_min(1e-5)


def gather_positions(sequence: Any, positions: Any) -> Any:
    import torch

    index = positions.unsqueeze(-1).expand(-1, -1, sequence.shape[-1])
    return torch.gather(sequence, 1, index)


def masked_lm_loss_module(model: Any) -> Any:
    """ModernBertForMaskedLM's loss as ours computes it: the encoder over every position, the
    head and tied decoder at the gathered masked positions, the weighted mean (no NSP)."""
    import torch

    class MaskedLMLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(
            self,
            input_ids,
            attention_mask,
            masked_lm_positions,
            masked_lm_ids,
            masked_lm_weights,
            **_unused,  # token_type_ids, next_sentence_labels: ModernBERT has neither
        ):
            sequence = self.model.model(
                input_ids=input_ids, attention_mask=attention_mask
            ).last_hidden_state
            gathered = gather_positions(sequence, masked_lm_positions)
            logits = self.model.decoder(self.model.head(gathered))
            return weighted_mlm_loss(logits, masked_lm_ids, masked_lm_weights)

    return MaskedLMLoss()


def pretraining_loss_module(model: Any) -> Any:
    """MLM loss on the gathered masked positions (weighted mean) plus NSP loss (mean)."""
    import torch
    import torch.nn.functional as F

    class PretrainingLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(
            self,
            input_ids,
            attention_mask,
            token_type_ids,
            masked_lm_positions,
            masked_lm_ids,
            masked_lm_weights,
            next_sentence_labels,
        ):
            out = self.model.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            )
            gathered = gather_positions(out.last_hidden_state, masked_lm_positions)
            mlm_logits = self.model.cls.predictions(gathered)
            nsp_logits = self.model.cls.seq_relationship(out.pooler_output).float()
            mlm = weighted_mlm_loss(mlm_logits, masked_lm_ids, masked_lm_weights)
            nsp = F.cross_entropy(nsp_logits, next_sentence_labels)
            return mlm + nsp

    return PretrainingLoss()


def optimizer_and_schedule(model: Any, opt: Any) -> tuple[Any, Any]:
    """torch AdamW with our settings, our warmup + linear decay as a LambdaLR."""
    import torch

    if not opt.bias_correction:
        raise ValueError("torch's AdamW always corrects the moments' bias")
    named = list(model.named_parameters())  # tied parameters appear once
    groups = [
        {"params": [p for n, p in named if decays(n, p)], "weight_decay": opt.weight_decay},
        {"params": [p for n, p in named if not decays(n, p)], "weight_decay": 0.0},
    ]
    kwargs = dict(lr=opt.learning_rate, betas=(opt.b1, opt.b2), eps=opt.eps)
    try:
        optimizer = torch.optim.AdamW(groups, fused=True, **kwargs)
    except (RuntimeError, TypeError):  # a torch or device without the fused kernel
        optimizer = torch.optim.AdamW(groups, **kwargs)
    total = max(opt.total_steps, 1)

    def factor(step: int) -> float:  # optim.warmup_decay over the peak rate
        if opt.warmup_steps > 0 and step < opt.warmup_steps:
            return step / opt.warmup_steps
        return 1.0 - min(step / total, 1.0)

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--batches", required=True)
    parser.add_argument("--mode", choices=MODES, default="eager")
    parser.add_argument("--weights", default=None)
    args = parser.parse_args(argv)

    try:
        import torch
        import transformers
    except ImportError as err:
        emit(event="error", message=f"the hf-torch peer needs torch and transformers: {err}")
        return 2

    from bert_jax.bench.data import batch_counts
    from bert_jax.bench.spec import spec_from_json
    from bert_jax.core.modernbert_config import ModernBertConfig

    with open(args.spec, encoding="utf-8") as f:
        spec = spec_from_json(json.load(f))
    weights = None
    if args.weights:
        with np.load(args.weights) as archive:
            weights = {name: archive[name] for name in archive.files}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        # float32 matmuls on TensorFloat-32, as JAX's default precision runs them on a GPU.
        torch.set_float32_matmul_precision("high")
    model = build_model(spec, weights).to(device)
    model.train()  # dropout on, at the configured rates
    modern = isinstance(spec.model, ModernBertConfig)
    loss_module = (masked_lm_loss_module if modern else pretraining_loss_module)(model)
    if args.mode == "compiled":
        loss_module = torch.compile(loss_module, dynamic=False)
    optimizer, scheduler = optimizer_and_schedule(model, spec.optimizer)
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    autocast = torch.autocast(
        device.type, dtype=torch.bfloat16, enabled=spec.model.dtype == "bfloat16"
    )
    host_batches = load_batches(args.batches)
    counts = [batch_counts(b) for b in host_batches]
    batches = [torch_batch(b, device) for b in host_batches]
    taken = 0

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def step() -> Any:
        nonlocal taken
        batch = batches[taken % len(batches)]
        taken += 1
        with autocast:
            loss = loss_module(**batch)
        loss.backward()
        if spec.optimizer.clip_norm:
            torch.nn.utils.clip_grad_norm_(parameters, spec.optimizer.clip_norm, foreach=True)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def run(steps: int) -> tuple[int, int, int, Any]:
        real = padded = instances = 0
        loss = None
        for _ in range(steps):
            r, p, n = counts[taken % len(batches)]
            loss = step()
            real, padded, instances = real + r, padded + p, instances + n
        return real, padded, instances, loss

    start = time.perf_counter()
    _, _, _, first_loss = run(1)  # torch.compile compiles here
    sync()
    compile_seconds = time.perf_counter() - start
    run(max(spec.warmup_steps, 1) - 1)
    sync()
    _emit_ready(compile_seconds, float(first_loss), device, transformers.__version__, torch)

    def wait(loss: Any) -> None:
        float(loss)  # waits for the last step, as a device sync
        sync()

    def peak_memory_bytes() -> int | None:
        return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None

    serve_windows(run, wait, peak_memory_bytes)
    return 0


def _emit_ready(
    compile_seconds: float, first_loss: float, device: Any, version: str, torch: Any
) -> None:
    kind = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    emit(
        event="ready",
        compile_seconds=compile_seconds,
        warmup_loss=first_loss,
        device_kind=kind,
        transformers=version,
        torch=torch.__version__,
    )


if __name__ == "__main__":
    sys.exit(main())
