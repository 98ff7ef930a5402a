"""SQuAD answers from start/end logits, and the official v1.1/v2.0 EM and F1 (incl. thresholds).

Post-processing (run_squad's `write_predictions`): per window the `n_best_size` highest start and
end logits; a candidate span must lie in the context, start in its sub-token's max-context window,
not end before it starts and be at most `max_answer_length` sub-tokens long; candidates of all
windows are ranked by start + end logit, the answer text is the slice of the original context
(duplicates dropped) and the n-best list gets softmax probabilities. For v2.0 the null score is the
lowest [CLS] start + end logit over the question's windows; `null_odds` = null score - best
non-null score, and the prediction is "" when it exceeds `null_score_diff_threshold`.

Metrics (the official evaluation scripts): answers normalised by lower-casing, removing
punctuation, the articles a/an/the and extra whitespace; EM and token-overlap F1, the maximum over
gold answers, in percent. v2.0 also: gold answers that normalise to nothing are dropped (none
left: the gold answer is ""); with `null_odds`, a question counts as predicted unanswerable when its
odds exceed `na_prob_thresh`; HasAns_/NoAns_ figures; best_exact/best_f1 and their thresholds.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import string
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bert_jax.finetune.tasks.squad import SquadExample, SquadFeatures

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (the official scripts' order)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(gold: str, prediction: str) -> int:
    return int(normalize_answer(gold) == normalize_answer(prediction))


def f1(gold: str, prediction: str) -> float:
    gold_tokens = normalize_answer(gold).split()
    pred_tokens = normalize_answer(prediction).split()
    if not gold_tokens or not pred_tokens:
        # v2.0: no-answer against no-answer is right, against anything else wrong.
        return float(gold_tokens == pred_tokens)
    common = collections.Counter(gold_tokens) & collections.Counter(pred_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def gold_answers(qa: Mapping[str, Any], version: str) -> list[str]:
    texts = [answer["text"] for answer in qa["answers"]]
    if version == "v1.1":
        return texts
    return [t for t in texts if normalize_answer(t)] or [""]


def raw_scores(
    dataset: Sequence[Mapping[str, Any]], predictions: Mapping[str, str], version: str
) -> tuple[dict[str, float], dict[str, float], dict[str, bool]]:
    """Per question: EM, F1 (max over gold answers) and whether it has an answer."""
    exact, f1s, has_answer = {}, {}, {}
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                qid = qa["id"]
                golds = gold_answers(qa, version)
                has_answer[qid] = bool(qa["answers"])
                if qid not in predictions:
                    raise ValueError(f"no prediction for question {qid}")
                prediction = predictions[qid]
                exact[qid] = float(max(exact_match(g, prediction) for g in golds))
                f1s[qid] = max(f1(g, prediction) for g in golds)
    return exact, f1s, has_answer


def _percent(scores: Mapping[str, float], qids: Sequence[str]) -> float:
    return 100.0 * sum(scores[q] for q in qids) / len(qids)


def best_threshold(
    predictions: Mapping[str, str],
    scores: Mapping[str, float],
    null_odds: Mapping[str, float],
    has_answer: Mapping[str, bool],
) -> tuple[float, float]:
    """The official v2.0 sweep: the best score over no-answer thresholds, and that threshold."""
    score = best = sum(1 for q in has_answer if not has_answer[q])
    threshold = 0.0
    for qid in sorted(null_odds, key=lambda q: null_odds[q]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            score += scores[qid]
        elif predictions[qid]:
            score -= 1
        if score > best:
            best, threshold = score, null_odds[qid]
    return 100.0 * best / len(scores), threshold


def evaluate(
    dataset: Sequence[Mapping[str, Any]],
    predictions: Mapping[str, str],
    version: str,
    null_odds: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> dict[str, float]:
    """The official script's figures: exact_match/f1 (v1.1); exact/f1/total, HasAns_*, NoAns_*
    and with `null_odds` best_exact(_thresh)/best_f1(_thresh) (v2.0)."""
    exact, f1s, has_answer = raw_scores(dataset, predictions, version)
    qids = list(exact)
    if version == "v1.1":
        return {"exact_match": _percent(exact, qids), "f1": _percent(f1s, qids)}
    odds = null_odds if null_odds is not None else dict.fromkeys(qids, 0.0)

    def thresholded(scores: Mapping[str, float]) -> dict[str, float]:
        return {
            q: float(not has_answer[q]) if odds[q] > na_prob_thresh else s
            for q, s in scores.items()
        }

    exact_t, f1_t = thresholded(exact), thresholded(f1s)
    result: dict[str, float] = {
        "exact": _percent(exact_t, qids),
        "f1": _percent(f1_t, qids),
        "total": len(qids),
    }
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        subset = [q for q in qids if has_answer[q] == wanted]
        if subset:
            result[f"{prefix}_exact"] = _percent(exact_t, subset)
            result[f"{prefix}_f1"] = _percent(f1_t, subset)
            result[f"{prefix}_total"] = len(subset)
    if null_odds is not None:
        result["best_exact"], result["best_exact_thresh"] = best_threshold(
            predictions, exact, odds, has_answer
        )
        result["best_f1"], result["best_f1_thresh"] = best_threshold(
            predictions, f1s, odds, has_answer
        )
    return result


# ------------------------------------------------------------------------------------------------
# Logits to answers
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Answers:
    """predictions.json, null_odds.json (v2.0; else empty) and nbest_predictions.json contents."""

    predictions: dict[str, str]
    null_odds: dict[str, float]
    nbest: dict[str, list[dict[str, Any]]]


def _top(values: np.ndarray, count: int) -> list[int]:
    return [int(i) for i in np.argsort(-values, kind="stable")[:count]]


def answers_from_logits(
    examples: Sequence[SquadExample],
    features: SquadFeatures,
    logits: np.ndarray,
    version: str,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    null_score_diff_threshold: float = 0.0,
) -> Answers:
    """Answers from `logits` [windows, length, 2] (start, end); see the module docstring."""
    by_example: dict[int, list[int]] = collections.defaultdict(list)
    for row, index in enumerate(features.example_index):
        by_example[int(index)].append(row)
    predictions, null_odds, nbest = {}, {}, {}
    for index, example in enumerate(examples):
        candidates = []  # (score, start logit, end logit, char start, char end)
        null = None  # (score, start logit, end logit)
        for row in by_example.get(index, []):
            start_logits, end_logits = logits[row, :, 0], logits[row, :, 1]
            if null is None or start_logits[0] + end_logits[0] < null[0]:
                null = (float(start_logits[0] + end_logits[0]), start_logits[0], end_logits[0])
            in_context = features.char_start[row] >= 0
            for start in _top(start_logits, n_best_size):
                if not in_context[start] or not features.max_context[row, start]:
                    continue
                for end in _top(end_logits, n_best_size):
                    if not in_context[end] or end < start or end - start + 1 > max_answer_length:
                        continue
                    score = float(start_logits[start] + end_logits[end])
                    spans = (int(features.char_start[row, start]), int(features.char_end[row, end]))
                    candidates.append((score, start_logits[start], end_logits[end], *spans))
        if version == "v2.0" and null is not None:
            candidates.append((null[0], null[1], null[2], -1, -1))
        candidates.sort(key=lambda c: c[0], reverse=True)
        entries, seen = [], set()
        for _, start_logit, end_logit, begin, end in candidates:
            if len(entries) >= n_best_size:
                break
            text = example.context[begin:end] if begin >= 0 else ""
            if text in seen:
                continue
            seen.add(text)
            entries.append(
                {"text": text, "start_logit": float(start_logit), "end_logit": float(end_logit)}
            )
        if version == "v2.0" and null is not None and "" not in seen:
            entries.append({"text": "", "start_logit": float(null[1]), "end_logit": float(null[2])})
        if not entries:
            entries.append({"text": "empty", "start_logit": 0.0, "end_logit": 0.0})
        totals = np.asarray([e["start_logit"] + e["end_logit"] for e in entries], np.float64)
        probabilities = np.exp(totals - totals.max())
        probabilities /= probabilities.sum()
        for entry, probability in zip(entries, probabilities, strict=True):
            entry["probability"] = float(probability)
        nbest[example.qid] = entries
        best_non_null = next((e for e in entries if e["text"]), None)
        if version == "v1.1":
            predictions[example.qid] = entries[0]["text"]
            continue
        if best_non_null is None:
            # No span at all: certainly unanswerable (the largest float keeps the JSON strict).
            null_odds[example.qid] = sys.float_info.max
            predictions[example.qid] = ""
            continue
        best_score = best_non_null["start_logit"] + best_non_null["end_logit"]
        odds = (null[0] if null is not None else -np.inf) - best_score
        null_odds[example.qid] = float(odds)
        predictions[example.qid] = "" if odds > null_score_diff_threshold else best_non_null["text"]
    return Answers(predictions, null_odds, nbest)
