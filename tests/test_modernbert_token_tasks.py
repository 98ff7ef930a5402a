"""ModernBERT on SQuAD and CoNLL-2003: a byte-level BPE tokenizer's answer spans and first
sub-tokens on real text (punctuation, accents, CJK, an emoji) as transformers' fast tokenizer with
offsets has them; the span and tag heads (heads/per_token.py) trained step for step as
transformers' ModernBertForQuestionAnswering and ModernBertForTokenClassification under the
Trainer's recipe (`optimizer="adamw-hf"`, dropout off); `bert-jax finetune --task squad/v1.1` and
`conll2003` from a converted ModernBERT model directory."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import transformers

from bert_jax import cli
from bert_jax.data.tokenizers.hf_bpe import HfBpeTokenizer
from bert_jax.finetune.tasks import conll as ner
from bert_jax.finetune.tasks import squad, squad_answers
from bert_jax.finetune.tasks.squad import SquadExample
from bert_jax.finetune.tuning import token_tuning as token_loop
from bert_jax.finetune.tuning import tuning_loop
from bert_jax.finetune.tuning.settings import PretrainedEncoder
from bert_jax.training.load_model import load_model_dir
from tests.modernbert_fixtures import CONFIG, SPECIALS, bpe_tokenizer_json, modernbert_dirs
from tests.test_finetune_parity import (
    NUM_EXAMPLES,
    SEQ_LEN,
    SETTINGS,
    one_device_mesh,
    span_padding_masked,
)
from tests.test_modernbert_finetune import _steps_equal
from tests.test_ner import _synthetic_conll as synthetic_conll
from tests.test_predict import check_predictions
from tests.test_squad import synthetic_squad

# Real text with what byte-level BPE cuts apart: punctuation inside and around words, accents
# (two bytes), CJK (three), an emoji (four), a double space and a newline.
CONTEXT = (
    "Zürich's Café Ünal (opened in 1998 by Jürgen Müller, né Schmidt) serves crème brûlée, "
    '"naïve" tea and 東京-style ramen for €12.50;  U.S. visitors love it!\nReviews: 4.8/5 🍜.'
)
CORPUS = [
    CONTEXT,
    "Jürgen Müller opened a café in Zürich; the crème brûlée costs €7.",
    "Visitors from the U.S. and from 東京 say the café's tea is naïve but good.",
    "The quick brown fox jumps over the lazy dog, then naps in the café.",
]
ANSWERS = [
    "Zürich's",
    "Zürich",
    "Café Ünal",
    "1998",
    "Jürgen Müller",
    "Müller",
    "né Schmidt",
    "crème brûlée",
    "naïve",
    '"naïve" tea',
    "東京",
    "東京-style ramen",
    "€12.50",
    "U.S. visitors",
    "love it!\nReviews",
    "4.8/5",
    "🍜",
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """The tokenizer.json trained on CORPUS, beside transformers' files of it."""
    path = tmp_path_factory.mktemp("bpe")
    (path / "tokenizer.json").write_text(bpe_tokenizer_json(400, CORPUS), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return HfBpeTokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def fast(tokenizer_dir):
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_dir / "tokenizer.json"),
        **dict(zip(("unk_token", "cls_token", "sep_token", "pad_token", "mask_token"), SPECIALS)),
    )


def test_spans_are_transformers_offsets_without_the_space_mark(tokenizer, fast):
    ids, starts, ends = tokenizer.encode_with_spans(CONTEXT)
    reference = fast(CONTEXT, add_special_tokens=False, return_offsets_mapping=True)
    assert ids == reference["input_ids"]
    assert len(ids) > 60  # merges and single bytes both
    for start, end, (ref_start, ref_end) in zip(starts, ends, reference["offset_mapping"]):
        assert end == ref_end and CONTEXT[ref_start:start].strip() == ""
        assert start == end or not CONTEXT[start].isspace()
    covered = np.zeros(len(CONTEXT), bool)
    for start, end in zip(starts, ends):
        covered[start:end] = True
    assert all(covered[i] != CONTEXT[i].isspace() for i in range(len(CONTEXT)))


def test_each_answer_comes_back_as_its_exact_characters(tokenizer):
    """Each answer's first and last sub-token (a training target), then as a prediction from
    logits that point there: the very characters of the context."""
    examples = [
        SquadExample(f"q{i}", "What is it?", CONTEXT, ((text, CONTEXT.index(text)),))
        for i, text in enumerate(ANSWERS)
    ]
    windows = dict(tokenizer=tokenizer, max_seq_length=160, doc_stride=64, max_query_length=16)
    targets = squad.build_features(examples, training=True, **windows)
    features = squad.build_features(examples, **windows)
    assert targets.skipped_answers == 0 and len(targets) == len(features) == len(examples)
    logits = np.zeros((len(features), 160, 2), np.float32)
    rows = np.arange(len(examples))
    logits[rows, targets.arrays["start_positions"], 0] = 10.0
    logits[rows, targets.arrays["end_positions"], 1] = 10.0
    found = squad_answers.answers_from_logits(
        examples, features, logits, "v1.1", max_answer_length=64
    )
    assert found.predictions == {f"q{i}": text for i, text in enumerate(ANSWERS)}
    # The question and the context read as transformers' fast tokenizer reads the pair.
    row = features.arrays["input_ids"][0]
    pair = tokenizer._rust.encode("What is it?", CONTEXT).ids  # its [CLS] q [SEP] c [SEP]
    assert list(row[: len(pair)]) == pair and features.arrays["input_mask"][0].sum() == len(pair)


