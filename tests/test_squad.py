"""SQuAD: the official metrics against torchmetrics, windows and answers, bad files, and an
end-to-end fine-tuning of the converted all-MiniLM-L6-v2 weights that learns a synthetic task."""

from __future__ import annotations

import importlib
import json
import random

import jax
import numpy as np
import pytest
import transformers

from bert_jax import cli
from bert_jax.convert.between_formats import convert
from bert_jax.core import partitioning
from bert_jax.data.tokenizers.load_or_train import load_tokenizer
from bert_jax.finetune.runs import squad_and_conll as token_tasks
from bert_jax.finetune.tasks import squad, squad_answers
from bert_jax.finetune.tasks.squad import SquadDataError, SquadExample
from tests.glue_fixtures.tiny import tiny_pretrained
from tests.helpers import minilm_dir


def _torchmetrics_squad():
    """torchmetrics' SQuAD module (the package re-exports its `squad` function under the same
    name), imported by the tests that read it: about 3 CPU-s, which every test process that
    collects this file would pay."""
    return importlib.import_module("torchmetrics.functional.text.squad")


# (prediction, gold answers): articles, punctuation, case, whitespace, several gold answers,
# partial overlaps, repeated tokens, an empty prediction, non-ASCII punctuation.
CASES = [
    ("the Eiffel Tower", ["Eiffel Tower"]),
    ("U.S. Army", ["US army", "the United States Army"]),
    ("Denver  Broncos!", ["Denver Broncos", "Broncos"]),
    ("an apple a day", ["apple day"]),
    ("Carolina Panthers won", ["Panthers", "Carolina Panthers"]),
    ("1854", ["in 1854", "(1854)"]),
    ("", ["Santa Clara"]),
    ("a a b b", ["a b b c"]),
    ("São Paulo – Brazil", ["são paulo brazil", "Brazil"]),
    ("Theodore", ["The odore"]),
    ("nothing alike", ["Levi's Stadium"]),
]


def _tm_scores(prediction: str, golds: list[str]) -> tuple[float, float]:
    out = _torchmetrics_squad().squad(
        {"prediction_text": prediction, "id": "q"},
        {"answers": {"answer_start": [0] * len(golds), "text": golds}, "id": "q"},
    )
    return float(out["exact_match"]), float(out["f1"])


def _dataset(golds_by_id: dict[str, list[str]]) -> list[dict]:
    qas = [
        {"id": qid, "answers": [{"text": t, "answer_start": 0} for t in golds]}
        for qid, golds in golds_by_id.items()
    ]
    return [{"paragraphs": [{"qas": qas}]}]


def test_v1_metric_matches_torchmetrics():
    predictions = {f"q{i}": pred for i, (pred, _) in enumerate(CASES)}
    dataset = _dataset({f"q{i}": golds for i, (_, golds) in enumerate(CASES)})
    exact, f1s, _ = squad_answers.raw_scores(dataset, predictions, "v1.1")
    for i, (prediction, golds) in enumerate(CASES):
        tm_exact, tm_f1 = _tm_scores(prediction, golds)
        assert 100 * exact[f"q{i}"] == tm_exact, CASES[i]
        # torchmetrics computes in float32: equal to its resolution.
        assert 100 * f1s[f"q{i}"] == pytest.approx(tm_f1, abs=1e-4), CASES[i]
    ours = squad_answers.evaluate(dataset, predictions, "v1.1")
    theirs = _torchmetrics_squad().squad(
        [{"prediction_text": p, "id": f"q{i}"} for i, (p, _) in enumerate(CASES)],
        [
            {"answers": {"answer_start": [0], "text": g}, "id": f"q{i}"}
            for i, (_, g) in enumerate(CASES)
        ],
    )
    assert ours["exact_match"] == pytest.approx(float(theirs["exact_match"]), abs=1e-4)
    assert ours["f1"] == pytest.approx(float(theirs["f1"]), abs=1e-4)
    assert 0 < ours["exact_match"] < 100 and 0 < ours["f1"] < 100


