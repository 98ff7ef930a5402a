"""Pretraining objectives (issue 38): MLM-only and left-to-right parity with Hugging Face's
BertForMaskedLM and BertLMHeadModel(is_decoder=True), perplexity, MASK/SAME/RND mixes, the
no-NSP instance formats and the one-line refusals of bad settings."""

from __future__ import annotations

import functools
import math

import jax
import numpy as np
import pytest
import torch
import transformers

from bert_jax.convert import hf as hf_convert
from bert_jax.core import losses, trainer
from bert_jax.core.model import BertForPreTraining, BertModel
from bert_jax.data.instances import single_segments as single_instances
from bert_jax.data.masking.dynamic_batch import dynamic_mask_batch
from bert_jax.data.masking.settings import MaskingConfig
from bert_jax.data.masking.static_rows import mask_rows
from bert_jax.runtime.errors import UserError
from bert_jax.training import config_checks, config_lib, heldout_eval
from tests.data_fixtures import embedded_spm, embedded_tokenized
from tests.helpers import hf_config, random_batch, random_params, tiny_config


def _perturbed(model):
    """Non-trivial biases and LayerNorms, so a mapping mistake cannot hide behind 0/1."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                param.add_(0.1 * torch.randn_like(param))
    return model.eval()


def _torch_inputs(batch):
    return dict(
        input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
        attention_mask=torch.tensor(batch["input_mask"], dtype=torch.long),
        token_type_ids=torch.tensor(batch["segment_ids"], dtype=torch.long),
    )


def _ours(config, params, batch):
    """Outputs, loss sums and the held-out evaluation, compiled (run op by op, a forward costs
    several times its compile): the sums are the evaluation's step, one program."""
    model = BertForPreTraining(config)
    inputs = trainer.model_inputs(trainer.objective_batch(batch, config.objective))
    outputs = jax.jit(lambda p, i: model.apply({"params": p}, **i, deterministic=True))(
        params, inputs
    )
    eval_step = jax.jit(functools.partial(trainer.eval_step, model=model))
    sums = eval_step(params, batch)
    held_out = heldout_eval.evaluate(
        lambda local: eval_step(params, local),
        [batch],
        config.vocab_size,
        config.objective,
    )
    return outputs, sums, held_out


def test_the_data_and_the_model_know_the_same_objectives():
    from bert_jax.core import bert_config
    from bert_jax.data import objectives

    assert objectives.OBJECTIVES == bert_config.OBJECTIVES
    assert objectives.DEFAULT_OBJECTIVE == bert_config.BertConfig().objective


def test_mlm_only_matches_bert_for_masked_lm():
    config = tiny_config(objective="mlm")
    torch.manual_seed(0)
    hf_model = _perturbed(transformers.BertForMaskedLM(hf_config(config)))
    params = hf_convert.params_from_hf(hf_model.state_dict(), config)  # pooler, NSP: fresh
    batch = random_batch(np.random.default_rng(0), 4, 32, 6, config.vocab_size)
    outputs, sums, held_out = _ours(config, params, batch)

    labels = np.full(batch["input_ids"].shape, -100, np.int64)
    for row, (positions, ids, weights) in enumerate(
        zip(batch["masked_lm_positions"], batch["masked_lm_ids"], batch["masked_lm_weights"])
    ):
        labels[row, positions[weights > 0]] = ids[weights > 0]
    with torch.no_grad():
        ref = hf_model(**_torch_inputs(batch), labels=torch.tensor(labels))
    positions = torch.tensor(batch["masked_lm_positions"], dtype=torch.long)
    ref_logits = torch.gather(
        ref.logits, 1, positions[..., None].expand(-1, -1, config.vocab_size)
    ).numpy()
    np.testing.assert_allclose(np.asarray(outputs["mlm_logits"]), ref_logits, atol=1e-5, rtol=0)
    # No NSP loss and no NSP metrics: the loss is the masked-LM loss alone.
    assert float(sums["nsp_weight"]) == 0 and "nsp_accuracy" not in held_out
    np.testing.assert_allclose(float(losses.pretraining_loss(sums)), ref.loss.item(), atol=1e-5)
    # Perplexity: exp of the loss transformers computes on its own.
    np.testing.assert_allclose(held_out["mlm_perplexity"], math.exp(ref.loss.item()), rtol=1e-5)


