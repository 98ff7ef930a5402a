"""Packed fine-tuning batches (finetune/tuning/packing.py): how rows are laid out and how few
shapes a run takes, and, for every head (sentence single and pair, regression, multiple choice,
span, tags) of both families (BERT; ModernBERT with its sliding window, CLS and mean pooling),
dropout off: two packed steps, and the same steps on batches padded to length buckets
(finetune/tuning/batches.py), give the losses, updated parameters and logits of the steps with
every row padded to max_seq_length (the cases: tests/test_finetune_buckets.py); and a tiny SQuAD
v2.0 run answers every question as its `--no-packing` run does."""

from __future__ import annotations

import dataclasses
import json
import re

import jax
import numpy as np
import pytest

from bert_jax.finetune.runs import squad_and_conll as token_tasks
from bert_jax.finetune.tuning import batches, packing, tuning_loop
from bert_jax.finetune.tuning import settings as settings_module
from bert_jax.finetune.tuning import token_tuning as token_loop
from bert_jax.finetune.tuning.settings import PretrainedEncoder
from tests.glue_fixtures.tiny import fixture_tokenizer
from tests.test_finetune_buckets import (
    ABSENT,
    BATCH,
    BUCKETS,
    HEADS,
    MAX_LEN,
    ORDER,
    SETTINGS,
    _case,
    _config,
    _encoder_params,
    _mesh,
    assert_same_steps,
    fixed_length_steps,
    two_steps,
)

PACKED = dataclasses.replace(SETTINGS, packing=True)


# ------------------------------------------------------------------------------------------------
# The layout and the shapes
# ------------------------------------------------------------------------------------------------


def test_first_fit_decreasing_fills_each_sequence_within_its_length_and_slots():
    lengths = np.array([20, 5, 30, 12, 9, 3])
    bins = packing.first_fit_decreasing(lengths, 32, slots=3)
    assert sorted(i for b in bins for i in b) == list(range(6))
    assert all(sum(lengths[b]) <= 32 and len(b) <= 3 for b in bins)
    assert bins == [[2], [0, 3], [4, 1, 5]]
    with pytest.raises(ValueError, match="longer than the packed length"):
        packing.first_fit_decreasing(np.array([33]), 32, 4)


def test_a_run_compiles_the_counts_that_pay_for_their_compile():
    needed = [6] * 20 + [8] * 2
    assert packing.chosen_counts(needed, compile_cost=4 * 8) == (6, 8)  # saves 40 > 32
    assert packing.chosen_counts(needed, compile_cost=48) == (8,)  # saves 40 < 48
    assert packing.chosen_counts([3, 3, 3], 12) == (3,)
    # More than one micro-batch: a multiple of the micro-batch, which divides over the devices.
    assert packing.rounded_count(5, per_micro_batch=8, divisor=1) == 5
    assert packing.rounded_count(7, per_micro_batch=5, divisor=1) == 8  # two of 4
    assert packing.rounded_count(11, per_micro_batch=5, divisor=1) == 12  # three of 4
    assert packing.rounded_count(9, per_micro_batch=8, divisor=4) == 16  # two of 8
    assert packing.rounded_count(3, per_micro_batch=8, divisor=2) == 4
    for needed in range(1, 40):
        count = packing.rounded_count(needed, 5, 1)
        micro = batches.micro_batch_count(count, 384, 5 * 384)
        assert needed <= count < needed + count / 4 + 1 and count // micro <= 5


def test_packing_is_a_declared_setting_that_changes_neither_trial_nor_step():
    declared = settings_module.declaration("packing")
    assert not declared.trial and not declared.step
    assert "packing" not in settings_module.TRIAL_SETTINGS
    fixed = dataclasses.replace(PACKED, pad_to_max_length=True)
    _, arrays = _case("tags", "bert")
    assert isinstance(packing.batches_for(fixed, [arrays], _mesh()), batches.Buckets)
    unpacked = dataclasses.replace(PACKED, packing=False)
    assert isinstance(packing.batches_for(unpacked, [arrays], _mesh()), batches.Buckets)


