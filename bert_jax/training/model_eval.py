"""`bert-jax eval`: a model directory (or pretraining workdir) on held-out prepared records.

Reports what the pretraining eval does (training/heldout_eval.py): MLM accuracy next to the
always-the-most-frequent-token baseline, MLM perplexity = exp(mean masked-token loss) (the
paper's Table 6 "LM (ppl)"; for the left-to-right objective, of the mean next-token loss), and
NSP accuracy where the model's objective has NSP, beside its majority baseline and whether the
model predicts one class. The records' own (static) masking is used, so
a result is reproducible; every record counts once (the last batch is filled with rows of zero
weight). Records prepared for another objective or with another tokenizer than the model's, and
token ids beyond the model's vocabulary, are refused in one line.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from bert_jax.runtime import declarations, fs
from bert_jax.runtime.declarations import setting
from bert_jax.runtime.errors import UserError


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """How much `bert-jax eval` reads at a time and in all, each setting declared once: its flags,
    their help and the checks (one line naming the flag) derive from these declarations, and
    `evaluate_model` takes its defaults from them. No JAX here: `--help` reads them."""

    batch_size: int = setting(32, "records per batch", low=1)
    batches: int = setting(
        0,
        "at most this many batches",
        low=0,
        zero="0: every record; the last batch is filled with rows that count nothing",
    )

    def __post_init__(self):
        for problem in declarations.problems(self):
            raise UserError(problem)


def _record_shapes(data: str, prepare_config: dict | None) -> tuple[int, int]:
    """(max_seq_length, max_predictions_per_seq) of the records: recorded, else the first one."""
    if prepare_config is not None:
        return int(prepare_config["max_seq_length"]), int(prepare_config["max_predictions_per_seq"])
    from bert_jax.data.records import integrity
    from bert_jax.data.records import tfrecord as records

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
    model: str | os.PathLike,
    data: str | os.PathLike,
    settings: EvalSettings | None = None,
    *,
    console: Callable[[str], None] = lambda line: None,
    **options: Any,
) -> dict[str, Any]:
    """Held-out metrics of `model` on the records in `data` (`settings.batches` > 0: at most that
    many batches of `settings.batch_size`; 0: every record, the last batch filled with rows of
    zero weight). `options` (`batch_size=64`: `EvalSettings`' fields) replace some of
    `settings` (default: the declared defaults). `console` gets progress lines (records, rate,
    ETA) while it runs."""
    import jax

    from bert_jax.core import trainer
    from bert_jax.data import layout, objectives
    from bert_jax.data.sources.kinds import source_kind
    from bert_jax.data.tokenizers.load_or_train import check_prepared_with
    from bert_jax.training import heldout_eval, load_model

    settings = dataclasses.replace(settings or EvalSettings(), **options)
    batch_size, batches = settings.batch_size, settings.batches
    model, data = os.fspath(model), os.fspath(data)
    if source_kind(data) in ("embedded", "tfds"):
        raise UserError(
            f"--data {data} is a corpus, not prepared records: prepare it first with the model's "
            f"tokenizer (`bert-jax data prepare --input {data} --tokenizer MODEL/tokenizer "
            "--output DIR`), then pass --data DIR"
        )
    if not fs.exists(data):
        raise UserError(f"--data {data} does not exist")
    console(f"loading {model}")
    loaded = load_model.load_model_dir(model)
    if not loaded.has_heads:
        raise UserError(f"--model {model} has no pretraining heads (an encoder-only model)")
    config = loaded.config
    prepare_config = layout.read_prepare_config(data) if fs.isdir(data) else None
    objectives.check_records(
        f"--data {data}", prepare_config, config.objective, f"--model {model}'s objective"
    )
    if loaded.has_tokenizer:  # records of another vocabulary would be scored as nonsense
        check_prepared_with(loaded.tokenizer, [("--data", data)], f"--model {model}'s tokenizer")
    length, slots = _record_shapes(data, prepare_config)
    if length > config.max_position_embeddings:
        raise UserError(
            f"--data {data} holds records of {length} tokens; the model reads at most "
            f"{config.max_position_embeddings}"
        )
    total = _count_records(data)
    if batches:
        total = min(total, batches * batch_size)
    module = trainer.pretraining_model(config)  # BERT's, or ModernBERT's masked-LM model
    step = jax.jit(lambda params, batch: trainer.eval_step(params, batch, model=module))
    progress = _Progress(total, console)
    sums = heldout_eval.EvalSums(config.vocab_size, config.objective)
    for batch in _padded_batches(data, length, slots, batch_size, config.objective, total):
        _check_ids(batch, config.vocab_size, data, model)
        sums.add(batch, step(loaded.params, batch))
        progress.update(int(batch["next_sentence_weights"].sum()))
    if not progress.done:
        raise UserError(f"--data {data} holds no records")
    result = sums.result()
    result["examples"] = progress.done
    result["objective"] = config.objective
    result["batches"] = progress.batches
    progress.finish()
    return result


def _count_records(data: str) -> int:
    """The records in `data` (read through once: a few seconds for thousands)."""
    from bert_jax.data.records import tfrecord as records

    tf = records.import_tensorflow()
    files = records.list_record_files([data])
    return int(sum(1 for _ in tf.data.TFRecordDataset(files)))


def _padded_batches(data: str, length: int, slots: int, batch_size: int, objective: str, total):
    """Every record in file order as batches of `batch_size`: the last one is filled with copies
    of its first row whose weights are zero (MLM slots, NSP label, and for "ltr" the input mask),
    so each record counts once and nothing else counts. Rows carry `next_sentence_weights`."""
    import numpy as np

    from bert_jax.data.pipeline import tf_data as pipeline

    settings = pipeline.PipelineSettings(
        batch_size=1,
        max_seq_length=length,
        max_predictions_per_seq=slots,
        shuffle=False,
        num_epochs=1,
        objective=objective,
    )
    rows: list[dict[str, np.ndarray]] = []
    taken = 0
    for row in pipeline.make_pretrain_iterator(data, settings):
        if taken >= total:
            break
        taken += 1
        row = {k: np.asarray(v) for k, v in row.items()}
        row["next_sentence_weights"] = np.ones((1,), np.float32)
        rows.append(row)
        if len(rows) == batch_size:
            yield {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
            rows = []
    if rows:
        filler = {k: v.copy() for k, v in rows[0].items()}
        filler["masked_lm_weights"] = np.zeros_like(filler["masked_lm_weights"])
        filler["next_sentence_weights"] = np.zeros_like(filler["next_sentence_weights"])
        if objective == "ltr":
            filler["input_mask"] = np.zeros_like(filler["input_mask"])
        rows += [filler] * (batch_size - len(rows))
        yield {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}


def _check_ids(batch, vocab_size: int, data: str, model: str) -> None:
    """Token ids the model has no embedding for: one line, not an IndexError or NaN."""
    import numpy as np

    for key in ("input_ids", "masked_lm_ids"):
        largest = int(np.max(batch[key]))
        if largest >= vocab_size:
            raise UserError(
                f"--data {data} holds token id {largest} ({key}) but --model {model} has "
                f"vocab_size {vocab_size}: the records were made with another vocabulary; "
                "prepare them with the model's tokenizer"
            )


class _Progress:
    """Progress lines of `eval`: records done of the total, rate and ETA, every few seconds."""

    SECONDS = 5.0

    def __init__(self, total: int, console: Callable[[str], None]):
        import time

        self.total, self.console, self.clock = total, console, time.perf_counter
        self.start = self.last = self.clock()
        self.done = self.batches = 0
        console(f"evaluating {total} records")

    def update(self, records: int) -> None:
        from bert_jax.training.step_log import format_duration

        self.done += records
        self.batches += 1
        now = self.clock()
        if now - self.last >= self.SECONDS:
            rate = self.done / max(now - self.start, 1e-9)
            eta = (self.total - self.done) / max(rate, 1e-9)
            self.console(
                f"eval: {self.done}/{self.total} records, {rate:.1f} records/s, ETA "
                f"{format_duration(eta)}"
            )
            self.last = now

    def finish(self) -> None:
        seconds = self.clock() - self.start
        self.console(f"evaluated {self.done} records in {self.batches} batches in {seconds:.1f} s")


def summary_lines(result: dict[str, Any]) -> list[str]:
    """What `bert-jax eval` prints: one metric per line."""
    lines = [
        f"objective: {result['objective']}",
        f"examples: {result['examples']} records ({result['batches']} batches)",
        f"mlm_accuracy: {result['mlm_accuracy']:.4f} (most frequent token "
        f"{result['mlm_baseline_accuracy']:.4f})",
        f"mlm_loss: {result['mlm_loss']:.4f}",
        f"mlm_perplexity: {result['mlm_perplexity']:.4f}",
    ]
    if "nsp_accuracy" in result:
        from bert_jax.training import heldout_eval

        lines.append(f"nsp_accuracy: {result['nsp_accuracy']:.4f}")
        lines.append(
            f"nsp_baseline_accuracy: {result['nsp_baseline_accuracy']:.4f} (always "
            f'"{result["nsp_baseline_class"]}", the majority label)'
        )
        flag = heldout_eval.one_class_words(result)
        lines.append(f"nsp_one_class: {'yes (' + flag + ')' if flag else 'no'}")
    return lines