def _official_v2(dataset, preds, na_probs, thresh):
    """The v2.0 script's flow written out on its own (no package ships it offline): gold answers
    normalising to nothing dropped, thresholding, HasAns/NoAns, the best-threshold sweep."""
    tm_squad = _torchmetrics_squad()
    has_ans, exact, f1s = {}, {}, {}
    for qa in dataset[0]["paragraphs"][0]["qas"]:
        qid = qa["id"]
        has_ans[qid] = bool(qa["answers"])
        golds = [a["text"] for a in qa["answers"] if tm_squad._normalize_text(a["text"])] or [""]
        exact[qid] = max(
            int(tm_squad._normalize_text(g) == tm_squad._normalize_text(preds[qid])) for g in golds
        )
        f1s[qid] = max(float(tm_squad._compute_f1_score(preds[qid], g)) for g in golds)

    def apply(scores):
        return {q: float(not has_ans[q]) if na_probs[q] > thresh else s for q, s in scores.items()}

    def make(scores, qids):
        return 100.0 * sum(scores[q] for q in qids) / len(qids)

    out = {"total": len(exact)}
    e, f = apply(exact), apply(f1s)
    out["exact"], out["f1"] = make(e, list(e)), make(f, list(f))
    for name, want in (("HasAns", True), ("NoAns", False)):
        qids = [q for q in has_ans if has_ans[q] == want]
        out[f"{name}_exact"], out[f"{name}_f1"], out[f"{name}_total"] = (
            make(e, qids),
            make(f, qids),
            len(qids),
        )
    for name, scores in (("exact", exact), ("f1", f1s)):
        cur = best = sum(not v for v in has_ans.values())
        best_t = 0.0
        for q in sorted(na_probs, key=lambda k: na_probs[k]):
            cur += scores[q] if has_ans[q] else (-1 if preds[q] else 0)
            if cur > best:
                best, best_t = cur, na_probs[q]
        out[f"best_{name}"], out[f"best_{name}_thresh"] = 100.0 * best / len(scores), best_t
    return out


def test_v2_metric_no_answers_thresholds_and_best_threshold():
    golds = {f"q{i}": g for i, (_, g) in enumerate(CASES)}
    preds = {f"q{i}": p for i, (p, _) in enumerate(CASES)}
    golds.update(n0=[], n1=[], n2=[], n3=["the"])  # unanswerable; one gold normalises to ""
    preds.update(n0="", n1="Denver", n2="", n3="")
    odds = {
        q: float(v)
        for q, v in zip(
            preds, [0.5, -2.0, 3.0, 0.5, 1.5, -1.0, 2.5, 0.0, 4.0, -3.0, 1.0, 2.0, -0.5, 5.0, 0.7]
        )
    }
    dataset = _dataset(golds)
    # Unanswerable questions: the per-question scores agree with torchmetrics' empty-target rule.
    exact, f1s, has_answer = squad_answers.raw_scores(dataset, preds, "v2.0")
    for qid in ("n0", "n1", "n2"):
        assert 100 * exact[qid] == _tm_scores(preds[qid], [""])[0]
        assert 100 * f1s[qid] == pytest.approx(_tm_scores(preds[qid], [""])[1])
    assert has_answer["n3"] and not has_answer["n0"]
    for thresh in (1.0, 0.0, 2.2):
        ours = squad_answers.evaluate(dataset, preds, "v2.0", odds, na_prob_thresh=thresh)
        reference = _official_v2(dataset, preds, odds, thresh)
        assert ours.keys() == reference.keys()
        for key, value in reference.items():
            assert ours[key] == pytest.approx(value, abs=1e-5), key
    plain = squad_answers.evaluate(dataset, preds, "v2.0")
    assert "best_f1" not in plain and plain["NoAns_total"] == 3


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(f"{minilm_dir()}/vocab.txt")


