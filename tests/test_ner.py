"""CoNLL-2003 NER: conlleval's span scores against seqeval (IOB1 and IOB2), the column reader,
first-sub-token features, and an end-to-end run of a tiny encoder learning a synthetic tagging."""

from __future__ import annotations

import json
import random

import jax
import numpy as np
import pytest
import seqeval.metrics

from bert_jax.core import partitioning
from bert_jax.data.tokenizers.load_or_train import load_tokenizer
from bert_jax.finetune.runs import squad_and_conll as token_tasks
from bert_jax.finetune.tasks import conll as ner
from bert_jax.finetune.tasks.conll import NerDataError, Sentence
from tests.glue_fixtures.tiny import tiny_pretrained
from tests.helpers import minilm_dir

TYPES = ("PER", "LOC", "ORG", "MISC")


def _random_tags(rng: random.Random, length: int, scheme: str) -> list[str]:
    """Valid IOB1/IOB2 sequences of entities, or (scheme "any") arbitrary tags, I- after O too."""
    if scheme == "any":
        return [
            rng.choice(["O", "O", *(f"{p}-{t}" for p in "BI" for t in TYPES)])
            for _ in range(length)
        ]
    tags: list[str] = []
    while len(tags) < length:
        if rng.random() < 0.5:
            tags.append("O")
            continue
        kind = rng.choice(TYPES)
        size = rng.randint(1, 3)
        previous = tags[-1][2:] if tags and tags[-1] != "O" else None
        if scheme == "iob2":
            first = "B"
        else:  # IOB1: B- only when the entity follows one of the same type
            first = "B" if previous == kind else "I"
        tags += [f"{first}-{kind}"] + [f"I-{kind}"] * (size - 1)
    return tags[:length]


@pytest.mark.parametrize("scheme", ["iob1", "iob2", "any"])
def test_conlleval_matches_seqeval(scheme):
    rng = random.Random(7)
    gold = [_random_tags(rng, rng.randint(1, 12), scheme) for _ in range(150)]
    predicted = [
        [
            t
            if rng.random() < 0.7
            else rng.choice(["O", *(f"{p}-{k}" for p in "BI" for k in TYPES)])
            for t in sentence
        ]
        for sentence in gold
    ]
    ours = ner.conlleval(gold, predicted)
    assert 20 < ours["f1"] < 95  # a fixture with both hits and misses
    assert ours["precision"] == pytest.approx(
        100 * seqeval.metrics.precision_score(gold, predicted), abs=1e-12
    )
    assert ours["recall"] == pytest.approx(
        100 * seqeval.metrics.recall_score(gold, predicted), abs=1e-12
    )
    assert ours["f1"] == pytest.approx(100 * seqeval.metrics.f1_score(gold, predicted), abs=1e-12)
    assert ours["accuracy"] == pytest.approx(
        100 * seqeval.metrics.accuracy_score(gold, predicted), abs=1e-12
    )
    report = seqeval.metrics.classification_report(gold, predicted, output_dict=True)
    for kind, scores in ours["per_type"].items():
        if kind in report:
            assert scores["f1"] == pytest.approx(100 * report[kind]["f1-score"], abs=1e-12)
            assert scores["precision"] == pytest.approx(100 * report[kind]["precision"], abs=1e-12)
    if scheme == "iob1":
        # IOB1 -> IOB2 names the same entities, and seqeval's strict IOB2 reads them alike.
        converted = [ner.iob1_to_iob2(s) for s in gold]
        assert [ner.chunks(s) for s in gold] == [ner.chunks(s) for s in converted]
        assert any(s != c for s, c in zip(gold, converted))
        assert [ner.iob2_to_iob1(c) for c in converted] == gold
        strict = seqeval.metrics.f1_score(
            converted, converted, mode="strict", scheme=seqeval.scheme.IOB2
        )
        assert strict == 1.0


def test_chunks_follow_conlleval_on_hand_cases():
    assert ner.chunks(["I-PER", "I-PER", "B-PER", "O", "I-LOC"]) == {
        ("PER", 0, 1),
        ("PER", 2, 2),
        ("LOC", 4, 4),
    }
    # A type change starts a new entity; I- after O starts one (an invalid IOB2 prediction).
    assert ner.chunks(["B-ORG", "I-LOC", "O", "I-MISC", "I-MISC"]) == {
        ("ORG", 0, 0),
        ("LOC", 1, 1),
        ("MISC", 3, 4),
    }
    assert ner.iob1_to_iob2(["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG"]) == [
        "B-PER",
        "I-PER",
        "B-PER",
        "O",
        "B-LOC",
        "B-ORG",
    ]


CONLL_TEXT = """-DOCSTART- -X- -X- O

EU NNP B-NP I-ORG
rejects VBZ B-VP O
German JJ B-NP I-MISC
call NN I-NP O
. . O O

Peter NNP B-NP I-PER
Blackburn NNP I-NP I-PER

-DOCSTART- -X- -X- O

BRUSSELS NNP B-NP I-LOC
1996-08-22 CD I-NP O
"""


