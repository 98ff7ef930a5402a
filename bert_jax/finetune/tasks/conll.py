"""CoNLL-2003 NER: its two tasks (fine-tuned, feature-based), the column files (or TFDS),
first-sub-token features, conlleval's span F1.

Reading. A local `--data` directory holds train/dev(/test) in the CoNLL column format under either
the original names (`eng.train`, `eng.testa`, `eng.testb`) or the common ones (`train.txt`,
`valid.txt` or `dev.txt`, `test.txt`): one word per line, the word first and the NER tag last
(CoNLL-2003 has word, POS, chunk, NER), a blank line between sentences and `-DOCSTART-` lines
between documents. A line with another column count than the file's first, or a tag that is not `O`
or `B-`/`I-`/`E-`/`S-` + type, is a `NerDataError` naming the file and line. `tfds[:DATA_DIR]` reads
TFDS `conll2003` where prepared (it has no document boundaries; nothing is downloaded).

Tags. The original files use IOB1 (B- only between two adjacent entities of one type); for training
the tags become IOB2 (every entity starts with B-), which names the same entities. Entities are
read as conlleval reads them (`chunks`): a chunk starts at B- (or S-), at I-/E- after O or after
another type, and ends before anything that does not continue it, so IOB1, IOB2 and even invalid
predicted sequences (I- after O) are scored the same way as the official conlleval script.

Features. Each word is cut into sub-tokens (`word_subtokens`: with byte-level BPE, as in its
sentence's text, a word after the first with its space mark); the first sub-token of each word
carries its label, the others are ignored (weight 0), as the paper does. A sentence longer than
the window is cut at word boundaries into several windows. With `document_context`, the rest of
a window is filled with the sub-tokens around the sentence in its document (half before, half
after), unlabelled.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from bert_jax.finetune.tasks.task import FROZEN_TAGS, TAGS, Task
from bert_jax.runtime import fs
from bert_jax.runtime.errors import UserError

TASK_NAME = "conll2003"
_SPELLINGS = ("conll/2003", "ner")
TASKS = (
    Task(  # fine-tuned: a label at each word's first sub-token (no recipe in the paper)
        name=TASK_NAME,
        family=TAGS,
        aliases=_SPELLINGS,
        metrics=("f1", "precision", "recall"),
        defaults={"learning_rate": 5e-5, "batch_size": 32, "epochs": 3.0, "max_seq_length": 128},
        paper=(  # Table 7, the fine-tuning approach
            ("BERT-Base (paper)", {"dev f1": 96.4, "test f1": 92.4}),
            ("BERT-Large (paper)", {"dev f1": 96.6, "test f1": 92.8}),
        ),
    ),
    Task(  # feature-based (`--features VARIANT`): frozen BERT layers into a BiLSTM tagger
        name=TASK_NAME,
        family=FROZEN_TAGS,
        aliases=_SPELLINGS,
        feature_based=True,
        metrics=("f1", "precision", "recall"),
        # No recipe in the paper: Adam at 1e-3 with warmup and linear decay, as fine-tuning's.
        defaults={"learning_rate": 1e-3, "batch_size": 32, "epochs": 3.0, "max_seq_length": 128},
        paper=(  # Table 7: BERT-Base dev F1 per variant (`heads.lstm_tagger.VARIANTS`)
            (
                "BERT-Base (paper, dev)",
                {
                    "embeddings": 91.0,
                    "second_to_last": 95.6,
                    "last": 94.9,
                    "sum_last_four": 95.9,
                    "concat_last_four": 96.1,
                    "sum_all": 95.5,
                },
            ),
        ),
    ),
)
SPLIT_FILES = {
    "train": ("eng.train", "train.txt"),
    "dev": ("eng.testa", "valid.txt", "dev.txt"),
    "test": ("eng.testb", "test.txt"),
}
_PREFIXES = ("B", "I", "E", "S")


class NerDataError(UserError):
    """A CoNLL file is missing or malformed; the message names the file and line."""


@dataclasses.dataclass(frozen=True)
class Sentence:
    words: tuple[str, ...]
    tags: tuple[str, ...]
    document: int


def _check_tag(tag: str, where: str) -> None:
    if tag == "O":
        return
    prefix, _, kind = tag.partition("-")
    if prefix not in _PREFIXES or not kind:
        raise NerDataError(f"{where}: tag {tag!r} is not O or B-/I-/E-/S- followed by a type")


def read_conll(path: str) -> list[Sentence]:
    """Sentences of one CoNLL column file, with their document numbers."""
    if not fs.isfile(path):
        raise NerDataError(f"CoNLL file not found: {path}")
    try:
        lines = fs.read_bytes(path).decode("utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise NerDataError(f"{path}: not UTF-8 text ({error})") from None
    sentences: list[Sentence] = []
    words: list[str] = []
    tags: list[str] = []
    document = 0
    columns = None

    def close() -> None:
        if words:
            sentences.append(Sentence(tuple(words), tuple(tags), document))
            words.clear()
            tags.clear()

    for number, line in enumerate(lines, 1):
        fields = line.split()
        if not fields:
            close()
            continue
        where = f"{path}:{number}"
        if fields[0] == "-DOCSTART-":
            close()
            document += 1 if sentences else 0
            continue
        if columns is None:
            if len(fields) < 2:
                raise NerDataError(
                    f"{where}: expected a word and a tag, found {len(fields)} column"
                )
            columns = len(fields)
        if len(fields) != columns:
            raise NerDataError(
                f"{where}: expected {columns} columns (as on the file's first line), "
                f"found {len(fields)}"
            )
        _check_tag(fields[-1], where)
        words.append(fields[0])
        tags.append(fields[-1])
    close()
    if not sentences:
        raise NerDataError(f"{path}: no sentences")
    return sentences


def split_path(data: str, split: str) -> str | None:
    for name in SPLIT_FILES[split]:
        path = os.path.join(data, name)
        if fs.isfile(path):
            return path
    return None


def check_files(data: str) -> None:
    if data == "tfds" or data.startswith("tfds:"):
        return
    if not fs.isdir(data):
        raise NerDataError(f"CoNLL-2003 data directory not found: {data}")
    for split in ("train", "dev"):
        if split_path(data, split) is None:
            names = " or ".join(SPLIT_FILES[split])
            raise NerDataError(f"{data}: no CoNLL-2003 {split} file ({names})")


def read_split(data: str, split: str) -> list[Sentence] | None:
    """A split's sentences from a directory or TFDS; None for a missing test split."""
    if data == "tfds" or data.startswith("tfds:"):
        return read_tfds(split, data[5:] or None)
    path = split_path(data, split)
    if path is None:
        if split == "test":
            return None
        raise NerDataError(
            f"{data}: no CoNLL-2003 {split} file ({' or '.join(SPLIT_FILES[split])})"
        )
    return read_conll(path)


