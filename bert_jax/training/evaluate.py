"""`bert-jax eval`: a model directory (or pretraining workdir) on held-out prepared records.

Reports what the pretraining eval does (training/metrics.evaluate): MLM accuracy next to the
always-the-most-frequent-token baseline, MLM perplexity = exp(mean masked-token loss) (the
paper's Table 6 "LM (ppl)"; for the left-to-right objective, of the mean next-token loss), and
NSP accuracy where the model's objective has NSP. The records' own (static) masking is used, so
a result is reproducible; records prepared for another objective are refused.
"""

from __future__ import annotations

import os
from typing import Any

from bert_jax.runtime import fs
from bert_jax.runtime.errors import UserError


def _record_shapes(data: str, prepare_config: dict | None) -> tuple[int, int]:
    """(max_seq_length, max_predictions_per_seq) of the records: recorded, else the first one."""
    if prepare_config is not None:
        return int(prepare_config["max_seq_length"]), int(prepare_config["max_predictions_per_seq"])
    from bert_jax.data import integrity, records

    tf = records.import_tensorflow()
    path, serialized = integrity.first_record(records.list_record_files([data]), False)
    if serialized is None:
        raise UserError(f"--data {data} holds no records")
    feature = tf.train.Example.FromString(serialized).features.feature
    return (
        len(feature["input_ids"].int64_list.value),
        len(feature["masked_lm_positions"].int64_list.value),
    )


def evaluate_model(
    model: str | os.PathLike, data: str | os.PathLike, *, batch_size: int = 32, batches: int = 0
) -> dict[str, Any]:
    """Held-out metrics of `model` on the records in `data` (`batches` > 0: at most that many
    full batches of `batch_size`; 0: every full batch)."""
    import jax

    from bert_jax.core import train
    from bert_jax.core.model import BertForPreTraining
    from bert_jax.data import layout, objectives, pipeline
    from bert_jax.training import metrics, model_dir

    model, data = os.fspath(model), os.fspath(data)
    if batch_size < 1 or batches < 0:
        raise UserError(f"--batch-size {batch_size} must be >= 1 and --batches {batches} >= 0")
    if not fs.exists(data):
        raise UserError(f"--data {data} does not exist")
    loaded = model_dir.load_model_dir(model)
    if not loaded.has_heads:
        raise UserError(f"--model {model} has no pretraining heads (an encoder-only model)")
    config = loaded.config
    prepare_config = layout.read_prepare_config(data) if fs.isdir(data) else None
    objectives.check_records(
        f"--data {data}", prepare_config, config.objective, f"--model {model}'s objective"
    )
    length, slots = _record_shapes(data, prepare_config)
    if length > config.max_position_embeddings:
        raise UserError(
            f"--data {data} holds records of {length} tokens; the model reads at most "
            f"{config.max_position_embeddings}"
        )
    settings = pipeline.PipelineSettings(
        batch_size=batch_size,
        max_seq_length=length,
        max_predictions_per_seq=slots,
        shuffle=False,
        num_epochs=1,
        objective=config.objective,
    )
    iterator = pipeline.make_pretrain_iterator(data, settings)
    held_out = []
    for batch in iterator:
        held_out.append(batch)
        if batches and len(held_out) >= batches:
            break
    if not held_out:
        raise UserError(f"--data {data} has fewer records than one batch of {batch_size}")
    module = BertForPreTraining(config)
    step = jax.jit(lambda params, batch: train.eval_step(params, batch, model=module))
    result = metrics.evaluate(
        lambda local: step(loaded.params, local), held_out, config.vocab_size, config.objective
    )
    result["objective"] = config.objective
    result["batches"] = len(held_out)
    return result


def summary_lines(result: dict[str, Any]) -> list[str]:
    """What `bert-jax eval` prints: one metric per line."""
    lines = [
        f"objective: {result['objective']}",
        f"examples: {result['examples']} ({result['batches']} batches)",
        f"mlm_accuracy: {result['mlm_accuracy']:.4f} (most frequent token "
        f"{result['mlm_baseline_accuracy']:.4f})",
        f"mlm_loss: {result['mlm_loss']:.4f}",
        f"mlm_perplexity: {result['mlm_perplexity']:.4f}",
    ]
    if "nsp_accuracy" in result:
        lines.append(f"nsp_accuracy: {result['nsp_accuracy']:.4f}")
    return lines