def test_reader_keeps_sentences_documents_and_tags(tmp_path):
    path = tmp_path / "eng.train"
    path.write_text(CONLL_TEXT, encoding="utf-8")
    sentences = ner.read_conll(str(path))
    assert [s.words for s in sentences] == [
        ("EU", "rejects", "German", "call", "."),
        ("Peter", "Blackburn"),
        ("BRUSSELS", "1996-08-22"),
    ]
    assert [s.document for s in sentences] == [0, 0, 1]
    assert sentences[1].tags == ("I-PER", "I-PER")
    assert ner.label_list(sentences) == ("O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-PER")


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "EU NNP B-NP I-ORG\nrejects VBZ O\n",
            ":2: expected 4 columns (as on the file's first line), found 3",
        ),
        ("EU NNP B-NP I-ORG\ncall NN I-NP X-ORG\n", ":2: tag 'X-ORG' is not O or B-/I-/E-/S-"),
        ("EU\n", ":1: expected a word and a tag"),
        ("\n\n", ": no sentences"),
    ],
)
def test_bad_lines_are_one_line_naming_file_and_line(tmp_path, text, message):
    path = tmp_path / "train.txt"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(NerDataError) as error:
        ner.read_conll(str(path))
    assert str(error.value).startswith(str(path)) and message in str(error.value)
    assert "\n" not in str(error.value)


def test_missing_files_and_unprepared_tfds_are_one_line(tmp_path):
    (tmp_path / "train.txt").write_text(CONLL_TEXT, encoding="utf-8")
    with pytest.raises(
        NerDataError, match=r"no CoNLL-2003 dev file \(eng.testa or valid.txt or dev.txt\)"
    ):
        ner.check_files(str(tmp_path))
    with pytest.raises(
        NerDataError, match=r"^tfds conll2003 is not prepared in .*tfds build conll2003"
    ):
        ner.read_tfds("train", str(tmp_path / "tfds"))


def test_tfds_records_become_sentences_with_the_datasets_tag_names():
    import tensorflow_datasets as tfds

    names = tfds.builder("conll2003", data_dir="/nonexistent").info.features["ner"].feature.names
    record = {
        "tokens": np.array([b"EU", b"rejects", b"German", b"call"], dtype=object),
        "ner": np.array([names.index("B-ORG"), 0, names.index("B-MISC"), 0]),
    }
    sentence = ner.sentence_from_tfds(record, names, 5)
    assert sentence == Sentence(
        ("EU", "rejects", "German", "call"), ("B-ORG", "O", "B-MISC", "O"), 5
    )
    record["ner"] = record["ner"][:3]
    with pytest.raises(NerDataError, match="^tfds conll2003 record 5: 4 tokens, 3 tags$"):
        ner.sentence_from_tfds(record, names, 5)


def test_first_sub_token_labels_windows_and_document_context():
    tokenizer = load_tokenizer(f"{minilm_dir()}/vocab.txt")
    words = ("Sheriff", "Blackburnshire", "visited", "Kuala", "Lumpur", "yesterday", ".")
    tags = ("O", "I-PER", "O", "I-LOC", "I-LOC", "O", "O")
    sentences = [
        Sentence(("Before", "that", "."), ("O", "O", "O"), 0),
        Sentence(words, tags, 0),
        Sentence(("After", "this", "."), ("O", "O", "O"), 0),
    ]
    labels = ner.label_list(sentences)
    pieces = [tokenizer.encode(w) for w in words]
    assert max(map(len, pieces)) > 1  # an entity word split across sub-tokens
    # Windows of 8 positions: the sentence is cut at word boundaries, each word labelled once.
    features = ner.build_features(sentences[1:2], tokenizer, labels, max_seq_length=8)
    placed = [(s, w) for row in features.words for s, w, _ in row]
    assert sorted(placed) == [(0, w) for w in range(len(words))] and len(features) > 1
    for row, entries in enumerate(features.words):
        weights = features.arrays["label_weights"][row]
        assert sorted(np.nonzero(weights)[0].tolist()) == sorted(p for _, _, p in entries)
        for _, word, position in entries:
            assert features.arrays["input_ids"][row, position] == pieces[word][0]
            assert labels[features.arrays["labels"][row, position]] == ner.iob1_to_iob2(tags)[word]
    # Word predictions come from the first sub-token only.
    logits = np.zeros((len(features), 8, len(labels)), np.float32)
    logits[..., 0] = 1.0
    for row, entries in enumerate(features.words):
        for _, word, position in entries:
            if word == 1:
                logits[row, position, labels.index("B-PER")] = 5.0
                logits[row, position + 1, labels.index("B-LOC")] = 9.0  # a later sub-token
    predicted = ner.predicted_tags(sentences[1:2], features, logits, labels)
    assert predicted[0][:3] == ["O", "B-PER", "O"]
    # Document context: the window around the sentence holds its neighbours' sub-tokens.
    wide = ner.build_features(
        sentences, tokenizer, labels, max_seq_length=48, document_context=True
    )
    document = [i for s in sentences for w in s.words for i in tokenizer.encode(w)]
    middle = 1
    ids = wide.arrays["input_ids"][middle]
    length = int(wide.arrays["input_mask"][middle].sum())
    assert ids[1 : length - 1].tolist() == document
    assert {s for s, _, _ in wide.words[middle]} == {1}
    alone = ner.build_features(sentences, tokenizer, labels, max_seq_length=48)
    assert alone.arrays["input_mask"][middle].sum() == 2 + sum(map(len, pieces))