def test_subtoken_character_spans_match_the_reference_offsets(tokenizer):
    text = "The Résumé of  São Paulo (1854) isn't \"great\"; 東京 unaffable-ish. Levi's  Stadium"
    ids, starts, ends = squad.subtokens(tokenizer, text)
    reference = transformers.BertTokenizer(f"{minilm_dir()}/vocab.txt", do_lower_case=True)
    encoded = reference(text, add_special_tokens=False, return_offsets_mapping=True)
    assert ids == encoded["input_ids"] == tokenizer.encode(text, allow_special=False)
    assert list(zip(starts.tolist(), ends.tolist())) == [
        tuple(o) for o in encoded["offset_mapping"]
    ]


def test_windows_follow_the_stride_and_the_max_context_rule(tokenizer):
    context = " ".join(f"word{i} is number {i}." for i in range(30))
    answer = "number 17"
    example = SquadExample("q", "which number?", context, ((answer, context.index(answer)),))
    features = squad.build_features([example], tokenizer, 32, 8, 8)
    targets = squad.build_features([example], tokenizer, 32, 8, 8, training=True)
    assert targets.char_start.shape == (len(targets), 0)  # not kept for training
    assert np.array_equal(targets.arrays["input_ids"], features.arrays["input_ids"])
    ids, starts, ends = squad.subtokens(tokenizer, context)
    query = len(tokenizer.encode("which number?"))
    spans = squad.window_starts(len(ids), 32 - query - 3, 8)
    assert len(features) == len(spans) > 3
    assert [s for s, _ in spans] == list(range(0, 8 * len(spans), 8))
    owner = {}
    for row, (start, length) in enumerate(spans):
        offset = query + 2
        assert (
            features.arrays["input_ids"][row, offset : offset + length].tolist()
            == ids[start : start + length]
        )
        for k in np.nonzero(features.max_context[row])[0]:
            assert (k - offset + start) not in owner
            owner[k - offset + start] = row
        # Brute force: each token's owner window maximises min(left, right) + 0.01 x length.
    for token, row in owner.items():
        scores = [
            min(token - s, s + n - 1 - token) + 0.01 * n if s <= token < s + n else -1
            for s, n in spans
        ]
        assert row == int(np.argmax(scores))
    assert sorted(owner) == list(range(len(ids)))
    hits = 0
    for row in range(len(features)):
        s, e = targets.arrays["start_positions"][row], targets.arrays["end_positions"][row]
        if s:
            hits += 1
            assert context[features.char_start[row, s] : features.char_end[row, e]] == answer
        else:
            assert e == 0
    assert hits >= 1


def test_answers_respect_max_context_length_and_null_threshold(tokenizer):
    context = "In  São Paulo, the Résumé (1854) was  written by Ana."
    example = SquadExample("q1", "where?", context, (("São Paulo", 4),))
    features = squad.build_features([example], tokenizer, 64, 16, 16)
    offset = len(tokenizer.encode("where?")) + 2
    char_start = features.char_start[0]
    position = {context[char_start[i] :]: i for i in range(offset, 64) if char_start[i] >= 0}

    def at(prefix):
        return next(i for text, i in position.items() if text.startswith(prefix))

    logits = np.zeros((1, 64, 2), np.float32)
    logits[0, at("São"), 0] = 5.0
    logits[0, at("Paulo"), 1] = 5.0
    logits[0, at("1854"), 0] = 4.0
    logits[0, at("1854"), 1] = 4.5
    logits[0, 0] = [3.0, 3.0]  # the null score 6.0
    found = squad_answers.answers_from_logits([example], features, logits, "v1.1", n_best_size=3)
    assert found.predictions == {"q1": "São Paulo"}  # the original's spacing and accents
    assert [e["text"] for e in found.nbest["q1"]][:2] == [
        "São Paulo",
        "São Paulo, the Résumé (1854",
    ]
    short = squad_answers.answers_from_logits(
        [example], features, logits, "v1.1", max_answer_length=1
    )
    assert short.predictions == {"q1": "1854"}
    v2 = squad_answers.answers_from_logits([example], features, logits, "v2.0")
    assert v2.null_odds["q1"] == pytest.approx(6.0 - 10.0) and v2.predictions["q1"] == "São Paulo"
    strict = squad_answers.answers_from_logits(
        [example], features, logits, "v2.0", null_score_diff_threshold=-5.0
    )
    assert (
        strict.predictions["q1"] == ""
        and abs(sum(e["probability"] for e in strict.nbest["q1"]) - 1) < 1e-9
    )


