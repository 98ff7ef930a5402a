"""Fine-tuning steps equal Hugging Face PyTorch's, step for step: every head family (GLUE
classification and regression, SWAG multiple choice, SQuAD spans, CoNLL-2003 tags) trained by
`tuning_loop.run_steps` with `optimizer="adamw-hf"` beside the `transformers` model of the same
weights (task head included) trained with the Trainer's recipe (torch AdamW with its parameter
groups, `get_linear_schedule_with_warmup`, `clip_grad_norm_`) on the same batches, dropout off: the
loss of every step and the parameters after 20 steps agree. Also the step count and learning rates
of a dataset that does not divide the batch."""

from __future__ import annotations

import dataclasses
import functools
import math
import types

import jax
import numpy as np
import pytest

from bert_jax.convert import hf as hf_convert
from bert_jax.core import optim, partitioning
from bert_jax.finetune.runs import multiple_choice as swag_task
from bert_jax.finetune.tuning import batches as features
from bert_jax.finetune.tuning import sentence_tuning as loop
from bert_jax.finetune.tuning import token_tuning as token_loop
from bert_jax.finetune.tuning import tuning_loop
from bert_jax.finetune.tuning.settings import OPTIMIZERS, PretrainedEncoder
from bert_jax.runtime.errors import UserError
from tests.glue_fixtures.tiny import fixture_tokenizer, tiny_encoder
from tests.helpers import hf_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# 37 examples at batch 4: 10 steps an epoch, the last one holding a single example; 2 epochs.
NUM_EXAMPLES, BATCH_SIZE, SEQ_LEN = 37, 4, 16
SETTINGS = loop.FinetuneSettings(
    learning_rate=2e-4,
    epochs=2.0,
    batch_size=BATCH_SIZE,
    eval_batch_size=BATCH_SIZE,
    max_seq_length=SEQ_LEN,
    dropout=0.0,
    optimizer="adamw-hf",
    mesh_shape=(1, 1, 1),
    log_every=1000,
)
LOSS_RTOL = PARAM_ATOL = 1e-5


def parity_encoder(layers: int = 1) -> PretrainedEncoder:
    """The tiny random BERT encoder these tests start from, one layer deep unless said: a step's
    cost is its compile, and every layer runs the same code (tests/test_model.py holds deeper
    ones to transformers)."""
    config, params = tiny_encoder(0, num_hidden_layers=layers)
    return PretrainedEncoder(config, params["bert"], fixture_tokenizer(), "tiny-random")


@functools.cache
def one_device_mesh() -> jax.sharding.Mesh:
    return partitioning.make_mesh((1, 1, 1), devices=jax.devices()[:1])


