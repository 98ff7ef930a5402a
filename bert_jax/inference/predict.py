"""Predictions of a fine-tuned model on new inputs (`bert-jax predict`, and `predict()` for Python).

The model is a fine-tuned model directory (`bert_jax.convert.model_dir`: what `bert-jax
finetune` writes into `<workdir>/model/`, or the workdir itself); its task entry says which head
it has, and so which fields each input row needs (`INPUTS`, one entry per `task_heads` kind):

    classification, regression  text, and text_pair for a pair task (MRPC, RTE, ...)
    multiple_choice             context, endings (a list; TSV: ending0, ending1, ... columns),
                                start (optional: the ending's first words, SWAG's sent2)
    span                        question, context
    tags                        words (a list; TSV: one column, words separated by spaces)

and, in every kind, an optional `id` (default: the row's number), echoed in the output. Input
is JSONL (one object a line; `.jsonl`/`.json`) or TSV (a header naming the columns, then a row
a line, tab-separated, no quoting). Each row's prediction:

    classification   label (the label's name), score (its softmax probability)
    regression       score (the predicted value; STS-B's 0-5)
    multiple_choice  label (the chosen ending's index), ending, score (its probability)
    span             answer (the context's characters; "" for "no answer" with SQuAD v2.0),
                     score (its probability among the n best), the run's n-best rule
                     (`squad_answers.answers_from_logits`)
    tags             tags (one per word: the tag at its first sub-token, as the fine-tuned
                     CoNLL-2003 run reads them, `conll.predicted_tags`), scores

Rows are encoded as the run encoded its dev rows (same tokenizer, `max_seq_length`, SQuAD's
windows), predicted in batches of similar length, each padded to its length bucket
(`token_tuning.predict_logits`), by default as many a batch as the run evaluated, so the run's
own rows come out as the run predicted them (SQuAD's n best look at every position of a window,
so a window's bucket can change an answer's probability in the last digits).
Bad input is one line naming the file and row (a missing field, a wrong column count, a text
where the model reads pairs, an empty file).

Why this file is long: five head kinds each read their rows, build their features and turn their
logits into predictions; split by kind, each would repeat the row checks and the output format.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bert_jax.runtime import declarations, fs
from bert_jax.runtime import outputs as files
from bert_jax.runtime.declarations import setting
from bert_jax.runtime.errors import UserError, user_path

JSONL_SUFFIXES = (".jsonl", ".json")
FORMATS = ("auto", "jsonl", "tsv")
DEFAULT_BATCH_SIZE = 32  # a model whose task entry records no evaluation batch size


@dataclasses.dataclass(frozen=True)
class PredictSettings:
    """How `predict` runs, each setting declared once: its flags, their help and the checks
    derive from these declarations, and `predict()` takes its defaults from them."""

    batch_size: int | None = setting(
        None,
        "rows per forward pass (default: the run's --eval-batch-size, so the run's own rows are "
        "batched, padded and predicted as the run did)",
        low=1,
    )
    output_format: str = setting(
        "auto",
        "jsonl or tsv; auto: tsv for an --output ending in .tsv, else jsonl",
        choices=FORMATS,
        flag="format",
        metavar="FORMAT",
    )
    progress_every: float = setting(
        10.0, "seconds between progress lines on standard error (0: none)", low=0.0
    )

    def __post_init__(self):
        for problem in declarations.problems(self):
            raise UserError(problem)


@dataclasses.dataclass(frozen=True)
class InputKind:
    """The fields a head kind's rows hold: `required`, `optional`, the list-valued ones
    (`lists`: TSV spells `words` as one column of words, `endings` as numbered columns), and
    the output columns of its TSV."""

    required: tuple[str, ...]
    optional: tuple[str, ...]
    lists: tuple[str, ...]
    columns: tuple[str, ...]


INPUTS: dict[str, InputKind] = {
    "classification": InputKind(("text",), ("text_pair",), (), ("id", "label", "score")),
    "regression": InputKind(("text",), ("text_pair",), (), ("id", "score")),
    "multiple_choice": InputKind(
        ("context", "endings"), ("start",), ("endings",), ("id", "label", "ending", "score")
    ),
    "span": InputKind(("question", "context"), (), (), ("id", "answer", "score")),
    "tags": InputKind(("words",), (), ("words",), ("id", "tags")),
}


@dataclasses.dataclass(frozen=True)
class Row:
    """One input row: where it is (`FILE line N`), its id, its fields."""

    where: str
    id: str
    fields: Mapping[str, Any]


# ------------------------------------------------------------------------------------------------
# Reading the input
# ------------------------------------------------------------------------------------------------


def read_rows(path: str) -> list[Row]:
    """The rows of a JSONL or TSV file (by its suffix: .jsonl/.json are JSONL), checked for
    their shape (objects; as many columns as the header); an empty file is refused."""
    with user_path(path, "--input"), fs.open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    if not numbered:
        raise UserError(f"--input {path} holds no rows")
    if path.lower().endswith(JSONL_SUFFIXES):
        return [_json_row(path, n, line) for n, line in numbered]
    (_, header), body = numbered[0], numbered[1:]
    names = header.split("\t")
    if not body:
        raise UserError(f"--input {path} holds a header ({', '.join(names)}) and no rows")
    return [_tsv_row(path, n, line, names) for n, line in body]


def _json_row(path: str, number: int, line: str) -> Row:
    where = f"{path} line {number}"
    try:
        fields = json.loads(line)
    except ValueError as err:
        raise UserError(f"{where}: not JSON ({err.msg})") from None
    if not isinstance(fields, dict):
        raise UserError(f"{where}: not a JSON object ({type(fields).__name__})")
    return Row(where, str(fields.pop("id", number)), fields)


def _tsv_row(path: str, number: int, line: str, names: list[str]) -> Row:
    where = f"{path} line {number}"
    cells = line.split("\t")
    if len(cells) != len(names):
        raise UserError(
            f"{where}: {len(cells)} columns, the header has {len(names)} ({', '.join(names)})"
        )
    fields: dict[str, Any] = dict(zip(names, cells, strict=True))
    endings = [name for name in names if name.startswith("ending") and name[6:].isdigit()]
    if endings:
        fields["endings"] = [fields.pop(name) for name in sorted(endings, key=lambda n: int(n[6:]))]
    if "words" in fields:
        fields["words"] = fields["words"].split()
    return Row(where, str(fields.pop("id", number - 1)), fields)


def check_rows(rows: Sequence[Row], head: str, task: Mapping[str, Any]) -> None:
    """Every row holds the fields its head reads, of the right kind; one line naming the row
    and what it lacks otherwise."""
    kind = INPUTS[head]
    pair = task.get("pair")
    for row in rows:
        wanted = kind.required + (("text_pair",) if pair else ())
        missing = [name for name in wanted if name not in row.fields]
        if missing:
            reads = " and ".join(wanted) if pair is not None else " and ".join(kind.required)
            raise UserError(
                f"{row.where}: no {missing[0]!r} field; the model ({task['name']}) reads "
                f"{reads}{' (a pair)' if pair else ''}"
            )
        if pair is False and "text_pair" in row.fields:
            raise UserError(
                f"{row.where}: a 'text_pair' field, but the model ({task['name']}) reads single "
                "texts (its field: text)"
            )
        for name in (*wanted, *kind.optional):
            value = row.fields.get(name)
            if name not in row.fields:
                continue
            if name in kind.lists:
                least = 2 if name == "endings" else 1
                if not isinstance(value, list) or len(value) < least:
                    raise UserError(f"{row.where}: {name!r} must be a list of {least}+ strings")
                if not all(isinstance(x, str) for x in value):
                    raise UserError(f"{row.where}: {name!r} must hold strings only")
            elif not isinstance(value, str):
                raise UserError(f"{row.where}: {name!r} must be a string")


# ------------------------------------------------------------------------------------------------
# The model
# ------------------------------------------------------------------------------------------------


def _module(config: Any, head: str, outputs: int) -> Any:
    """The Flax module of a head kind in `config`'s family: the one fine-tuning trained."""
    from bert_jax.core.modernbert_config import ModernBertConfig
    from bert_jax.finetune.heads import modernbert_pooled, per_token, pooled

    modern = isinstance(config, ModernBertConfig)
    if head in ("classification", "regression"):
        if modern:
            return modernbert_pooled.ModernBertForSequenceClassification(config, outputs)
        return pooled.BertForSequenceClassification(config, outputs)
    if head == "multiple_choice":
        if modern:
            return modernbert_pooled.ModernBertForMultipleChoice(config)
        return pooled.BertForMultipleChoice(config)
    if modern:
        return per_token.ModernBertForTokenOutputs(config, outputs)
    return per_token.BertForTokenOutputs(config, outputs)