@pytest.mark.parametrize(
    "payload, message",
    [
        ({"version": "1.1"}, "the file has no 'data'"),
        (
            {
                "data": [
                    {"paragraphs": [{"context": "abc", "qas": [{"id": "x7", "question": "?"}]}]}
                ]
            },
            "data[0].paragraphs[0].qas[0] (id x7) has no 'answers'",
        ),
        (
            {
                "data": [
                    {
                        "paragraphs": [
                            {
                                "context": "abc",
                                "qas": [
                                    {
                                        "id": "x8",
                                        "question": "?",
                                        "answers": [{"text": "bc", "answer_start": 9}],
                                    }
                                ],
                            }
                        ]
                    }
                ]
            },
            "(id x8).answers[0] starts at 9, outside its context of 3 characters",
        ),
        (
            {
                "data": [
                    {
                        "paragraphs": [
                            {
                                "context": "abc",
                                "qas": [
                                    {
                                        "id": "x9",
                                        "question": "?",
                                        "answers": [{"text": "b", "answer_start": "1"}],
                                    }
                                ],
                            }
                        ]
                    }
                ]
            },
            "answer_start is str, not int",
        ),
    ],
)
def test_bad_files_are_one_line_naming_file_and_record(tmp_path, payload, message):
    path = tmp_path / "train-v1.1.json"
    path.write_text(json.dumps(payload), encoding="utf-8")
    with pytest.raises(SquadDataError) as error:
        squad.read_json(str(path))
    text = str(error.value)
    assert "\n" not in text and str(path) in text and message in text


def test_unreadable_json_and_unprepared_tfds_are_one_line(tmp_path):
    path = tmp_path / "dev-v2.0.json"
    path.write_text('{"data": [', encoding="utf-8")
    with pytest.raises(SquadDataError, match=f"^{path}: not valid UTF-8 JSON"):
        squad.read_json(str(path))
    with pytest.raises(SquadDataError, match=r"^tfds squad/v2.0 is not prepared in .*tfds build"):
        squad.read_tfds("v2.0", "validation", str(tmp_path / "tfds"))


def test_tfds_records_become_examples():
    """Records as TFDS `squad/v2.0` yields them (NumPy bytes; the keys of its feature spec)."""
    import tensorflow_datasets as tfds

    features = tfds.builder("squad/v2.0", data_dir="/nonexistent").info.features
    answerable = {
        "id": b"q1",
        "title": b"T",
        "question": b"Where?",
        "context": "In São Paulo.".encode(),
        "is_impossible": False,
        "answers": {
            "text": np.array(["São Paulo".encode()], dtype=object),
            "answer_start": np.array([3], np.int32),
        },
        "plausible_answers": {
            "text": np.array([], dtype=object),
            "answer_start": np.array([], np.int32),
        },
    }
    assert set(answerable) == set(features)
    impossible = dict(
        answerable,
        id=b"q2",
        is_impossible=True,
        answers={"text": np.array([], dtype=object), "answer_start": np.array([], np.int32)},
    )
    assert squad.example_from_tfds(answerable) == SquadExample(
        "q1", "Where?", "In São Paulo.", (("São Paulo", 3),), False
    )
    assert squad.example_from_tfds(impossible).is_impossible
    broken = dict(
        answerable,
        answers={"text": answerable["answers"]["text"], "answer_start": np.array([3, 4], np.int32)},
    )
    with pytest.raises(SquadDataError, match="^tfds squad record q1: 1 answer texts, 2 starts$"):
        squad.example_from_tfds(broken)