def token_rows(rng: np.random.Generator, shape: tuple[int, ...], vocab: int) -> dict:
    """Random sentence pairs padded to SEQ_LEN: [CLS] a [SEP] b [SEP] 0 ..."""
    input_ids = np.zeros((*shape, SEQ_LEN), np.int32)
    input_mask = np.zeros_like(input_ids)
    segment_ids = np.zeros_like(input_ids)
    lengths = rng.integers(6, SEQ_LEN + 1, size=shape)
    for index in np.ndindex(*shape):
        length = int(lengths[index])
        input_ids[index][:length] = rng.integers(5, vocab, size=length)
        input_ids[index][0], input_ids[index][length - 1] = 2, 3  # [CLS] ... [SEP]
        input_mask[index][:length] = 1
        segment_ids[index][length // 2 : length] = 1
    return {"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids}


class Recorder:
    """The tuner `run_steps` drives, recording the host batches it is given and each step's loss."""

    def __init__(self, tuner):
        self.tuner = tuner
        self.batches: list[dict[str, np.ndarray]] = []
        self.losses: list[jax.Array] = []

    def global_batch(self, local_batch):
        self.batches.append({key: np.array(value) for key, value in local_batch.items()})
        return self.tuner.global_batch(local_batch)

    def train_step(self, state, batch, rng, learning_rate):
        state, metrics = self.tuner.train_step(state, batch, rng, learning_rate)
        self.losses.append(metrics["loss"])
        return state, metrics


def train_ours(tuner, rows_batch, encoder=None) -> tuple[Recorder, dict, dict]:
    """20 steps of `run_steps` from `encoder` (default: the tiny BERT); (the recorder, the params
    before, the params after) on the host."""
    encoder = encoder or parity_encoder()
    state = tuner.init(jax.random.key(0), encoder.bert_params)
    before = jax.tree.map(lambda x: np.array(x, copy=True), jax.device_get(state.params))
    recorder = Recorder(tuner)
    trained = tuning_loop.run_steps(
        recorder,
        state,
        jax.random.key(1),
        SETTINGS,
        NUM_EXAMPLES,
        rows_batch,
        evaluate=lambda params: {},
        log=lambda line: None,
    )
    assert trained.num_steps == len(recorder.batches) == 20
    after = jax.tree.map(np.asarray, jax.device_get(trained.state.params))
    return recorder, before, after


def hf_named(params: dict, head: str, config=None) -> dict[str, np.ndarray]:
    """bert-jax task-model params under the names of the Hugging Face task model: the encoder
    (`config`'s, default parity_encoder's) by the conversion table, `classifier/output` as
    `{head}.weight` / `{head}.bias`."""
    config = config or parity_encoder().config
    named = hf_convert.hf_state_dict_from({"bert": params["bert"]}, config)
    output = params["classifier"]["output"]
    named[f"{head}.weight"] = np.asarray(output["kernel"], np.float32).T
    named[f"{head}.bias"] = np.asarray(output["bias"], np.float32)
    return named


def reference_model(cls, head: str, params: dict, encoder_config=None, **config_fields):
    """The `transformers` model with our starting weights, dropout off."""
    encoder_config = encoder_config or parity_encoder().config
    config = hf_config(encoder_config)
    for key, value in config_fields.items():
        setattr(config, key, value)
    model = cls(config)
    named = hf_named(params, head, encoder_config)
    state = {key: torch.from_numpy(np.array(value)) for key, value in named.items()}
    missing, _unexpected = model.load_state_dict(state, strict=False)  # token heads: no pooler
    assert not missing
    return model


def span_padding_masked(cls):
    """transformers' question-answering model `cls` with the padding masked out of its span
    softmax, as bert-jax's span loss has it: the logits at padding positions set to
    `token_tuning.PADDING_LOGIT`, then its loss (the mean of the start and end cross-entropies).
    Unmasked, its loss would depend on how far a batch is padded."""

    class SpanPaddingMasked(cls):
        def forward(self, attention_mask, start_positions, end_positions, **inputs):
            outputs = super().forward(attention_mask=attention_mask, **inputs)
            padding = attention_mask == 0
            losses = [
                torch.nn.functional.cross_entropy(
                    logits.masked_fill(padding, token_loop.PADDING_LOGIT), positions
                )
                for logits, positions in (
                    (outputs.start_logits, start_positions),
                    (outputs.end_logits, end_positions),
                )
            ]
            return types.SimpleNamespace(loss=(losses[0] + losses[1]) / 2)

    return SpanPaddingMasked


def trainer_defaults() -> dict:
    """TrainingArguments' defaults, read from the dataclass (building one needs `accelerate`)."""
    return {f.name: f.default for f in dataclasses.fields(transformers.TrainingArguments)}


def train_reference(model, batches, to_inputs) -> list[float]:
    """Hugging Face's Trainer recipe on `batches` (only their rows of nonzero weight, as its
    DataLoader gives a last partial batch): its decay groups, torch AdamW, linear schedule with
    warmup, gradient clipping; one optimizer step per batch. Returns each step's loss."""
    args = trainer_defaults()
    decay = set(transformers.Trainer.get_decay_parameter_names(None, model))
    named = list(model.named_parameters())
    groups = [
        {"params": [p for n, p in named if n in decay], "weight_decay": SETTINGS.weight_decay},
        {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(
        groups,
        lr=SETTINGS.learning_rate,
        betas=(args["adam_beta1"], args["adam_beta2"]),
        eps=args["adam_epsilon"],
        fused=args["optim"] == "adamw_torch_fused",
    )
    total = len(batches)
    warmup = transformers.TrainingArguments.get_warmup_steps(
        types.SimpleNamespace(warmup_steps=SETTINGS.warmup_proportion), total
    )
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, warmup, total)
    model.train()
    losses = []
    for batch in batches:
        real = batch["weights"] > 0
        inputs = to_inputs({key: value[real] for key, value in batch.items()})
        loss = model(**{key: torch.from_numpy(np.array(v)) for key, v in inputs.items()}).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args["max_grad_norm"])
        optimizer.step()
        scheduler.step()
        model.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def model_inputs(batch: dict) -> dict:
    return {
        "input_ids": batch["input_ids"].astype(np.int64),
        "attention_mask": batch["input_mask"].astype(np.int64),
        "token_type_ids": batch["segment_ids"].astype(np.int64),
    }


def compare(
    name, recorder: Recorder, before, after, reference, ref_losses, head, ignore=(), config=None
):
    ours_losses = np.asarray(jax.device_get(recorder.losses), np.float64)
    relative = np.abs(ours_losses - ref_losses) / np.abs(ref_losses)
    ref_state = {
        key: value.detach().numpy()
        for key, value in reference.state_dict().items()
        if key not in ignore
    }
    ours, start = hf_named(after, head, config), hf_named(before, head, config)
    param_diff = max(float(np.max(np.abs(ours[key] - ref_state[key]))) for key in ref_state)
    moved = max(float(np.max(np.abs(ours[key] - start[key]))) for key in ref_state)
    print(
        f"{name}: per-step loss max relative diff {relative.max():.2e} over {len(relative)} steps; "
        f"params max abs diff {param_diff:.2e} (largest change in training {moved:.2e})"
    )
    assert moved > 100 * PARAM_ATOL  # the parameters move far beyond the tolerance
    assert relative.max() < LOSS_RTOL
    assert param_diff < PARAM_ATOL


def encoder_config(layers: int = 1):
    encoder = parity_encoder(layers)
    return encoder, tuning_loop.run_config(encoder, SETTINGS, one_device_mesh())


@pytest.mark.parametrize("num_labels", [3, 1], ids=["classification", "regression"])
def test_glue_steps_equal_transformers(num_labels):
    encoder, config = encoder_config()
    rng = np.random.default_rng(num_labels)
    rows = token_rows(rng, (NUM_EXAMPLES,), config.vocab_size)
    if num_labels == 1:
        labels = rng.uniform(-1, 1, NUM_EXAMPLES).astype(np.float32)
    else:
        labels = rng.integers(0, num_labels, NUM_EXAMPLES).astype(np.int32)
    guids = tuple(str(i) for i in range(NUM_EXAMPLES))
    split = features.EncodedSplit("train", guids, rows, labels)
    tuner = loop.fine_tuner(config, num_labels, one_device_mesh(), SETTINGS)
    recorder, before, after = train_ours(tuner, lambda r: features.gather_batch(split, r))
    reference = reference_model(
        transformers.BertForSequenceClassification, "classifier", before, num_labels=num_labels
    )

    def to_inputs(batch):
        labels = batch["labels"].astype(np.float32 if num_labels == 1 else np.int64)
        return {**model_inputs(batch), "labels": labels}

    losses = train_reference(reference, recorder.batches, to_inputs)
    name = "regression" if num_labels == 1 else "classification"
    compare(f"GLUE {name}", recorder, before, after, reference, losses, "classifier")


def test_swag_steps_equal_transformers():
    # Two layers: with one, rounding noise that Adam scales up moves a parameter 1.1e-5 from
    # transformers', past the tolerance.
    encoder, config = encoder_config(layers=2)
    rng = np.random.default_rng(4)
    arrays = token_rows(rng, (NUM_EXAMPLES, 4), config.vocab_size)
    arrays["labels"] = rng.integers(0, 4, NUM_EXAMPLES).astype(np.int32)
    tuner = swag_task.choice_tuner(config, one_device_mesh(), SETTINGS)
    recorder, before, after = train_ours(
        tuner, lambda r: token_loop.gather_rows(arrays, r), encoder
    )
    reference = reference_model(
        transformers.BertForMultipleChoice, "classifier", before, encoder.config
    )
    losses = train_reference(
        reference,
        recorder.batches,
        lambda batch: {**model_inputs(batch), "labels": batch["labels"].astype(np.int64)},
    )
    # The score's bias shifts every choice alike: no gradient in a softmax over the choices, but
    # for rounding noise, which Adam scales to steps of +-lr on either side.
    compare(
        "SWAG multiple choice",
        recorder,
        before,
        after,
        reference,
        losses,
        "classifier",
        ignore=("classifier.bias",),
        config=encoder.config,
    )


def test_squad_steps_equal_transformers():
    encoder, config = encoder_config()
    rng = np.random.default_rng(5)
    arrays = token_rows(rng, (NUM_EXAMPLES,), config.vocab_size)
    lengths = arrays["input_mask"].sum(axis=1)
    starts = np.array([rng.integers(0, n - 1) for n in lengths], np.int32)
    arrays["start_positions"] = starts
    arrays["end_positions"] = np.minimum(starts + rng.integers(0, 3, NUM_EXAMPLES), lengths - 1)
    arrays["end_positions"] = arrays["end_positions"].astype(np.int32)
    tuner = token_loop.token_tuner(config, 2, token_loop.SPAN, one_device_mesh(), 0.0, SETTINGS)
    inputs = {
        key: arrays[key] for key in (*token_loop.MODEL_KEYS, "start_positions", "end_positions")
    }
    recorder, before, after = train_ours(tuner, lambda r: token_loop.gather_rows(inputs, r))
    reference = reference_model(
        span_padding_masked(transformers.BertForQuestionAnswering), "qa_outputs", before
    )

    def to_inputs(batch):
        return {
            **model_inputs(batch),
            "start_positions": batch["start_positions"].astype(np.int64),
            "end_positions": batch["end_positions"].astype(np.int64),
        }

    losses = train_reference(reference, recorder.batches, to_inputs)
    # The output bias and the last LayerNorm's bias shift every position's logit alike: no
    # gradient in a softmax over positions, but for rounding noise that Adam scales up.
    last = f"bert.encoder.layer.{config.num_hidden_layers - 1}.output.LayerNorm.bias"
    ignore = ("qa_outputs.bias", last)
    compare("SQuAD spans", recorder, before, after, reference, losses, "qa_outputs", ignore)


def test_conll_steps_equal_transformers():
    encoder, config = encoder_config()
    num_tags = 9
    rng = np.random.default_rng(6)
    arrays = token_rows(rng, (NUM_EXAMPLES,), config.vocab_size)
    arrays["labels"] = rng.integers(0, num_tags, (NUM_EXAMPLES, SEQ_LEN)).astype(np.int32)
    # Labelled: the first sub-token of each word (here: a random share of the inner positions).
    inner = arrays["input_mask"].astype(bool)
    inner[:, 0] = False
    inner[np.arange(NUM_EXAMPLES), arrays["input_mask"].sum(axis=1) - 1] = False
    arrays["label_weights"] = (inner & (rng.uniform(size=inner.shape) < 0.7)).astype(np.float32)
    tuner = token_loop.token_tuner(
        config, num_tags, token_loop.TAGS, one_device_mesh(), 0.0, SETTINGS
    )
    recorder, before, after = train_ours(tuner, lambda r: token_loop.gather_rows(arrays, r))
    reference = reference_model(
        transformers.BertForTokenClassification, "classifier", before, num_labels=num_tags
    )

    def to_inputs(batch):
        labels = np.where(batch["label_weights"] > 0, batch["labels"], -100).astype(np.int64)
        return {**model_inputs(batch), "labels": labels}

    losses = train_reference(reference, recorder.batches, to_inputs)
    compare("CoNLL tags", recorder, before, after, reference, losses, "classifier")


def test_weight_decay_skips_what_the_trainer_skips():
    """The parameters our optimizers decay are, by name, those Hugging Face's Trainer decays."""
    encoder = parity_encoder()
    width = encoder.config.hidden_size
    params = {
        "bert": encoder.bert_params,
        "classifier": {"output": {"kernel": np.zeros((width, 2)), "bias": np.zeros(2)}},
    }
    mask = optim.decay_mask(params)
    as_arrays = jax.tree.map(lambda p, m: np.full(np.shape(p), float(m)), params, mask)
    decayed = {name for name, value in hf_named(as_arrays, "classifier").items() if value.all()}
    model = reference_model(transformers.BertForSequenceClassification, "classifier", params)
    assert decayed == set(transformers.Trainer.get_decay_parameter_names(None, model))


def test_steps_and_learning_rates_of_a_partial_last_batch_match_the_trainer():
    """999 examples at batch 16: 63 steps an epoch (the last one holds 7 examples), 189 in 3
    epochs, and the Trainer's learning rate at every one of them."""
    order = features.train_order(999, 3.0, 16, seed=0)
    loader = torch.utils.data.DataLoader(range(999), batch_size=16)  # the Trainer's: no drop_last
    assert len(loader) == features.steps_per_epoch(999, 16) == 63
    assert order.shape == (math.ceil(3.0 * len(loader)), 16) == (189, 16)
    for epoch in order.reshape(3, 63, 16):
        assert np.sum(epoch[-1] >= 0) == 7
        assert np.array_equal(np.sort(epoch[epoch >= 0]), np.arange(999))
    settings = dataclasses.replace(SETTINGS, learning_rate=2e-5, warmup_proportion=0.1)
    ours = tuning_loop.learning_rates(settings, len(order))
    parameter = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.AdamW([parameter], lr=settings.learning_rate)
    warmup = transformers.TrainingArguments.get_warmup_steps(
        types.SimpleNamespace(warmup_steps=0.1), len(order)
    )
    assert warmup == tuning_loop.warmup_steps("adamw-hf", 0.1, 189) == 19
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, warmup, len(order))
    reference = []
    for _ in range(len(order)):
        reference.append(scheduler.get_last_lr()[0])  # the rate this step's update uses
        optimizer.step()
        scheduler.step()
    np.testing.assert_allclose(ours, reference, rtol=1e-6, atol=1e-12)
    # The project's default recipe takes the same steps and the same decay from the warmup's end,
    # after google-research/bert's warmup (int(10%)); with decay_from="step-0", its schedule.
    bert = dataclasses.replace(settings, optimizer="bert")
    expected = optim.warmup_decay(2e-5, 18, 189, from_warmup_end=True)(np.arange(189))
    np.testing.assert_allclose(
        tuning_loop.learning_rates(bert, 189), np.asarray(expected), rtol=1e-6
    )
    original = dataclasses.replace(bert, decay_from="step-0")
    expected = optim.warmup_decay(2e-5, 18, 189)(np.arange(189))
    np.testing.assert_allclose(
        tuning_loop.learning_rates(original, 189), np.asarray(expected), rtol=1e-6
    )


@pytest.mark.parametrize("eps", [1e-8, 1e-6])
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_either_recipe_takes_adams_epsilon_from_the_setting(optimizer, eps):
    """Gradients near epsilon take steps that turn on it: two steps of either recipe's optimizer
    equal torch's AdamW with the setting's epsilon (rate 1, no decay or clipping)."""
    settings = dataclasses.replace(
        SETTINGS, optimizer=optimizer, adam_epsilon=eps, weight_decay=0.0, clip_norm=0.0
    )
    tx = tuning_loop.make_optimizer(settings)
    params = {"w": np.ones(4, np.float32)}
    grads = [np.array([1e-7, 3e-7, 1e-6, 1e-5], np.float32), np.array([2e-7, 0, 1e-6, -1e-5])]
    state, ours = tx.init(params), []
    for g in grads:
        update, state = tx.update({"w": g.astype(np.float32)}, state, params)
        ours.append(np.asarray(update["w"]))
    parameter = torch.ones(4, dtype=torch.float64, requires_grad=True)
    reference = torch.optim.AdamW([parameter], lr=1.0, eps=eps, weight_decay=0.0)
    for g, step in zip(grads, ours):
        before = parameter.detach().clone()
        parameter.grad = torch.tensor(g, dtype=torch.float64)
        reference.step()
        np.testing.assert_allclose(step, (parameter.detach() - before).numpy(), rtol=1e-4)


def test_an_unknown_optimizer_is_a_user_error_naming_the_setting():
    mesh = one_device_mesh()
    with pytest.raises(UserError, match="optimizer='adam' is not one of bert, adamw-hf"):
        tuning_loop.run_config(
            parity_encoder(), dataclasses.replace(SETTINGS, optimizer="adam"), mesh
        )
    no_correction = dataclasses.replace(SETTINGS, adam_bias_correction=False)
    with pytest.raises(UserError, match="adam_bias_correction=False goes with optimizer='bert'"):
        tuning_loop.run_config(parity_encoder(), no_correction, mesh)
    from_step_0 = dataclasses.replace(SETTINGS, decay_from="step-0")
    with pytest.raises(UserError, match="decay_from='step-0' goes with optimizer='bert'"):
        tuning_loop.run_config(parity_encoder(), from_step_0, mesh)


def test_the_runs_masks_come_from_its_dropout_impl_whatever_the_model_says(monkeypatch):
    """Fine-tuning draws the masks its `dropout_impl` says (the hash by default), whatever the
    model was pretrained with; a model whose attention is the fused kernel (it drops with the
    hash) refuses prng masks where the kernel runs, naming the flag."""
    from bert_jax.core import attention

    mesh = one_device_mesh()
    encoder = parity_encoder()
    dropped = dataclasses.replace(SETTINGS, dropout=0.1)
    assert tuning_loop.run_config(encoder, dropped, mesh).dropout_impl == "hash"
    flax_masks = dataclasses.replace(dropped, dropout_impl="prng")
    assert tuning_loop.run_config(encoder, flax_masks, mesh).dropout_impl == "prng"
    pretrained_prng = dataclasses.replace(
        encoder, config=encoder.config.replace(dropout_impl="prng")
    )
    assert tuning_loop.run_config(pretrained_prng, dropped, mesh).dropout_impl == "hash"
    fused = dataclasses.replace(encoder, config=encoder.config.replace(attention_impl="pallas"))
    assert tuning_loop.run_config(fused, flax_masks, mesh).dropout_impl == "prng"  # no kernel here
    monkeypatch.setattr(attention, "pallas_mode", lambda: "compiled")
    with pytest.raises(UserError, match=r"dropout_impl='prng' \(--dropout-impl\).*pallas"):
        tuning_loop.run_config(fused, flax_masks, mesh)
    assert tuning_loop.run_config(fused, dropped, mesh).dropout_impl == "hash"
    undropped = dataclasses.replace(flax_masks, dropout=0.0)
    assert tuning_loop.run_config(fused, undropped, mesh).attention_impl == "pallas"


@pytest.mark.parametrize("kind", ["glue", "swag"])
def test_the_initial_head_is_drawn_as_transformers_draws_it(kind):
    """The head a seed starts from: bert-jax's draws and transformers' `_init_weights` (normal at
    initializer_range, bias 0) come from one distribution, pooled over 40 seeds a side; the
    truncated normal an older bert-jax drew (std 0.88 x 0.02) is told apart by the same test."""
    from scipy import stats

    encoder, config = encoder_config()
    reference_config = hf_config(config)
    reference_config.initializer_range = config.initializer_range
    if kind == "glue":
        tuner = loop.fine_tuner(config, 3, one_device_mesh(), SETTINGS)  # the parity test's
        reference_class = transformers.BertForSequenceClassification
        reference_config.num_labels = 3
    else:
        tuner = swag_task.choice_tuner(config, one_device_mesh(), SETTINGS)
        reference_class = transformers.BertForMultipleChoice
    ours, theirs = [], []
    for seed in range(40):
        head = jax.device_get(tuner.init(jax.random.key(seed), encoder.bert_params).params)
        head = head["classifier"]["output"]
        assert not np.any(head["bias"])
        ours.append(np.ravel(head["kernel"]))
        torch.manual_seed(seed)
        model = reference_class(reference_config)
        assert not model.classifier.bias.detach().numpy().any()
        theirs.append(model.classifier.weight.detach().numpy().ravel())
    ours, theirs = np.concatenate(ours), np.concatenate(theirs)
    assert ours.size == theirs.size >= 2000
    assert abs(ours.std() / config.initializer_range - 1) < 0.05
    assert stats.ks_2samp(ours, theirs).pvalue > 0.01
    assert stats.levene(ours, theirs).pvalue > 0.01
    tail = np.mean(np.abs(ours) > 2 * config.initializer_range)  # a normal's: 4.55%
    assert 0.035 < tail < 0.056
    truncated = stats.truncnorm.rvs(
        -2, 2, scale=config.initializer_range, size=ours.size, random_state=0
    )
    assert stats.levene(truncated, theirs).pvalue < 0.01