# ------------------------------------------------------------------------------------------------
# End to end: a tiny random encoder learns tags determined by the words
# ------------------------------------------------------------------------------------------------


def _synthetic_conll(path, count: int, seed: int, vocabulary: list[str]) -> None:
    """Sentences of filler words and entities (IOB1, as the original files): a person is a first
    name and sometimes a surname, a place one word; a word's role is fixed by the word."""
    rng = random.Random(seed)
    first, surname, places, filler = (
        vocabulary[:4],
        vocabulary[4:8],
        vocabulary[8:12],
        vocabulary[12:40],
    )
    lines = ["-DOCSTART- -X- -X- O", ""]
    for _ in range(count):
        tokens: list[tuple[str, str]] = []
        for _ in range(rng.randint(2, 5)):
            tokens.append((rng.choice(filler), "O"))
            roll = rng.random()
            if roll < 0.4:
                tokens.append((rng.choice(first), "I-PER"))
                if rng.random() < 0.5:
                    tokens.append((rng.choice(surname), "I-PER"))
            elif roll < 0.6:
                tokens.append((rng.choice(places), "I-LOC"))
        lines += [f"{w} X X {t}" for w, t in tokens] + [""]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_tiny_encoder_learns_synthetic_conll_end_to_end(tmp_path):
    encoder = tiny_pretrained()
    vocabulary = [t for t in encoder.tokenizer.vocab[120:] if t.isalpha() and len(t) > 3][:40]
    data = tmp_path / "conll"
    data.mkdir()
    for name, count, seed in (("train.txt", 192, 1), ("valid.txt", 48, 2), ("test.txt", 48, 3)):
        _synthetic_conll(data / name, count, seed, vocabulary)
    settings = token_tasks.task_settings(
        "conll2003",
        dict(
            max_seq_length=16,
            batch_size=16,
            epochs=4.0,
            learning_rate=1e-3,
            dropout=0.0,
            eval_every_epoch=True,
        ),
    )
    mesh = partitioning.make_mesh((1, 1, 1), jax.devices()[:1])
    workdir = tmp_path / "run"
    result = token_tasks.run_token_task(
        encoder, "conll2003", str(data), str(workdir), settings, mesh=mesh
    )
    print(
        f"synthetic CoNLL dev F1 {result['dev_metrics']['f1']:.1f} test F1 "
        f"{result['test_metrics']['f1']:.1f}, {result['num_train_steps']} steps "
        f"{result['seconds']:.1f}s"
    )
    assert result["dev_metrics"]["f1"] > 90 and result["test_metrics"]["f1"] > 90
    assert result["labels"] == ["O", "B-LOC", "B-PER", "I-PER"]
    assert result["dev_metrics"]["accuracy"] > 95  # predictions written back in IOB1
    on_disk = json.loads((workdir / "result.json").read_text())
    assert on_disk["test_metrics"]["f1"] == result["test_metrics"]["f1"]
    # dev_predictions.txt is conlleval's input: word, gold, guess; scoring it again agrees.
    rows = [
        line.split() for line in (workdir / "dev_predictions.txt").read_text().split("\n\n") if line
    ]
    gold = [
        [r.split()[1] for r in block.splitlines()]
        for block in (workdir / "dev_predictions.txt").read_text().strip().split("\n\n")
    ]
    guess = [
        [r.split()[2] for r in block.splitlines()]
        for block in (workdir / "dev_predictions.txt").read_text().strip().split("\n\n")
    ]
    assert len(rows) == len(gold) == 48
    assert ner.conlleval(gold, guess)["f1"] == pytest.approx(result["dev_metrics"]["f1"])
    assert (workdir / "test_predictions.txt").exists()
    assert [h["epoch"] for h in result["history"]] == [1.0, 2.0, 3.0, 4.0]
    assert (workdir / "plots" / "conll2003.png").stat().st_size > 1000
    assert "| BERT-Large (paper) | 96.6 | 92.8 |" in (workdir / "results.md").read_text()