# ------------------------------------------------------------------------------------------------
# End to end: the converted MiniLM weights learn to answer a synthetic question set
# ------------------------------------------------------------------------------------------------

FACTS = {
    "color": ["red", "blue", "green", "yellow", "purple", "orange"],
    "city": ["paris", "london", "tokyo", "madrid", "cairo", "lima"],
    "animal": ["dog", "cat", "horse", "tiger", "rabbit", "eagle"],
    "fruit": ["apple", "banana", "cherry", "mango", "lemon", "peach"],
}


def synthetic_squad(count: int, seed: int) -> tuple[dict, list[int]]:
    """Contexts of four facts in random order ("my color is red."); a question names one kind, so
    where its answer stands is random: only reading the question finds it. Also returns each
    answer's fact slot, for the position baseline."""
    rng = random.Random(seed)
    paragraphs, slots = [], []
    for index in range(count):
        kinds = list(FACTS)
        rng.shuffle(kinds)
        values = {kind: rng.choice(FACTS[kind]) for kind in kinds}
        context = " ".join(f"my {kind} is {values[kind]}." for kind in kinds)
        asked = rng.choice(kinds)
        slots.append(kinds.index(asked))
        answer = values[asked]
        start = context.index(f"my {asked} is {answer}") + len(f"my {asked} is ")
        qa = {
            "id": f"s{seed}-{index}",
            "question": f"what is my {asked}?",
            "answers": [{"text": answer, "answer_start": start}],
        }
        paragraphs.append({"context": context, "qas": [qa]})
    return {"version": "1.1", "data": [{"title": "synthetic", "paragraphs": paragraphs}]}, slots


@pytest.fixture(scope="module")
def minilm_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("minilm_squad")
    convert("hf", minilm_dir(), "bert-jax", root / "model")
    return root / "model"


@pytest.mark.slow
def test_minilm_learns_synthetic_squad_end_to_end(minilm_model, tmp_path):
    data = tmp_path / "squad"
    data.mkdir()
    train, _ = synthetic_squad(64, seed=1)
    dev, slots = synthetic_squad(32, seed=2)
    (data / "train-v1.1.json").write_text(json.dumps(train), encoding="utf-8")
    (data / "dev-v1.1.json").write_text(json.dumps(dev), encoding="utf-8")
    workdir = tmp_path / "run"
    settings = token_tasks.task_settings(
        "squad/v1.1",
        # Without dropout the few steps a test can afford suffice (with 0.1: EM 56 after 24).
        dict(
            max_seq_length=24,
            batch_size=8,
            eval_batch_size=32,
            epochs=1.5,
            learning_rate=2e-4,
            dropout=0.0,
        ),
    )
    options = token_tasks.SpanOptions(doc_stride=8, max_query_length=8)
    # One device: the emulated eight would replicate every update eight times on two cores.
    mesh = partitioning.make_mesh((1, 1, 1), jax.devices()[:1])
    result = token_tasks.run_token_task(
        str(minilm_model), "squad/v1.1", str(data), str(workdir), settings, options, mesh=mesh
    )
    on_disk = json.loads((workdir / "result.json").read_text())
    predictions = json.loads((workdir / "predictions.json").read_text())
    assert on_disk["dev_metrics"] == result["dev_metrics"]
    # Two windows per context (24 positions, stride 8): the max-context rule is exercised.
    assert result["num_train_features"] == 2 * result["num_train_examples"] == 128
    examples, _ = squad.read_json(str(data / "dev-v1.1.json"))
    assert set(predictions) == {e.qid for e in examples}
    # The position baseline: always the value in the most common answer slot.
    best_slot = max(range(len(FACTS)), key=slots.count)
    baseline = {e.qid: e.context.split(".")[best_slot].split()[-1] for e in examples}
    dataset = squad.as_dataset(examples)
    baseline_em = squad_answers.evaluate(dataset, baseline, "v1.1")["exact_match"]
    ours = squad_answers.evaluate(dataset, predictions, "v1.1")
    assert ours == pytest.approx(result["dev_metrics"])
    print(
        f"synthetic SQuAD dev EM {ours['exact_match']:.1f} F1 {ours['f1']:.1f}, position "
        f"baseline EM {baseline_em:.1f}; {result['num_train_steps']} steps {result['seconds']:.1f}s"
    )
    assert ours["exact_match"] > baseline_em + 30
    markdown = (workdir / "results.md").read_text()
    assert "| this run |" in markdown and "| BERT-Large (paper, dev) | 84.1 | 90.9 |" in markdown


