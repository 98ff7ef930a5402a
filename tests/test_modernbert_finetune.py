"""Fine-tuning a ModernBERT model through the task registry: `bert-jax finetune --task glue/RTE`
from a converted model directory; the classifier head (heads/modernbert_pooled.py) trained step
for step as transformers' ModernBertForSequenceClassification under the Trainer's recipe
(`optimizer="adamw-hf"`, dropout off), with CLS and with mean pooling; the token tasks refused in
one line."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
import torch
import transformers

from bert_jax import cli
from bert_jax.convert import hf_modernbert, modernbert_names
from bert_jax.finetune.heads.modernbert_pooled import with_dropout
from bert_jax.finetune.tuning import batches as features
from bert_jax.finetune.tuning import sentence_tuning as loop
from bert_jax.finetune.tuning import tuning_loop
from bert_jax.finetune.tuning.settings import PretrainedEncoder
from bert_jax.training.load_model import load_model_dir
from tests.glue_fixtures.tiny import GLUE_DIR
from tests.modernbert_fixtures import modernbert_dirs
from tests.test_finetune_parity import (  # noqa: F401 (one_torch_thread: an autouse fixture)
    NUM_EXAMPLES,
    PARAM_ATOL,
    SETTINGS,
    Recorder,
    one_device_mesh,
    one_torch_thread,
    token_rows,
    train_reference,
)

LOSS_RTOL = 1e-5


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return modernbert_dirs(tmp_path_factory.mktemp("modernbert_finetune"))


def test_a_glue_task_fine_tunes_from_a_modernbert_model(dirs, tmp_path, capsys):
    _, ours, _ = dirs
    argv = ["finetune", "--model", str(ours), "--task", "glue/RTE", "--data", GLUE_DIR]
    argv += ["--workdir", str(tmp_path / "rte"), "--epochs", "2", "--batch-size", "8"]
    argv += ["--eval-batch-size", "8", "--max-seq-length", "32", "--learning-rate", "1e-3"]
    assert cli.main(argv) == 0
    result = json.loads((tmp_path / "rte" / "result.json").read_text())
    assert result["model"] == str(ours) and result["num_train_steps"] > 0
    assert np.isfinite(result["train_loss"]) and "RTE" in result["dev_metrics"]
    assert cli.main(argv) == 0  # the finished run is found again, with the same model
    assert "reused" in capsys.readouterr().out


def test_token_tasks_refuse_a_modernbert_model_in_one_line(dirs, tmp_path, capsys):
    _, ours, _ = dirs
    argv = ["finetune", "--model", str(ours), "--task", "squad/v1.1", "--data", str(tmp_path)]
    assert cli.main([*argv, "--workdir", str(tmp_path / "squad")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"--model {ours} is a ModernBERT model: it fine-tunes on the GLUE tasks" in err
    assert "squad/v1.1 fine-tunes BERT models only" in err


def _hf_named(params: dict, config) -> dict[str, np.ndarray]:
    """Our classification params under transformers' ModernBertForSequenceClassification names."""
    named = modernbert_names.state_dict_from({"model": params["bert"]}, config)
    named = {f"model.{key}": value for key, value in named.items()}
    head = params["classifier"]
    named["head.dense.weight"] = np.asarray(head["head"]["dense"]["kernel"]).T
    named["head.dense.bias"] = np.asarray(head["head"]["dense"]["bias"])
    named["head.norm.weight"] = np.asarray(head["head"]["norm"]["scale"])
    named["head.norm.bias"] = np.asarray(head["head"]["norm"]["bias"])
    named["classifier.weight"] = np.asarray(head["output"]["kernel"]).T
    named["classifier.bias"] = np.asarray(head["output"]["bias"])
    return named