def test_a_packed_batch_restarts_positions_and_keeps_each_row_apart():
    """Multiple choice: a lane per choice, each as long as the longest row (not the four
    choices end to end); choice c of every example of a sequence lies in its lane c, in the
    same slot, each row's tokens whole and in order."""
    _, arrays = _case("choice", "bert")
    run = packing.batches_for(PACKED, [arrays], _mesh())
    run.plan(ORDER)
    batch = run.gather(arrays, ORDER[0])
    spans = packing.row_spans(arrays["input_mask"][:4])  # [4 examples, 4 choices]
    longest = int(packing.row_spans(arrays["input_mask"]).max())
    assert run.length == batches.padded_length([longest], batches.bucket_lengths(MAX_LEN))
    assert batch["input_mask"].sum() == spans.sum()  # every real token once, no padding between
    assert batch["input_ids"].shape[1:] == (4, run.length)
    assert batch["cls_positions"].shape[1:] == (run.slots, 4)
    seen = []
    for s, slot in zip(*np.nonzero(batch["weights"])):
        for choice, start in enumerate(batch["cls_positions"][s, slot]):
            lane = (s, choice)
            assert batch["packed_segment_ids"][lane][start] == slot + 1
            size = int(np.sum(batch["packed_segment_ids"][lane] == slot + 1))
            np.testing.assert_array_equal(
                batch["position_ids"][lane][start : start + size], range(size)
            )
            seen.append(batch["input_ids"][lane][start : start + size])
            assert seen[-1][0] == 1  # the row's [CLS]
    assert batch["weights"].sum() == 4
    rows = [_tokens_of_choice(arrays, r, c) for r in ORDER[0][ORDER[0] >= 0] for c in range(4)]
    assert sorted(map(tuple, seen)) == sorted(map(tuple, rows))


def _tokens_of_choice(arrays, row, choice):
    mask = arrays["input_mask"][row, choice]
    return arrays["input_ids"][row, choice][mask != 0]


def test_a_packed_span_target_is_the_same_token_of_its_row():
    """Several windows share a sequence; each one's start and end name the tokens they named
    in its own row (a window without the answer, `ABSENT`: its own [CLS]), and nothing else
    moves."""
    _, arrays = _case("span", "bert")
    run = packing.batches_for(PACKED, [arrays], _mesh())
    run.plan(ORDER)
    shared = []
    for rows in ORDER:
        batch = run.gather(arrays, rows)
        shared.append(np.max(np.sum(batch["weights"] > 0, axis=1)))
        for s, slot in zip(*np.nonzero(batch["weights"])):
            ids = batch["input_ids"][s][batch["packed_segment_ids"][s] == slot + 1]
            row = next(r for r in rows[rows >= 0] if np.array_equal(ids, _tokens(arrays, r)))
            for key in packing.ROW_POSITION_KEYS:
                position = batch[key][s, slot]
                assert batch["packed_segment_ids"][s, position] == slot + 1
                assert batch["input_ids"][s, position] == arrays["input_ids"][row, arrays[key][row]]
                offset = position - arrays[key][row]
                assert batch["position_ids"][s, offset] == 0  # the row's first token
                if row in ABSENT:
                    assert batch["input_ids"][s, position] == 1  # its [CLS]
    assert shared[0] > 1  # several windows in one sequence (rows 0-3: 6 to 16 tokens)
    beyond = dict(arrays, end_positions=arrays["input_mask"].sum(axis=1))
    with pytest.raises(ValueError, match="end_positions of row 0 is past its"):
        run.gather(beyond, ORDER[0])


def _tokens(arrays, row):
    return arrays["input_ids"][row][arrays["input_mask"][row] > 0]


# ------------------------------------------------------------------------------------------------
# Every head, both families: bucketed and packed equal padded to max_seq_length
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["bert", "modernbert"])
@pytest.mark.parametrize("head", HEADS)
def test_bucketed_and_packed_steps_equal_the_fixed_length_steps(head, family):
    """Both against one fixed-length run of the case: the bucketed run's shapes are two of its
    own (16 and 32 tokens, the fixed run's one among them); the packed run's one training and
    one prediction shape take fewer positions than padded rows."""
    tuner, arrays = _case(head, family)
    fixed = fixed_length_steps(head, family)
    assert fixed[-1].used == {"train": {MAX_LEN}, "predict": {MAX_LEN}}
    lengths = batches.row_lengths(arrays["input_mask"])
    assert max(lengths[:4]) <= 16 < lengths[4] and max(lengths) < MAX_LEN

    bucketed = batches.Buckets(BUCKETS)
    assert_same_steps(head, arrays, two_steps(tuner, arrays, bucketed, family), fixed)
    assert bucketed.used == {"train": {16, 32}, "predict": {16, 32}}

    packed = packing.batches_for(PACKED, [arrays], _mesh())
    assert isinstance(packed, packing.Packing)
    packed.plan(ORDER)
    assert_same_steps(head, arrays, two_steps(tuner, arrays, packed, family), fixed)
    assert len(packed.used["train"]) == 1 and len(packed.used["predict"]) == 1
    ((count, length),) = packed.used["train"]
    assert count * length < BATCH * arrays["input_ids"][0].size