def test_left_to_right_matches_bert_lm_head_model():
    config = tiny_config(objective="ltr")
    torch.manual_seed(1)
    reference_config = hf_config(config)
    reference_config.is_decoder = True
    hf_model = _perturbed(transformers.BertLMHeadModel(reference_config))
    params = hf_convert.params_from_hf(hf_model.state_dict(), config)
    batch = random_batch(np.random.default_rng(1), 4, 32, 6, config.vocab_size)
    assert batch["input_mask"].min() == 0, "the batch must contain padding"
    outputs, sums, held_out = _ours(config, params, batch)

    labels = np.where(batch["input_mask"] > 0, batch["input_ids"], -100)
    with torch.no_grad():
        ref = hf_model(**_torch_inputs(batch), labels=torch.tensor(labels, dtype=torch.long))
        ref_hidden = hf_model.bert(**_torch_inputs(batch)).last_hidden_state.numpy()
    real = batch["input_mask"] > 0
    np.testing.assert_allclose(
        np.asarray(outputs["sequence_output"])[real], ref_hidden[real], atol=1e-5, rtol=0
    )
    np.testing.assert_allclose(
        np.asarray(outputs["mlm_logits"])[real], ref.logits.numpy()[real], atol=1e-5, rtol=0
    )
    # Every real position but the last predicts the next token: the loss transformers shifts.
    assert float(sums["mlm_weight"]) == batch["input_mask"].sum() - len(labels)
    np.testing.assert_allclose(float(losses.pretraining_loss(sums)), ref.loss.item(), atol=1e-5)
    np.testing.assert_allclose(held_out["mlm_perplexity"], math.exp(ref.loss.item()), rtol=1e-5)


def test_causal_encoder_sees_no_later_token_and_pools_the_last_real_one():
    """What fine-tuning a left-to-right model gets (its heads read BertModel's outputs)."""
    config = tiny_config(objective="ltr", hidden_dropout_prob=0.0)
    batch = random_batch(np.random.default_rng(2), 2, 16, 2, config.vocab_size)
    model = BertModel(config)
    inputs = {k: batch[k] for k in ("input_ids", "input_mask", "segment_ids")}
    params = random_params(model, **inputs)["params"]
    apply = jax.jit(lambda p, i: model.apply({"params": p}, **i))
    before = apply(params, inputs)
    later = dict(inputs, input_ids=inputs["input_ids"].copy())
    later["input_ids"][:, 5:] = 7  # every token from position 5 on changes
    after = apply(params, later)
    np.testing.assert_array_equal(before["sequence_output"][:, :5], after["sequence_output"][:, :5])
    assert not np.allclose(before["sequence_output"][:, 5:], after["sequence_output"][:, 5:])
    last = batch["input_mask"].sum(axis=1) - 1
    pooler = params["pooler"]
    hidden = np.asarray(before["sequence_output"])[np.arange(2), last]
    expected = np.tanh(hidden @ np.asarray(pooler["kernel"]) + np.asarray(pooler["bias"]))
    np.testing.assert_allclose(before["pooled_output"], expected, atol=1e-5)


MIXES = [(0.8, 0.1, 0.1), (1.0, 0.0, 0.0), (0.8, 0.0, 0.2), (0.8, 0.2, 0.0), (0.0, 0.2, 0.8)]
MIXES += [(0.0, 0.0, 1.0)]


@pytest.fixture(scope="module")
def sample_rows():
    """3000 rows [CLS] ordinary tokens [SEP] of 62 tokens: ~28k selected tokens per masking."""
    tokenizer = embedded_spm()
    rng = np.random.default_rng(0)
    ids = rng.choice(tokenizer.ordinary_ids, size=(3000, 64)).astype(np.int32)
    ids[:, 0], ids[:, -1] = tokenizer.cls_id, tokenizer.sep_id
    return tokenizer, ids


def _shares(original, masked, positions, weights, mask_id):
    rows, slots = np.nonzero(weights > 0)
    at = positions[rows, slots]
    seen, was = masked[rows, at], original[rows, at]
    is_mask = seen == mask_id
    is_same = ~is_mask & (seen == was)
    counts = np.array([is_mask.sum(), is_same.sum(), (~is_mask & ~is_same).sum()])
    return counts / counts.sum(), len(rows)