def test_v2_run_writes_the_official_files_with_a_tiny_encoder(tmp_path):
    """SQuAD v2.0 through the whole run with a tiny random encoder: predictions.json and
    null_odds.json cover every question, and the official figures recomputed from those files
    equal result.json's."""
    encoder = tiny_pretrained()
    words = [t for t in encoder.tokenizer.vocab[120:] if t.isalpha() and len(t) > 3][:12]
    rng = random.Random(0)
    paragraphs = []
    for index in range(24):
        context = " ".join(rng.choice(words) for _ in range(14)) + "."
        answer = context.split()[3]
        qa = {
            "id": f"v2-{index}",
            "question": f"where is {words[index % 3]}?",
            "answers": [],
            "is_impossible": index % 3 == 0,
        }
        if index % 3:
            qa["answers"] = [{"text": answer, "answer_start": context.index(answer)}]
        paragraphs.append({"context": context, "qas": [qa]})
    data = tmp_path / "squad"
    data.mkdir()
    payload = json.dumps({"version": "v2.0", "data": [{"title": "t", "paragraphs": paragraphs}]})
    (data / "train-v2.0.json").write_text(payload, encoding="utf-8")
    (data / "dev-v2.0.json").write_text(payload, encoding="utf-8")
    settings = token_tasks.task_settings(
        "squad/v2.0", dict(max_seq_length=16, batch_size=8, eval_batch_size=8, epochs=1.0)
    )
    options = token_tasks.SpanOptions(doc_stride=4, max_query_length=6)
    mesh = partitioning.make_mesh((1, 1, 1), jax.devices()[:1])
    workdir = tmp_path / "run"
    result = token_tasks.run_token_task(
        encoder, "squad/v2.0", str(data), str(workdir), settings, options, mesh=mesh
    )
    predictions = json.loads((workdir / "predictions.json").read_text())
    null_odds = json.loads((workdir / "null_odds.json").read_text())
    assert set(predictions) == set(null_odds) == {f"v2-{i}" for i in range(24)}
    assert (workdir / "nbest_predictions.json").exists()
    dataset = json.loads(payload)["data"]
    again = squad_answers.evaluate(dataset, predictions, "v2.0", null_odds, na_prob_thresh=0.0)
    assert again == pytest.approx(result["dev_metrics"])
    assert result["dev_metrics"]["NoAns_total"] == 8 and result["dev_metrics"]["HasAns_total"] == 16
    assert "best_f1_thresh" in result["dev_metrics"]
    assert (workdir / "plots" / "squad-v2.0.png").stat().st_size > 1000
    assert "| BERT-Large (paper, test) | 80.0 | 83.1 |" in (workdir / "results.md").read_text()


def test_the_command_names_a_bad_squad_file_in_one_line(minilm_model, tmp_path, capsys):
    data = tmp_path / "squad"
    data.mkdir()
    (data / "train-v2.0.json").write_text('{"data": []}', encoding="utf-8")
    (data / "dev-v2.0.json").write_text("{}", encoding="utf-8")
    workdir = tmp_path / "run"
    code = cli.main(
        [
            "finetune",
            "--model",
            str(minilm_model),
            "--task",
            "squad/v2.0",
            "--data",
            str(data),
            "--workdir",
            str(workdir),
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert f"{data / 'train-v2.0.json'}: no questions" in err
    assert not workdir.exists()