def test_a_packed_run_prints_its_compiled_shapes_once():
    """`run_steps` plans the counts from its own order and logs the shapes in one line."""
    tuner, arrays = _case("sentence", "bert")
    run = packing.batches_for(PACKED, [arrays], _mesh())
    state = tuner.init(jax.random.key(0), _encoder_params("bert"))
    lines = []
    tuning_loop.run_steps(
        tuner,
        state,
        jax.random.key(1),
        dataclasses.replace(PACKED, epochs=1.0),
        len(arrays["input_ids"]),
        lambda rows: run.gather(arrays, rows),
        lambda params: {
            "rows": len(token_loop.predict_logits(tuner, params, arrays, BATCH, buckets=run))
        },
        lines.append,
        buckets=run,
    )
    shapes = [line for line in lines if "compiled shapes" in line]
    assert len(shapes) == 1, lines
    assert run.train_counts and len(run.used["train"]) <= len(run.train_counts)
    assert shapes[0].startswith("compiled shapes: train ") and f"x{run.length}" in shapes[0]


# ------------------------------------------------------------------------------------------------
# SQuAD: the task's answers, packed and not
# ------------------------------------------------------------------------------------------------


def _tiny_squad(words):
    """SQuAD v2.0 questions on contexts of `words`, every other one of 2 to 5 (short windows,
    several to a sequence), the others of 20 to 40 (cut into windows: the max-context rule);
    every third question unanswerable."""
    rng = np.random.default_rng(0)
    paragraphs = []
    for index in range(24):
        size = int(rng.integers(2, 6) if index % 2 else rng.integers(20, 41))
        context = " ".join(rng.choice(words, size)) + "."
        answer = context.split()[int(rng.integers(0, 3))]
        qa = {"id": f"q{index}", "question": f"where is {words[index % 5]}?", "answers": []}
        if index % 3:
            qa["answers"] = [{"text": answer, "answer_start": context.index(answer)}]
        qa["is_impossible"] = not qa["answers"]
        paragraphs.append({"context": context, "qas": [qa]})
    return {"version": "v2.0", "data": [{"title": "t", "paragraphs": paragraphs}]}


def test_squad_answers_every_question_as_its_unpacked_run(tmp_path):
    """`finetune --task squad/v2.0` on the tiny encoder, dropout off, packed and with
    `--no-packing`: the same answers (n-best lists included) and null odds, from one train and
    one predict shape packed. (The span head and settings of the steps above: the unpacked
    run's shapes are the bucketed span case's above, read from the compilation cache.)"""
    tokenizer = fixture_tokenizer()
    encoder = PretrainedEncoder(_config("bert"), _encoder_params("bert"), tokenizer, "tiny")
    words = [t for t in tokenizer.vocab[120:] if t.isalpha() and len(t) > 3][:12]
    data = tmp_path / "squad"
    data.mkdir()
    payload = json.dumps(_tiny_squad(words))
    for split in ("train", "dev"):
        (data / f"{split}-v2.0.json").write_text(payload, encoding="utf-8")
    # The threshold: the tiny model's null odds after its 10 steps are 0.08-0.56, about half
    # the questions answered.
    options = token_tasks.SpanOptions(
        doc_stride=8, max_query_length=6, max_answer_length=4, null_score_diff_threshold=0.4
    )
    found, lines = {}, []
    for packs in (True, False):
        settings = dataclasses.replace(SETTINGS, epochs=1.0, packing=packs, keep_models="none")
        workdir = tmp_path / f"packing-{packs}"
        result = token_tasks.run_token_task(
            encoder, "squad/v2.0", str(data), str(workdir), settings, options, lines.append, _mesh()
        )
        assert result["num_train_features"] > 24  # some contexts take several windows
        found[packs] = {
            name: json.loads((workdir / f"{name}.json").read_text())
            for name in ("predictions", "nbest_predictions", "null_odds")
        }
    shapes = [line for line in lines if "compiled shapes" in line]
    packed_shapes = re.fullmatch(
        r"compiled shapes: train 1 \(.*\), predict 1 \(.*up to (\d+) .*", shapes[0]
    )
    assert packed_shapes and int(packed_shapes[1]) > 1, shapes  # several windows a sequence
    assert "of buckets" in shapes[1], shapes
    packed, unpacked = found[True], found[False]
    assert packed["predictions"] == unpacked["predictions"]
    answered = [answer for answer in packed["predictions"].values() if answer]
    assert 0 < len(answered) < len(packed["predictions"])  # answers and abstentions both
    for qid, nbest in packed["nbest_predictions"].items():
        theirs = unpacked["nbest_predictions"][qid]
        assert [n["text"] for n in nbest] == [n["text"] for n in theirs]
        for key in ("start_logit", "end_logit", "probability"):
            ours, fixed = (np.array([n[key] for n in entries]) for entries in (nbest, theirs))
            if key != "probability":  # up to the shift SHIFTS["span"]'s biases add
                ours, fixed = ours - ours[0], fixed - fixed[0]
            np.testing.assert_allclose(ours, fixed, atol=1e-4)
    assert packed["null_odds"] == pytest.approx(unpacked["null_odds"], abs=1e-4)