def read_tfds(split: str, data_dir: str | None = None) -> list[Sentence]:
    """TFDS `conll2003` (train, dev as its validation split, test), if prepared."""
    import tensorflow_datasets as tfds

    builder = tfds.builder(TASK_NAME, data_dir=data_dir)
    if not builder.is_prepared():
        raise NerDataError(
            f"tfds {TASK_NAME} is not prepared in {builder.data_dir}; run `tfds build "
            f"{TASK_NAME}` first (or pass a directory of CoNLL column files)"
        )
    names = builder.info.features["ner"].feature.names
    splits = builder.info.splits
    tfds_split = {"dev": "validation" if "validation" in splits else "dev"}.get(split, split)
    records = tfds.as_numpy(builder.as_dataset(split=tfds_split))
    return [sentence_from_tfds(r, names, i) for i, r in enumerate(records)]


def sentence_from_tfds(record: dict, names: Sequence[str], index: int) -> Sentence:
    """One TFDS `conll2003` record: `tokens` and `ner` class indices into `names`. Each sentence
    is its own document (TFDS keeps no document boundaries)."""
    words = tuple(w.decode("utf-8") if isinstance(w, bytes) else str(w) for w in record["tokens"])
    tags = tuple(names[int(t)] for t in record["ner"])
    if len(words) != len(tags):
        raise NerDataError(
            f"tfds {TASK_NAME} record {index}: {len(words)} tokens, {len(tags)} tags"
        )
    for tag in tags:
        _check_tag(tag, f"tfds {TASK_NAME} record {index}")
    return Sentence(words, tags, index)


# ------------------------------------------------------------------------------------------------
# Tags and conlleval
# ------------------------------------------------------------------------------------------------


def _split_tag(tag: str) -> tuple[str, str]:
    prefix, _, kind = tag.partition("-")
    return (prefix, kind) if kind else ("O", "")


def iob1_to_iob2(tags: Sequence[str]) -> list[str]:
    """Every entity starts with B-: I-X after O or after another type becomes B-X."""
    out = []
    previous = ("O", "")
    for tag in tags:
        prefix, kind = _split_tag(tag)
        if prefix == "I" and (previous[0] == "O" or previous[1] != kind):
            tag = f"B-{kind}"
        out.append(tag)
        previous = (prefix, kind)
    return out