@functools.lru_cache(maxsize=8)
def _compiled_forward(config: Any, head: str, outputs: int) -> Callable[..., Any]:
    """The module's forward pass, jitted: one per model, shared by every `predict` call with it
    (each batch shape compiled once)."""
    import jax

    model = _module(config, head, outputs)
    return jax.jit(
        lambda params, ids, mask, segments: model.apply(
            {"params": params}, ids, mask, segments, deterministic=True
        )
    )


class _Predictor:
    """The model's forward pass, compiled once per batch shape, as `token_tuning.predict_logits`
    calls a tuner (`global_batch`, `predict`); counts rows for the progress lines and the
    shapes it compiled."""

    def __init__(self, loaded: Any, progress: Callable[[int], None]):
        import jax

        task = loaded.task
        from bert_jax.convert import task_heads

        outputs = task_heads.get(task["head"]).num_outputs(task["labels"])
        self.params = jax.device_put(loaded.params)
        self.shapes: set[tuple[int, ...]] = set()
        self._progress = progress
        self._apply = _compiled_forward(loaded.config, task["head"], outputs)

    def global_batch(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        return dict(batch)

    def predict(self, params: Any, batch: Mapping[str, Any]) -> Any:
        ids = batch["input_ids"]
        self.shapes.add(tuple(ids.shape))
        logits = self._apply(params, ids, batch["input_mask"], batch["segment_ids"])
        self._progress(len(ids))
        return logits


def _logits(predictor: _Predictor, arrays: Mapping[str, Any], batch_size: int) -> Any:
    from bert_jax.finetune.tuning import token_tuning

    return token_tuning.predict_logits(predictor, predictor.params, arrays, batch_size)


# ------------------------------------------------------------------------------------------------
# Each head kind: features in, predictions out
# ------------------------------------------------------------------------------------------------


def _softmax(logits: Any) -> Any:
    import numpy as np

    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def _sentences(predictor, loaded, rows, batch_size) -> list[dict[str, Any]]:
    import numpy as np

    from bert_jax.data.tokenizers.pair_encoding import encode_pairs

    task = loaded.task
    pairs = [row.fields.get("text_pair") for row in rows]
    arrays = encode_pairs(
        loaded.tokenizer,
        [row.fields["text"] for row in rows],
        pairs if any(p is not None for p in pairs) else None,
        max_seq_length=task["max_seq_length"],
    )
    logits = np.asarray(_logits(predictor, arrays, batch_size), np.float64)
    if task["head"] == "regression":
        return [{"score": float(value)} for value in logits[:, 0]]
    probabilities = _softmax(logits)
    chosen = np.argmax(logits, axis=-1)
    return [
        {"label": task["labels"][int(i)], "score": float(p[i])}
        for i, p in zip(chosen, probabilities, strict=True)
    ]


def _choices(predictor, loaded, rows, batch_size) -> list[dict[str, Any]]:
    import numpy as np

    from bert_jax.data.tokenizers.pair_encoding import encode_pairs
    from bert_jax.finetune.tasks import swag

    length = loaded.task["max_seq_length"]
    results: list[dict[str, Any]] = [{} for _ in rows]
    by_count: dict[int, list[int]] = {}
    for index, row in enumerate(rows):
        by_count.setdefault(len(row.fields["endings"]), []).append(index)
    for count, members in by_count.items():  # one shape per number of endings
        examples = [
            swag.SwagExample(
                rows[i].id,
                rows[i].fields["context"],
                rows[i].fields.get("start", ""),
                tuple(rows[i].fields["endings"]),
                None,
            )
            for i in members
        ]
        texts = [pair for example in examples for pair in swag.choice_texts(example)]
        encoded = encode_pairs(
            loaded.tokenizer, [a for a, _ in texts], [b for _, b in texts], max_seq_length=length
        )
        arrays = {key: value.reshape(len(members), count, length) for key, value in encoded.items()}
        logits = np.asarray(_logits(predictor, arrays, batch_size), np.float64)
        for i, scores, probabilities in zip(members, logits, _softmax(logits), strict=True):
            choice = int(np.argmax(scores))
            ending = rows[i].fields["endings"][choice]
            results[i] = {"label": choice, "ending": ending, "score": float(probabilities[choice])}
    return results


def _spans(predictor, loaded, rows, batch_size) -> list[dict[str, Any]]:
    from bert_jax.finetune.runs.squad_and_conll import SpanOptions
    from bert_jax.finetune.tasks import squad, squad_answers

    task = loaded.task
    options = {**dataclasses.asdict(SpanOptions()), **(task.get("options") or {})}
    version = options.get("version", "v1.1")
    examples = [
        squad.SquadExample(str(i), row.fields["question"], row.fields["context"], ())
        for i, row in enumerate(rows)
    ]
    features = squad.build_features(
        examples,
        loaded.tokenizer,
        max_seq_length=task["max_seq_length"],
        doc_stride=options["doc_stride"],
        max_query_length=options["max_query_length"],
    )
    logits = _logits(predictor, features.arrays, batch_size)
    found = squad_answers.answers_from_logits(
        examples,
        features,
        logits,
        version,
        options["n_best_size"],
        options["max_answer_length"],
        options["null_score_diff_threshold"],
    )
    results = []
    for example in examples:
        answer = found.predictions[example.qid]
        entry = next(e for e in found.nbest[example.qid] if e["text"] == answer)
        results.append({"answer": answer, "score": float(entry["probability"])})
    return results


def _tags(predictor, loaded, rows, batch_size) -> list[dict[str, Any]]:
    import numpy as np

    from bert_jax.finetune.tasks import conll as ner

    task = loaded.task
    labels = task["labels"]
    sentences = [
        ner.Sentence(tuple(row.fields["words"]), ("O",) * len(row.fields["words"]), i)
        for i, row in enumerate(rows)
    ]
    features = ner.build_features(sentences, loaded.tokenizer, labels, task["max_seq_length"])
    logits = np.asarray(_logits(predictor, features.arrays, batch_size), np.float64)
    tags = ner.predicted_tags(sentences, features, logits, labels)
    scores: list[list[float | None]] = [[None] * len(s.words) for s in sentences]
    for row, placed in enumerate(features.words):  # the probability of each word's tag
        for sentence, word, position in placed:
            scores[sentence][word] = float(np.max(_softmax(logits[row, position])))
    return [
        {"words": list(s.words), "tags": t, "scores": p}
        for s, t, p in zip(sentences, tags, scores, strict=True)
    ]


HEAD_PREDICTIONS: dict[str, Callable[..., list[dict[str, Any]]]] = {
    "classification": _sentences,
    "regression": _sentences,
    "multiple_choice": _choices,
    "span": _spans,
    "tags": _tags,
}


# ------------------------------------------------------------------------------------------------
# Entry points
# ------------------------------------------------------------------------------------------------


def load_finetuned(model: str | os.PathLike) -> Any:
    """MODEL as a fine-tuned model (a `ModelDir` with its task); one line for any other."""
    from bert_jax.training.load_model import load_model_dir

    described = load_model_dir(model, load_params=False)
    if described.task is None:
        raise UserError(
            f"--model {model} is not a fine-tuned model (its directory has no task head): "
            "predict reads what `bert-jax finetune` writes (WORKDIR or WORKDIR/model); for "
            "features use `bert-jax encode`, for [MASK] `bert-jax fill-mask`"
        )
    return load_model_dir(model, load_tokenizer=True)


class _Progress:
    """A line on standard error every `every` seconds with the rows done and the rate."""

    def __init__(self, total: int, every: float, log: Callable[[str], None]):
        self.total, self.every, self.log = total, every, log
        self.done, self.started = 0, time.time()
        self.last = self.started

    def __call__(self, rows: int) -> None:
        self.done = min(self.done + rows, self.total)
        now = time.time()
        if self.every and now - self.last >= self.every and self.done < self.total:
            self.last = now
            rate = self.done / max(now - self.started, 1e-9)
            self.log(f"predict: {self.done:,}/{self.total:,} rows, {rate:,.1f} rows/s")


def predict(
    model: Any,
    rows: Sequence[Row] | Sequence[Mapping[str, Any]],
    settings: PredictSettings | None = None,
    log: Callable[[str], None] | None = None,
    **options: Any,
) -> list[dict[str, Any]]:
    """Each row's prediction, in order, as a dict {"id", ...} (the module docstring says what
    each head gives). `model`: MODEL (a fine-tuned model directory or finetune workdir) or a
    loaded `ModelDir`; `rows`: `Row`s or plain dicts of fields (an `id` among them optional)."""
    settings = dataclasses.replace(settings or PredictSettings(), **options)
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    loaded = model if hasattr(model, "task") and model.params is not None else load_finetuned(model)
    rows = [
        row
        if isinstance(row, Row)
        else Row(f"row {n}", str(row.get("id", n)), {k: v for k, v in row.items() if k != "id"})
        for n, row in enumerate(rows)
    ]
    if not rows:
        raise UserError("no rows to predict")
    head = loaded.task["head"]
    check_rows(rows, head, loaded.task)
    started = time.time()
    progress = _Progress(len(rows), settings.progress_every, log)
    predictor = _Predictor(loaded, progress)
    ran = loaded.task.get("settings") or {}
    batch_size = settings.batch_size or int(ran.get("eval_batch_size", DEFAULT_BATCH_SIZE))
    predicted = HEAD_PREDICTIONS[head](predictor, loaded, rows, batch_size)
    seconds = time.time() - started
    shapes = ", ".join("x".join(map(str, shape)) for shape in sorted(predictor.shapes))
    log(
        f"predict: {len(rows):,} rows in {seconds:.1f}s ({len(rows) / max(seconds, 1e-9):,.1f} "
        f"rows/s); {len(predictor.shapes)} compiled batch shapes ({shapes})"
    )
    return [{"id": row.id, **values} for row, values in zip(rows, predicted, strict=True)]


def output_format(settings: PredictSettings, output: str | None) -> str:
    if settings.output_format != "auto":
        return settings.output_format
    return "tsv" if output is not None and output.lower().endswith(".tsv") else "jsonl"


def format_predictions(predictions: Sequence[Mapping[str, Any]], head: str, kind: str) -> str:
    """The predictions as JSONL (one object a line) or TSV (`INPUTS[head].columns`)."""
    if kind == "jsonl":
        return "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in predictions)
    columns = INPUTS[head].columns
    lines = ["\t".join(columns)]
    for prediction in predictions:
        cells = []
        for name in columns:
            value = prediction[name]
            if isinstance(value, list):
                value = " ".join(value)
            elif isinstance(value, float):
                value = f"{value:.6g}"
            cells.append(" ".join(str(value).split()))  # no tab or newline inside a cell
        lines.append("\t".join(cells))
    return "\n".join(lines) + "\n"


def _check_replaceable(path: str) -> None:
    """An existing OUT is replaced only when it holds predictions (what predict writes)."""
    if fs.isdir(path):
        raise UserError(f"--output {path} is a directory; give a file name such as OUT.jsonl")
    if not fs.exists(path):
        return
    with fs.open(path, encoding="utf-8", mode="r") as f:
        first = f.readline()
    try:
        ours = first.startswith("id\t") or "id" in json.loads(first)
    except (ValueError, TypeError):
        ours = False
    if not ours:
        raise UserError(
            f"--output {path} exists and does not hold predictions; bert-jax replaces only its "
            "own (choose another name or move it away)"
        )


def predict_file(
    model: str | os.PathLike,
    input_path: str,
    output_path: str | None = None,
    settings: PredictSettings | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """`bert-jax predict`: the predictions of every row of `input_path` written to
    `output_path` (standard output when None); a summary."""
    settings = settings or PredictSettings()
    if output_path is not None:
        _check_replaceable(output_path)  # before anything is read: a refusal costs nothing
    rows = read_rows(input_path)
    loaded = load_finetuned(model)
    check_rows(rows, loaded.task["head"], loaded.task)  # every row, before the model compiles
    predictions = predict(loaded, rows, settings, log)
    kind = output_format(settings, output_path)
    text = format_predictions(predictions, loaded.task["head"], kind)
    if output_path is None:
        sys.stdout.write(text)
    else:
        with user_path(output_path, "--output", writing=True):
            fs.makedirs(os.path.dirname(fs.abspath(output_path)), exist_ok=True)
            files.write_bytes_atomic(output_path, text.encode("utf-8"))
    return {"model": loaded.path, "task": loaded.task["name"], "rows": len(rows), "format": kind}