def test_a_word_inside_a_sentence_keeps_its_space_mark(tokenizer, fast):
    words = CONTEXT.split()
    grouped = tokenizer.encode_words(words)
    joined = " ".join(words)
    assert sum(grouped, []) == fast(joined, add_special_tokens=False)["input_ids"]
    assert grouped[0] == tokenizer.encode(words[0])
    for word, ids in zip(words[1:], grouped[1:]):
        assert ids == tokenizer.encode(" " + word)
    müller = words.index("Müller,")
    assert tokenizer.convert_ids_to_tokens(grouped[müller])[0].startswith("Ġ")
    # CoNLL-2003's label sits on each word's first sub-token, the token starting at the word.
    sentence = ner.Sentence(words=tuple(words), tags=tuple("O" for _ in words), document=0)
    features = ner.build_features([sentence], tokenizer, ("O",), max_seq_length=128)
    positions = [position for _, _, position in features.words[0]]
    ids, starts, _ = tokenizer.encode_with_spans(joined)
    word_starts = [m.start() for m in re.finditer(r"\S+", joined)]
    assert [starts[p - 1] for p in positions] == word_starts
    assert np.flatnonzero(features.arrays["label_weights"][0]).tolist() == positions
    assert features.arrays["input_ids"][0, 1 : len(ids) + 1].tolist() == ids


# ------------------------------------------------------------------------------------------------
# Step for step as transformers
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return modernbert_dirs(tmp_path_factory.mktemp("modernbert_token_tasks"))


@pytest.fixture(scope="module")
def two_layer_dirs(tmp_path_factory):
    """A model of `dirs`'s shape with two layers (a global one and a sliding-window one) for the
    step-for-step tests: each compiles its steps, and a third layer adds compile time but no
    other kind of layer (as in test_modernbert_finetune)."""
    config = CONFIG.replace(num_hidden_layers=2)
    assert config.layer_types == ("full_attention", "sliding_attention")
    return modernbert_dirs(tmp_path_factory.mktemp("modernbert_token_tasks_2"), config)


def _modernbert_rows(rng: np.random.Generator, min_length: int) -> dict[str, np.ndarray]:
    """Rows of `min_length` to SEQ_LEN tokens: [CLS] (1) random [SEP] (2), then [PAD] (3)."""
    rows = {key: np.zeros((NUM_EXAMPLES, SEQ_LEN), np.int32) for key in token_loop.MODEL_KEYS}
    rows["input_ids"][:] = 3
    for row, length in enumerate(rng.integers(min_length, SEQ_LEN + 1, size=NUM_EXAMPLES)):
        rows["input_ids"][row, :length] = rng.integers(5, CONFIG.vocab_size, size=length)
        rows["input_ids"][row, [0, length - 1]] = 1, 2
        rows["input_mask"][row, :length] = 1
    return rows


def _token_steps_equal(dirs, name, kind, num_outputs, arrays, reference_class, to_targets, **kw):
    """`_steps_equal` for a per-token head: 20 steps of ours and of transformers'
    `reference_class` from the same weights, the losses and final params compared."""
    _, ours, _ = dirs
    loaded = load_model_dir(ours)
    encoder = PretrainedEncoder(loaded.config, loaded.params["model"], loaded.tokenizer)
    mesh = one_device_mesh()
    config = tuning_loop.run_config(encoder, SETTINGS, mesh)
    tuner = token_loop.token_tuner(config, num_outputs, kind, mesh, 0.0, SETTINGS)
    inputs = {key: arrays[key] for key in (*token_loop.MODEL_KEYS, *token_loop.TARGET_KEYS[kind])}

    def to_inputs(batch):
        mask = batch["input_mask"].astype(np.int64)
        return {"input_ids": batch["input_ids"].astype(np.int64), "attention_mask": mask} | (
            to_targets(batch)
        )

    _steps_equal(
        name,
        tuner,
        encoder,
        lambda rows: token_loop.gather_rows(inputs, rows),
        reference_class,
        to_inputs,
        num_labels=num_outputs,
        **kw,
    )


