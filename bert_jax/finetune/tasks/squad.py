"""SQuAD v1.1/v2.0: the tasks, the official JSON (or TFDS), windows over long contexts as features.

Reading. The official layout: `{"version", "data": [{"title", "paragraphs": [{"context", "qas":
[{"id", "question", "answers": [{"text", "answer_start"}], "is_impossible"}]}]}]}` (`is_impossible`
only in v2.0). A local `--data` is a directory holding `train-v1.1.json` and `dev-v1.1.json` (or
the v2.0 names), or one training JSON file (dev then from `--dev-data`). A malformed file is a
`SquadDataError` naming the file and the record (`data[i].paragraphs[j].qas[k]`, with its id).
A training answer whose text is not at its `answer_start` is skipped and counted, as the original
run_squad does. `tfds` / `tfds:DATA_DIR` reads TFDS `squad/v1.1` or `squad/v2.0` where the user has
prepared it (nothing is downloaded).

Tokens and characters. The context is cut into pieces with their character spans: at whitespace,
and for a WordPiece tokenizer also at each punctuation mark and CJK character, exactly where
BERT's basic tokenizer cuts, so the ids equal those of the whole text. Each piece's sub-tokens get
character spans inside it (from the lengths of their surface strings when those add up to the
piece, else the whole piece's span). An answer is then a slice of the original context: its case,
accents and whitespace as written. This works for WordPiece and SentencePiece alike. A byte-level
BPE tokenizer (ModernBERT's) reads the whole context at once, as transformers' fast tokenizer does
(a word inside a sentence with its space mark), its spans from the library's offsets
(`HfBpeTokenizer.encode_with_spans`).

Features (run_squad's): `[CLS] question [SEP] window [SEP]`, the question cut to `max_query_length`
sub-tokens, windows of the context's sub-tokens every `doc_stride`; a sub-token seen in several
windows is scored only in the one where it has the most context (min(left, right) + 0.01 x window
length). Training targets are the answer's first and last sub-token, or [CLS] (position 0) for an
unanswerable question or a window without the whole answer.
"""

from __future__ import annotations

import dataclasses
import json
import os
import unicodedata
from collections.abc import Sequence
from typing import Any

import numpy as np

from bert_jax.finetune.tasks.task import SPANS, Task
from bert_jax.runtime import fs
from bert_jax.runtime.errors import UserError

VERSIONS = ("v1.1", "v2.0")


class SquadDataError(UserError):
    """A SQuAD file is missing or malformed; the message names the file and the record."""


@dataclasses.dataclass(frozen=True)
class SquadExample:
    """One question. `answers` are (text, answer_start) pairs; none when unanswerable."""

    qid: str
    question: str
    context: str
    answers: tuple[tuple[str, int], ...]
    is_impossible: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class SquadTask(Task):
    """A SQuAD version's task; its files are named after `version` (`train-v1.1.json`)."""

    family: str = SPANS
    version: str


def _spellings(*numbers: str) -> tuple[str, ...]:
    """`squad1.1`, `squad/v1`, ... (compared without case, '-' and '_')."""
    return tuple(f"squad{sep}{v}{n}" for sep in ("", "/") for v in ("", "v") for n in numbers)


TASKS = (
    SquadTask(
        name="squad/v1.1",
        version="v1.1",
        aliases=_spellings("1.1", "1", "11"),
        metrics=("f1", "exact_match"),
        defaults={"learning_rate": 5e-5, "batch_size": 32, "epochs": 3.0, "max_seq_length": 384},
        paper=(  # Table 2
            ("BERT-Base (paper, dev)", {"exact_match": 80.8, "f1": 88.5}),
            ("BERT-Large (paper, dev)", {"exact_match": 84.1, "f1": 90.9}),
        ),
    ),
    SquadTask(
        name="squad/v2.0",
        version="v2.0",
        aliases=_spellings("2.0", "2"),
        metrics=("f1", "exact"),
        defaults={"learning_rate": 5e-5, "batch_size": 48, "epochs": 2.0, "max_seq_length": 384},
        paper=(  # Table 3
            ("BERT-Large (paper, dev)", {"exact": 78.7, "f1": 81.9}),
            ("BERT-Large (paper, test)", {"exact": 80.0, "f1": 83.1}),
        ),
    ),
)


# ------------------------------------------------------------------------------------------------
# Reading
# ------------------------------------------------------------------------------------------------