def iob2_to_iob1(tags: Sequence[str]) -> list[str]:
    """B- only where an entity follows one of its own type; every other B-X becomes I-X."""
    out = []
    previous = ("O", "")
    for tag in tags:
        prefix, kind = _split_tag(tag)
        if prefix == "B" and not (previous[0] in ("B", "I") and previous[1] == kind):
            tag = f"I-{kind}"
        out.append(tag)
        previous = (prefix, kind)
    return out


def uses_iob1(sentences: Sequence[Sentence]) -> bool:
    """Whether some entity starts with I- (the original CoNLL-2003 files do)."""
    return any(list(s.tags) != training_tags(s.tags) for s in sentences)


def chunks(tags: Sequence[str]) -> set[tuple[str, int, int]]:
    """Entities (type, first, last word) as conlleval finds them (any IOB scheme)."""
    found = set()
    start = None
    previous = ("O", "")
    for index, tag in enumerate([*tags, "O"]):
        prefix, kind = _split_tag(tag)
        prev_prefix, prev_kind = previous
        ends = prev_prefix in ("E", "S") or (
            prev_prefix in ("B", "I") and (prefix in ("B", "S", "O") or prev_kind != kind)
        )
        begins = prefix in ("B", "S") or (
            prefix in ("I", "E") and (prev_prefix in ("O", "E", "S") or prev_kind != kind)
        )
        if start is not None and ends:
            found.add((prev_kind, start, index - 1))
            start = None
        if begins:
            start = index
        previous = (prefix, kind)
    return found


def _prf(correct: int, guessed: int, gold: int) -> dict[str, float]:
    precision = correct / guessed if guessed else 0.0
    recall = correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": 100 * precision, "recall": 100 * recall, "f1": 100 * f1}