@pytest.mark.parametrize("mix", MIXES, ids=["/".join(f"{100 * s:g}" for s in m) for m in MIXES])
def test_masking_statistics_match_each_mix_static_and_dynamic(sample_rows, mix):
    import tensorflow as tf

    tokenizer, ids = sample_rows
    mask, same, rand = mix
    masking = MaskingConfig.from_tokenizer(
        tokenizer, 0.15, 20, mask_share=mask, same_share=same, random_share=rand
    )
    lengths = np.full(len(ids), ids.shape[1])
    masked, positions, _, counts = mask_rows(ids, lengths, masking, np.random.default_rng(1))
    weights = (np.arange(20)[None, :] < counts[:, None]).astype(np.float32)
    static, selected = _shares(ids, masked, positions, weights, tokenizer.mask_id)
    assert abs(selected / (62 * len(ids)) - 0.15) < 0.005  # 15% of the non-special tokens
    batch = {
        "input_ids": tf.constant(ids),
        "input_mask": tf.ones_like(ids),
        "masked_lm_positions": tf.zeros((len(ids), 20), tf.int32),
        "masked_lm_ids": tf.zeros((len(ids), 20), tf.int32),
        "masked_lm_weights": tf.zeros((len(ids), 20), tf.float32),
    }
    out = {k: v.numpy() for k, v in dynamic_mask_batch(batch, tf.constant([3, 4]), masking).items()}
    dynamic, _ = _shares(
        ids,
        out["input_ids"],
        out["masked_lm_positions"],
        out["masked_lm_weights"],
        tokenizer.mask_id,
    )
    # A random replacement equals the original once in ~|ordinary ids| = 1000 draws.
    for got in (static, dynamic):
        np.testing.assert_allclose(got, mix, atol=0.012)


def _text(rows):
    """Each row's tokens without [CLS], [SEP] and padding, and the separators inside it."""
    out = []
    for batch in rows:
        ids, lengths = batch.arrays["input_ids"], batch.lengths
        out += [(row[1 : n - 1].tolist()) for row, n in zip(ids, lengths)]
    return out


@pytest.mark.parametrize("instance_format", ["doc_sentences", "full_sentences"])
def test_no_nsp_instances_keep_the_text_and_the_length_statistics_of_their_format(
    instance_format,
):
    tokenizer = embedded_spm()
    documents = embedded_tokenized()
    masking = MaskingConfig.from_tokenizer(tokenizer, 0.15, 10)
    batches, order = single_instances.create_single_rows(
        documents, masking, 64, short_seq_prob=0.0, instance_format=instance_format, mask=False
    )
    batches = list(batches)
    rows = _text(batches)
    assert sorted(order) == list(range(len(rows)))
    sep = tokenizer.sep_id
    # Text in = text out: every token once, in order (documents joined by [SEP] across them).
    flat = [t for row in rows for t in row if t != sep]
    assert flat == [t for document in documents for sentence in document for t in sentence]
    lengths = np.concatenate([b.lengths for b in batches])
    assert lengths.max() <= 64 and all(b.arrays["segment_ids"].max() == 0 for b in batches)
    assert all(b.arrays["masked_lm_weights"].sum() == 0 for b in batches)  # unmasked (ltr)
    inner_seps = sum(row.count(sep) for row in rows)
    if instance_format == "doc_sentences":
        assert inner_seps == 0  # never crosses a document
        assert len(rows) >= len(documents)  # at least one instance per document
    else:
        assert 0 < inner_seps < len(documents)  # crosses documents, [SEP] between them
        assert np.mean(lengths[:-1]) > 0.75 * 64  # full rows: only sentence ends leave room
    # With short_seq_prob, that share of instances gets a shorter target.
    batches, _ = single_instances.create_single_rows(
        documents, masking, 64, short_seq_prob=0.1, instance_format=instance_format
    )
    batches = list(batches)
    targets = np.concatenate([b.target_seq_length for b in batches])
    assert abs(np.mean(targets < 62) - 0.1) < 0.03
    assert all(b.arrays["masked_lm_weights"].sum() > 0 for b in batches)  # masked (mlm)