def _need(record: Any, key: str, kind: type, path: str, where: str) -> Any:
    if not isinstance(record, dict) or key not in record:
        raise SquadDataError(f"{path}: {where} has no {key!r}")
    value = record[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise SquadDataError(
            f"{path}: {where}.{key} is {type(value).__name__}, not {kind.__name__}"
        )
    return value


def parse_squad(payload: Any, path: str) -> list[SquadExample]:
    """Examples from a loaded official JSON document (`path` only names it in errors)."""
    data = _need(payload, "data", list, path, "the file")
    examples = []
    for i, article in enumerate(data):
        paragraphs = _need(article, "paragraphs", list, path, f"data[{i}]")
        for j, paragraph in enumerate(paragraphs):
            where_p = f"data[{i}].paragraphs[{j}]"
            context = _need(paragraph, "context", str, path, where_p)
            for k, qa in enumerate(_need(paragraph, "qas", list, path, where_p)):
                where = f"{where_p}.qas[{k}]"
                qid = str(_need(qa, "id", str, path, where))
                where = f"{where} (id {qid})"
                question = _need(qa, "question", str, path, where)
                impossible = bool(qa.get("is_impossible", False))
                answers = []
                for n, answer in enumerate(_need(qa, "answers", list, path, where)):
                    text = _need(answer, "text", str, path, f"{where}.answers[{n}]")
                    start = _need(answer, "answer_start", int, path, f"{where}.answers[{n}]")
                    if not 0 <= start <= len(context) - len(text):
                        raise SquadDataError(
                            f"{path}: {where}.answers[{n}] starts at {start}, outside its "
                            f"context of {len(context)} characters"
                        )
                    answers.append((text, start))
                if not answers and not impossible:
                    raise SquadDataError(f"{path}: {where} has no answers and is not is_impossible")
                examples.append(
                    SquadExample(qid, question, context, tuple(answers), impossible or not answers)
                )
    if not examples:
        raise SquadDataError(f"{path}: no questions")
    return examples


def read_json(path: str) -> tuple[list[SquadExample], dict]:
    """Examples and the raw document (the official metric reads the same structure)."""
    if not fs.isfile(path):
        raise SquadDataError(f"SQuAD file not found: {path}")
    try:
        with fs.open(path, encoding="utf-8") as f:
            payload = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise SquadDataError(f"{path}: not valid UTF-8 JSON ({error})") from None
    return parse_squad(payload, path), payload


def split_files(data: str, version: str, dev_data: str | None = None) -> tuple[str, str]:
    """(train JSON, dev JSON) from `--data` (a directory or the train file) and `--dev-data`."""
    names = {split: f"{split}-{version}.json" for split in ("train", "dev")}
    if fs.isdir(data):
        train, dev = (os.path.join(data, names[s]) for s in ("train", "dev"))
    else:
        train = data
        dev = os.path.join(os.path.dirname(fs.abspath(data)), names["dev"])
    dev = dev_data or dev
    for path in (train, dev):
        if not fs.isfile(path):
            raise SquadDataError(
                f"SQuAD file not found: {path} (pass a directory holding {names['train']} and "
                f"{names['dev']}, or the train file and --dev-data)"
            )
    return train, dev


def read_tfds(version: str, split: str, data_dir: str | None = None) -> list[SquadExample]:
    """TFDS `squad/VERSION` (`split` train or validation), if prepared; never downloads."""
    import tensorflow_datasets as tfds

    name = f"squad/{version}"
    builder = tfds.builder(name, data_dir=data_dir)
    if not builder.is_prepared():
        raise SquadDataError(
            f"tfds {name} is not prepared in {builder.data_dir}; run `tfds build {name}` first "
            "(or pass the official JSON files)"
        )
    return [example_from_tfds(r) for r in tfds.as_numpy(builder.as_dataset(split=split))]


def example_from_tfds(record: dict) -> SquadExample:
    """One TFDS `squad/*` record (NumPy values, as `tfds.as_numpy` yields); v2.0's unanswerable
    questions have no answers (their `plausible_answers` are not gold)."""

    def text(value: Any) -> str:
        return value.decode("utf-8") if isinstance(value, bytes) else str(value)

    texts = [text(t) for t in record["answers"]["text"]]
    starts = [int(s) for s in record["answers"]["answer_start"]]
    if len(texts) != len(starts):
        raise SquadDataError(
            f"tfds squad record {text(record['id'])}: {len(texts)} answer texts, "
            f"{len(starts)} starts"
        )
    answers = tuple(zip(texts, starts, strict=True))
    impossible = bool(record.get("is_impossible", False)) or not answers
    return SquadExample(
        text(record["id"]), text(record["question"]), text(record["context"]), answers, impossible
    )


def as_dataset(examples: Sequence[SquadExample]) -> list[dict]:
    """Examples in the official structure (for the metric, from TFDS records)."""
    qas = [
        {"id": e.qid, "answers": [{"text": t, "answer_start": s} for t, s in e.answers]}
        for e in examples
    ]
    return [{"paragraphs": [{"qas": qas}]}]


# ------------------------------------------------------------------------------------------------
# Characters to sub-tokens
# ------------------------------------------------------------------------------------------------


def _is_space(char: str) -> bool:
    return char.isspace() or unicodedata.category(char) == "Zs"


def _stands_alone(char: str) -> bool:
    """Punctuation (all non-alphanumeric ASCII counts) and CJK ideographs, as BERT splits them."""
    cp = ord(char)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    if unicodedata.category(char).startswith("P"):
        return True
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


def pieces(text: str, split_punctuation: bool) -> list[tuple[int, int]]:
    """Character spans of the text's pieces: runs between whitespace, punctuation alone."""
    spans = []
    start = None
    for index, char in enumerate(text):
        if _is_space(char) or (split_punctuation and _stands_alone(char)):
            if start is not None:
                spans.append((start, index))
                start = None
            if not _is_space(char):
                spans.append((index, index + 1))
        elif start is None:
            start = index
    if start is not None:
        spans.append((start, len(text)))
    return spans


def subtokens(tokenizer: Any, text: str) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The text's sub-token ids and each one's character span [start, end) in `text`."""
    if getattr(tokenizer, "kind", "") == "bpe":
        return tokenizer.encode_with_spans(text)
    wordpiece = getattr(tokenizer, "kind", "") == "wordpiece"
    ids: list[int] = []
    starts: list[int] = []
    ends: list[int] = []
    for begin, end in pieces(text, split_punctuation=wordpiece):
        piece_ids = tokenizer.encode(text[begin:end], allow_special=False)
        surfaces = [
            t[2:] if wordpiece and t.startswith("##") else t.lstrip("\u2581")
            for t in tokenizer.convert_ids_to_tokens(piece_ids)
        ]
        exact = tokenizer.unk_id not in piece_ids and sum(map(len, surfaces)) == end - begin
        offset = begin
        for token_id, surface in zip(piece_ids, surfaces, strict=True):
            ids.append(token_id)
            if exact:
                starts.append(offset)
                offset += len(surface)
                ends.append(offset)
            else:
                starts.append(begin)
                ends.append(end)
    return ids, np.asarray(starts, np.int64), np.asarray(ends, np.int64)


# ------------------------------------------------------------------------------------------------
# Features
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class SquadFeatures:
    """Windows as arrays (`arrays`: input_ids/input_mask/segment_ids [N, L], start_positions and
    end_positions [N]) and, per window, what post-processing needs: its example, each position's
    character span in the context (-1 outside the context) and whether it is that sub-token's
    max-context window (training features keep these three as [N, 0]: never read, and 9 bytes per
    position of the 88k-question training set would cost 0.3 GB)."""

    arrays: dict[str, np.ndarray]
    example_index: np.ndarray
    char_start: np.ndarray
    char_end: np.ndarray
    max_context: np.ndarray
    skipped_answers: int = 0

    def __len__(self) -> int:
        return len(self.example_index)


def window_starts(num_tokens: int, window: int, stride: int) -> list[tuple[int, int]]:
    """(start, length) of each window over `num_tokens` sub-tokens, as run_squad slides them."""
    spans = []
    start = 0
    while True:
        length = min(num_tokens - start, window)
        spans.append((start, length))
        if start + length >= num_tokens:
            return spans
        start += min(length, stride)


def max_context_flags(spans: Sequence[tuple[int, int]], num_tokens: int) -> list[np.ndarray]:
    """Per window, whether each of its tokens has its most context there (first wins ties)."""
    best_score = np.full(num_tokens, -1.0)
    best_window = np.zeros(num_tokens, np.int64)
    for index, (start, length) in enumerate(spans):
        positions = np.arange(start, start + length)
        score = np.minimum(positions - start, start + length - 1 - positions) + 0.01 * length
        better = score > best_score[positions]
        best_score[positions[better]] = score[better]
        best_window[positions[better]] = index
    return [best_window[start : start + length] == i for i, (start, length) in enumerate(spans)]


def _answer_tokens(
    example: SquadExample, starts: np.ndarray, ends: np.ndarray
) -> tuple[int, int] | None:
    """First and last sub-token of the first answer; None when its text is not at its start."""
    text, begin = example.answers[0]
    found = example.context[begin : begin + len(text)]
    if " ".join(found.split()) != " ".join(text.split()) or not text.strip():
        return None
    end = begin + len(text)
    inside = np.nonzero((ends > begin) & (starts < end))[0]
    return (int(inside[0]), int(inside[-1])) if len(inside) else None


def build_features(
    examples: Sequence[SquadExample],
    tokenizer: Any,
    max_seq_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
    training: bool = False,
) -> SquadFeatures:
    """Every example's windows (see the module docstring). With `training`, answerable examples
    whose answer text is not where it says are skipped (counted in `skipped_answers`)."""
    rows: dict[str, list] = {k: [] for k in ("input_ids", "segment_ids", "start", "end")}
    example_index, char_start, char_end, max_context = [], [], [], []
    skipped = 0
    cache: dict[str, tuple] = {}  # a context's sub-tokens, shared by its questions
    for index, example in enumerate(examples):
        query = tokenizer.encode(example.question, allow_special=False)[:max_query_length]
        window = max_seq_length - len(query) - 3
        if window < 1:
            raise UserError(
                f"max_seq_length={max_seq_length} leaves no room for the context after a "
                f"question of {len(query)} sub-tokens (max_query_length={max_query_length})"
            )
        if example.context not in cache:
            cache = {example.context: subtokens(tokenizer, example.context)}
        ids, starts, ends = cache[example.context]
        answer = None
        if training and not example.is_impossible:
            answer = _answer_tokens(example, starts, ends)
            if answer is None:
                skipped += 1
                continue
        spans = window_starts(len(ids), window, doc_stride)
        for (start, length), flags in zip(spans, max_context_flags(spans, len(ids)), strict=True):
            offset = len(query) + 2
            tokens = [tokenizer.cls_id, *query, tokenizer.sep_id, *ids[start : start + length]]
            tokens.append(tokenizer.sep_id)
            width = 0 if training else max_seq_length
            c_start = np.full(width, -1, np.int32)
            c_end = np.full(width, -1, np.int32)
            best = np.zeros(width, bool)
            if not training:
                c_start[offset : offset + length] = starts[start : start + length]
                c_end[offset : offset + length] = ends[start : start + length]
                best[offset : offset + length] = flags
            target = (0, 0)
            if answer is not None and start <= answer[0] and answer[1] < start + length:
                target = (answer[0] - start + offset, answer[1] - start + offset)
            rows["input_ids"].append(tokens)
            rows["segment_ids"].append([0] * offset + [1] * (length + 1))
            rows["start"].append(target[0])
            rows["end"].append(target[1])
            example_index.append(index)
            char_start.append(c_start)
            char_end.append(c_end)
            max_context.append(best)
    count = len(example_index)
    input_ids = np.full((count, max_seq_length), tokenizer.pad_id, np.int32)
    segment_ids = np.zeros((count, max_seq_length), np.int32)
    input_mask = np.zeros((count, max_seq_length), np.int32)
    for row, (tokens, segments) in enumerate(
        zip(rows["input_ids"], rows["segment_ids"], strict=True)
    ):
        input_ids[row, : len(tokens)] = tokens
        segment_ids[row, : len(segments)] = segments
        input_mask[row, : len(tokens)] = 1
    shape = (count, 0 if training else max_seq_length)
    return SquadFeatures(
        arrays={
            "input_ids": input_ids,
            "input_mask": input_mask,
            "segment_ids": segment_ids,
            "start_positions": np.asarray(rows["start"], np.int32).reshape(count),
            "end_positions": np.asarray(rows["end"], np.int32).reshape(count),
        },
        example_index=np.asarray(example_index, np.int64).reshape(count),
        char_start=np.stack(char_start) if count else np.zeros(shape, np.int32),
        char_end=np.stack(char_end) if count else np.zeros(shape, np.int32),
        max_context=np.stack(max_context) if count else np.zeros(shape, bool),
        skipped_answers=skipped,
    )