def test_span_steps_equal_transformers_question_answering(two_layer_dirs):
    rng = np.random.default_rng(5)
    # Every padding query within reach of a real key in the sliding-window layer: one out of
    # reach has every key masked, and there transformers' eager attention (the mask added to the
    # scores) passes gradient to its scores where ours (`jnp.where`) passes none, to values the
    # forward pass does not read (the row's weights are uniform on both sides). With the padding
    # masked out of the span softmax no loss reads those positions (as tags' losses do not).
    arrays = _modernbert_rows(rng, SEQ_LEN - CONFIG.local_attention // 2)
    lengths = arrays["input_mask"].sum(axis=1)
    starts = np.array([rng.integers(0, n - 1) for n in lengths], np.int32)
    arrays["start_positions"] = starts
    ends = np.minimum(starts + rng.integers(0, 3, NUM_EXAMPLES), lengths - 1)
    arrays["end_positions"] = ends.astype(np.int32)
    _token_steps_equal(
        two_layer_dirs,
        "SQuAD spans",
        token_loop.SPAN,
        2,
        arrays,
        span_padding_masked(transformers.ModernBertForQuestionAnswering),
        lambda batch: {
            "start_positions": batch["start_positions"].astype(np.int64),
            "end_positions": batch["end_positions"].astype(np.int64),
        },
        # The classifier's bias and the head norm's bias shift every position's logit alike: no
        # gradient in a softmax over positions, but for rounding noise that Adam scales up.
        ignore=("classifier.bias", "head.norm.bias"),
    )


def test_tag_steps_equal_transformers_token_classification(two_layer_dirs):
    num_tags = 9
    rng = np.random.default_rng(6)
    arrays = _modernbert_rows(rng, 6)
    arrays["labels"] = rng.integers(0, num_tags, (NUM_EXAMPLES, SEQ_LEN)).astype(np.int32)
    inner = arrays["input_mask"].astype(bool)
    inner[:, 0] = False
    inner[np.arange(NUM_EXAMPLES), arrays["input_mask"].sum(axis=1) - 1] = False
    arrays["label_weights"] = (inner & (rng.uniform(size=inner.shape) < 0.7)).astype(np.float32)
    _token_steps_equal(
        two_layer_dirs,
        "CoNLL tags",
        token_loop.TAGS,
        num_tags,
        arrays,
        transformers.ModernBertForTokenClassification,
        lambda batch: {
            "labels": np.where(batch["label_weights"] > 0, batch["labels"], -100).astype(np.int64)
        },
    )


# ------------------------------------------------------------------------------------------------
# As a user runs them
# ------------------------------------------------------------------------------------------------

SMALL_FLAGS = ["--batch-size", "8", "--eval-batch-size", "8", "--epochs", "1"]
SMALL_FLAGS += ["--learning-rate", "1e-3"]


def test_squad_fine_tunes_from_a_modernbert_model(dirs, tmp_path, capsys):
    _, ours, _ = dirs
    data = tmp_path / "squad"
    data.mkdir()
    for split, count, seed in (("train", 16, 1), ("dev", 8, 2)):
        payload, _ = synthetic_squad(count, seed)
        (data / f"{split}-v1.1.json").write_text(json.dumps(payload), encoding="utf-8")
    workdir = tmp_path / "run"
    argv = ["finetune", "--model", str(ours), "--task", "squad/v1.1", "--data", str(data)]
    argv += ["--workdir", str(workdir), "--max-seq-length", "40", "--doc-stride", "16"]
    assert cli.main([*argv, "--max-query-length", "12", *SMALL_FLAGS]) == 0
    assert "squad/v1.1 dev: exact_match" in capsys.readouterr().out
    result = json.loads((workdir / "result.json").read_text())
    assert result["model"] == str(ours) and result["skipped_train_answers"] == 0
    assert result["num_train_features"] > 16  # contexts longer than a window: several each
    assert np.isfinite(result["train_loss"]) and set(result["dev_metrics"]) == {"exact_match", "f1"}
    examples, _ = squad.read_json(str(data / "dev-v1.1.json"))
    predictions = json.loads((workdir / "predictions.json").read_text())
    assert set(predictions) == {e.qid for e in examples}
    assert all(predictions[e.qid] in e.context for e in examples)  # the context's characters
    assert check_predictions(workdir, data, tmp_path / "predicted") == "span"  # its model


def test_conll_fine_tunes_from_a_modernbert_model(dirs, tmp_path, capsys):
    _, ours, _ = dirs
    data = tmp_path / "conll"
    data.mkdir()
    vocabulary = list(dict.fromkeys(re.findall(r"[a-zé]{4,}", " ".join(CORPUS).lower())))
    for name, count, seed in (("train.txt", 24, 1), ("valid.txt", 8, 2)):
        synthetic_conll(data / name, count, seed, (vocabulary * 2)[:40])
    workdir = tmp_path / "run"
    argv = ["finetune", "--model", str(ours), "--task", "conll2003", "--data", str(data)]
    assert cli.main([*argv, "--workdir", str(workdir), "--max-seq-length", "32", *SMALL_FLAGS]) == 0
    assert "conll2003 dev: precision" in capsys.readouterr().out
    result = json.loads((workdir / "result.json").read_text())
    assert result["model"] == str(ours) and np.isfinite(result["train_loss"])
    assert result["labels"] == ["O", "B-LOC", "B-PER", "I-PER"]
    blocks = (workdir / "dev_predictions.txt").read_text().strip().split("\n\n")
    assert len(blocks) == 8 and all(
        len(line.split()) == 3 for b in blocks for line in b.split("\n")
    )
    assert check_predictions(workdir, data, tmp_path / "predicted") == "tags"  # its model