def test_full_sentences_fill_rows_more_than_doc_sentences():
    masking = MaskingConfig.from_tokenizer(embedded_spm(), 0.15, 10)
    mean = {}
    for instance_format in ("doc_sentences", "full_sentences"):
        batches, _ = single_instances.create_single_rows(
            embedded_tokenized(), masking, 128, 0.0, instance_format=instance_format
        )
        mean[instance_format] = np.mean(np.concatenate([b.lengths for b in batches]))
    assert mean["full_sentences"] > mean["doc_sentences"]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("objective", "nsp", "config.objective='nsp' is not one of mlm+nsp, mlm, ltr"),
        ("data.instance_format", "pairs", "config.data.instance_format='pairs' is not one of"),
        ("data.mask_share", 1.5, "config.data.mask_share=1.5 must be in [0, 1]"),
        ("data.random_share", -0.1, "config.data.random_share=-0.1 must be in [0, 1]"),
        ("data.same_share", 0.2, "must sum to 1, got 1.1"),
    ],
)
def test_every_bad_objective_setting_is_one_line(key, value, message):
    config = config_lib.pretraining_config("tiny")
    node, (*parents, leaf) = config, key.split(".")
    for parent in parents:
        node = node[parent]
    node[leaf] = value
    with pytest.raises(UserError) as error:
        config_checks.check_values(config, config_lib.split_phases(config))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_nsp_needs_sentence_pairs():
    config = config_lib.pretraining_config("tiny")
    config.data.instance_format = "doc_sentences"
    with pytest.raises(UserError, match="objective 'mlm\\+nsp' needs sentence_pairs"):
        config_checks.check_values(config, config_lib.split_phases(config))


def test_left_to_right_packed_row_computes_what_its_instances_do_apart():
    """Packing with the causal mask: no attention and no next-token target across instances."""
    config = tiny_config(objective="ltr")
    model = BertForPreTraining(config)
    rng = np.random.default_rng(3)
    first, second = rng.integers(5, 512, 9), rng.integers(5, 512, 12)
    length, zeros = 24, np.zeros((2, 2), np.int32)
    apart = {
        "input_ids": np.zeros((2, length), np.int32),
        "input_mask": np.zeros((2, length), np.int32),
        "segment_ids": np.zeros((2, length), np.int32),
        "masked_lm_positions": zeros,
        "masked_lm_ids": zeros,
        "masked_lm_weights": zeros.astype(np.float32),
        "next_sentence_labels": np.zeros(2, np.int32),
    }
    for row, ids in enumerate((first, second)):
        apart["input_ids"][row, : len(ids)] = ids
        apart["input_mask"][row, : len(ids)] = 1
    pad = np.zeros(3, np.int32)
    packed = {
        "input_ids": np.concatenate([first, second, pad])[None].astype(np.int32),
        "input_mask": np.concatenate([np.ones(21), pad])[None].astype(np.int32),
        "segment_ids": np.zeros((1, length), np.int32),
        "position_ids": np.concatenate([np.arange(9), np.arange(12), pad])[None].astype(np.int32),
        "packed_segment_ids": np.repeat([1, 2, 0], [9, 12, 3])[None].astype(np.int32),
        "cls_positions": np.asarray([[0, 9]], np.int32),
        "masked_lm_positions": zeros[:1],
        "masked_lm_ids": zeros[:1],
        "masked_lm_weights": zeros[:1].astype(np.float32),
        "next_sentence_labels": zeros[:1],
        "next_sentence_weights": np.ones((1, 2), np.float32),
    }
    params = random_params(model, **trainer.model_inputs(apart))["params"]
    sums = jax.jit(functools.partial(trainer.compute_sums, model=model, deterministic=True))
    sums_apart, sums_packed = sums(params, apart), sums(params, packed)
    assert float(sums_packed["mlm_weight"]) == float(sums_apart["mlm_weight"]) == 8 + 11
    for key in ("mlm_loss_sum", "mlm_correct_sum"):
        np.testing.assert_allclose(float(sums_packed[key]), float(sums_apart[key]), rtol=1e-5)


def test_a_corpus_without_documents_prepares_without_nsp(tmp_path):
    """Tweets, queries: one sentence per line, no blank line. Pairs need two documents; the
    single-sequence formats do not."""
    from bert_jax.data.preparation.local_runner import prepare_records
    from bert_jax.data.preparation.settings import PrepareSettings
    from bert_jax.data.sources import embedded as sources
    from tests.data_fixtures import embedded_spm_dir

    corpus = tmp_path / "lines.txt"
    lines = [s for document in sources.embedded_documents("eval")[:5] for s in document]
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    settings = PrepareSettings(
        max_seq_length=32, max_predictions_per_seq=5, dupe_factor=1, objective="mlm"
    )
    result = prepare_records([str(corpus)], embedded_spm_dir(), tmp_path / "out", settings)
    assert result.corpus_stats.documents == 1 and result.instance_stats.instances > 0
    with pytest.raises(UserError, match="sentence pairs need at least two"):
        prepare_records(
            [str(corpus)],
            embedded_spm_dir(),
            tmp_path / "pairs",
            PrepareSettings(dupe_factor=1),
        )