@pytest.mark.parametrize(
    ("num_labels", "pooling"),
    [(3, "cls"), (1, "mean")],
    ids=["classification-cls", "regression-mean"],
)
def test_steps_equal_transformers_sequence_classification(dirs, num_labels, pooling):
    _, ours, _ = dirs
    loaded = load_model_dir(ours)
    encoder = PretrainedEncoder(
        loaded.config.replace(classifier_pooling=pooling),
        loaded.params["model"],
        loaded.tokenizer,
    )
    config = loop.model_config(encoder, SETTINGS, one_device_mesh())
    assert config == with_dropout(encoder.config, 0.0)
    rng = np.random.default_rng(num_labels)
    rows = token_rows(rng, (NUM_EXAMPLES,), config.vocab_size)
    # ModernBERT's [CLS] 1, [SEP] 2 and [PAD] 3 where the BERT fixture has 2, 3 and 0.
    ids = rows["input_ids"]
    rows["input_ids"] = np.where(rows["input_mask"] == 1, np.where(ids <= 3, ids - 1, ids), 3)
    if num_labels == 1:
        labels = rng.uniform(-1, 1, NUM_EXAMPLES).astype(np.float32)
    else:
        labels = rng.integers(0, num_labels, NUM_EXAMPLES).astype(np.int32)
    split = features.EncodedSplit("train", tuple(map(str, range(NUM_EXAMPLES))), rows, labels)
    tuner = loop.fine_tuner(config, num_labels, one_device_mesh(), SETTINGS)
    state = tuner.init(jax.random.key(0), encoder.bert_params)
    before = jax.tree.map(lambda x: np.array(x, copy=True), jax.device_get(state.params))
    recorder = Recorder(tuner)
    trained = tuning_loop.run_steps(
        recorder,
        state,
        jax.random.key(1),
        SETTINGS,
        NUM_EXAMPLES,
        lambda r: features.gather_batch(split, r),
        evaluate=lambda params: {},
        log=lambda line: None,
    )
    after = jax.tree.map(np.asarray, jax.device_get(trained.state.params))

    values = hf_modernbert.hf_config_from(config, with_heads=True)
    hf_config = transformers.ModernBertConfig(
        **values, num_labels=num_labels, attn_implementation="eager"
    )
    reference = transformers.ModernBertForSequenceClassification(hf_config)
    state_dict = {k: torch.from_numpy(np.array(v)) for k, v in _hf_named(before, config).items()}
    reference.load_state_dict(state_dict, strict=True)

    def to_inputs(batch):
        labels = batch["labels"].astype(np.float32 if num_labels == 1 else np.int64)
        mask = batch["input_mask"].astype(np.int64)
        return {"input_ids": batch["input_ids"].astype(np.int64), "attention_mask": mask} | {
            "labels": labels
        }

    ref_losses = train_reference(reference, recorder.batches, to_inputs)
    ours_losses = np.asarray(jax.device_get(recorder.losses), np.float64)
    relative = np.abs(ours_losses - ref_losses) / np.abs(ref_losses)
    absolute = np.abs(ours_losses - ref_losses)
    ref_state = {k: v.detach().numpy() for k, v in reference.state_dict().items()}
    ours_after, start = _hf_named(after, config), _hf_named(before, config)
    param_diff = max(float(np.abs(ours_after[k] - ref_state[k]).max()) for k in ours_after)
    moved = max(float(np.abs(ours_after[k] - start[k]).max()) for k in ours_after)
    print(
        f"ModernBERT {pooling}: {len(relative)} steps, loss max relative diff "
        f"{relative.max():.2e} (abs {absolute.max():.2e}); params max abs diff "
        f"{param_diff:.2e} (moved {moved:.2e})"
    )
    assert trained.num_steps == 20 and moved > 100 * PARAM_ATOL
    # Relative, but absolute under a loss of 1: the last step's single row can score an MSE near
    # 0.01, where float32 rounding alone is 1e-5 of it.
    scale = np.maximum(np.abs(np.asarray(ref_losses)), 1.0)
    assert np.max(np.abs(ours_losses - ref_losses) / scale) < LOSS_RTOL
    assert param_diff < PARAM_ATOL