def conlleval(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict[str, Any]:
    """Span precision/recall/F1 (percent) overall and per type, and token accuracy, over
    sentences of gold and predicted tags (conlleval's counts)."""
    counts: dict[str, list[int]] = {}  # type -> [correct, guessed, gold]
    tokens = right = 0
    for sentence, (gold_tags, pred_tags) in enumerate(zip(gold, predicted, strict=True)):
        if len(gold_tags) != len(pred_tags):
            raise ValueError(f"sentence {sentence}: {len(gold_tags)} gold, {len(pred_tags)} tags")
        tokens += len(gold_tags)
        right += sum(g == p for g, p in zip(gold_tags, pred_tags, strict=True))
        gold_chunks, pred_chunks = chunks(gold_tags), chunks(pred_tags)
        for index, group in enumerate((pred_chunks & gold_chunks, pred_chunks, gold_chunks)):
            for kind, _, _ in group:
                counts.setdefault(kind, [0, 0, 0])[index] += 1
    totals = [sum(c[i] for c in counts.values()) for i in range(3)]
    result: dict[str, Any] = _prf(*totals)
    result["accuracy"] = 100 * right / tokens if tokens else 0.0
    result["per_type"] = {kind: _prf(*counts[kind]) for kind in sorted(counts)}
    return result


# ------------------------------------------------------------------------------------------------
# Features
# ------------------------------------------------------------------------------------------------


def label_list(sentences: Sequence[Sentence]) -> tuple[str, ...]:
    """The training labels (IOB2 unless the data uses E-/S-), O first."""
    tags = {t for s in sentences for t in training_tags(s.tags)}
    return ("O", *sorted(tags - {"O"}))


def training_tags(tags: Sequence[str]) -> list[str]:
    if any(t[:2] in ("E-", "S-") for t in tags):
        return list(tags)
    return iob1_to_iob2(tags)


@dataclasses.dataclass
class NerFeatures:
    """Windows as arrays (input_ids/input_mask/segment_ids, labels and label_weights [N, L]) and
    where each labelled position's word is: `words[row]` lists (sentence, word, position)."""

    arrays: dict[str, np.ndarray]
    words: list[list[tuple[int, int, int]]]

    def __len__(self) -> int:
        return len(self.words)


def word_subtokens(tokenizer: Any, words: Sequence[str]) -> list[list[int]]:
    """Each word's sub-tokens as its sentence has them: a word alone for WordPiece and
    SentencePiece (which cut at spaces anyway); for byte-level BPE the sentence's text, where a
    word after the first carries its space mark (`HfBpeTokenizer.encode_words`)."""
    if getattr(tokenizer, "kind", "") == "bpe":
        return tokenizer.encode_words(words)
    return [tokenizer.encode(word, allow_special=False) for word in words]


def build_features(
    sentences: Sequence[Sentence],
    tokenizer: Any,
    labels: Sequence[str],
    max_seq_length: int,
    document_context: bool = False,
) -> NerFeatures:
    """Windows of every sentence (see the module docstring); unknown tags get label 0, weight 0."""
    budget = max_seq_length - 2
    if budget < 1:
        raise UserError(f"max_seq_length={max_seq_length} leaves no room for words")
    label_id = {label: i for i, label in enumerate(labels)}
    ids_rows, label_rows, weight_rows, words_rows = [], [], [], []
    by_document: dict[int, list[int]] = {}
    for index, sentence in enumerate(sentences):
        by_document.setdefault(sentence.document if document_context else index, []).append(index)
    for members in by_document.values():
        flat: list[int] = []  # the document's sub-tokens
        word_starts: dict[tuple[int, int], int] = {}  # (sentence, word) -> its first sub-token
        word_ends: dict[tuple[int, int], int] = {}
        for s in members:
            for w, pieces in enumerate(word_subtokens(tokenizer, sentences[s].words)):
                pieces = pieces or [tokenizer.unk_id]
                word_starts[(s, w)] = len(flat)
                flat += pieces
                word_ends[(s, w)] = len(flat)
        for s in members:
            sentence = sentences[s]
            tags = training_tags(sentence.tags)
            w = 0
            while w < len(sentence.words):
                first = w  # the words [first, w) that fit one window, at least one
                begin = word_starts[(s, first)]
                while w < len(sentence.words) and word_ends[(s, w)] - begin <= budget:
                    w += 1
                w = max(w, first + 1)
                end = min(word_ends[(s, w - 1)], begin + budget)
                left = right = 0
                if document_context:
                    extra = budget - (end - begin)
                    right = min(extra - min(extra // 2, begin), len(flat) - end)
                    left = min(extra - right, begin)
                window = flat[begin - left : end + right]
                ids_rows.append([tokenizer.cls_id, *window, tokenizer.sep_id])
                row_labels = np.zeros(max_seq_length, np.int32)
                row_weights = np.zeros(max_seq_length, np.float32)
                row_words = []
                for word in range(first, w):
                    position = word_starts[(s, word)] - (begin - left) + 1
                    if position >= max_seq_length - 1:
                        continue
                    row_words.append((s, word, position))
                    if tags[word] in label_id:
                        row_labels[position] = label_id[tags[word]]
                        row_weights[position] = 1.0
                label_rows.append(row_labels)
                weight_rows.append(row_weights)
                words_rows.append(row_words)
    count = len(ids_rows)
    input_ids = np.full((count, max_seq_length), tokenizer.pad_id, np.int32)
    input_mask = np.zeros((count, max_seq_length), np.int32)
    for row, tokens in enumerate(ids_rows):
        input_ids[row, : len(tokens)] = tokens
        input_mask[row, : len(tokens)] = 1
    arrays = {
        "input_ids": input_ids,
        "input_mask": input_mask,
        "segment_ids": np.zeros((count, max_seq_length), np.int32),
        "labels": np.stack(label_rows).reshape(count, max_seq_length),
        "label_weights": np.stack(weight_rows).reshape(count, max_seq_length),
    }
    return NerFeatures(arrays, words_rows)


def predicted_tags(
    sentences: Sequence[Sentence],
    features: NerFeatures,
    logits: np.ndarray,
    labels: Sequence[str],
    iob1: bool = False,
) -> list[list[str]]:
    """Each word's tag: the argmax at its first sub-token (O for a word no window reached); with
    `iob1`, written back in IOB1 like the gold files (the same entities, comparable tags)."""
    tags = [["O"] * len(s.words) for s in sentences]
    for row, placed in enumerate(features.words):
        for sentence, word, position in placed:
            tags[sentence][word] = labels[int(np.argmax(logits[row, position]))]
    return [iob2_to_iob1(t) for t in tags] if iob1 else tags


def conll_text(sentences: Sequence[Sentence], predicted: Sequence[Sequence[str]]) -> str:
    """conlleval's input format: `word gold predicted` per line, a blank line after a sentence."""
    lines = []
    for sentence, tags in zip(sentences, predicted, strict=True):
        lines += [
            f"{w} {g} {p}" for w, g, p in zip(sentence.words, sentence.tags, tags, strict=True)
        ]
        lines.append("")
    return "\n".join(lines) + "\n"
