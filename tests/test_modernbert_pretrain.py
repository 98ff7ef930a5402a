"""Pretraining a ModernBERT model (config.model.family "modernbert", `--config modernbert:SIZE`):
the run follows the recipe's trapezoidal schedule, resumes exactly after SIGTERM, and its export
becomes a transformers ModernBertForMaskedLM that computes what ours does.

One small run (modernbert:tiny made smaller: 2 layers of width 32, a sliding-window layer after
the global one, length 32) is the reference the others compare with step by step.
"""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from bert_jax.configs import modernbert as modernbert_configs
from bert_jax.core import optim
from bert_jax.training import config_lib, pretrain
from tests.helpers import set_keys
from tests.test_pretrain import losses_by_step, sigterm_at

STEPS = 8


def small_config(shared_dirs, **overrides):  # noqa: F811
    """modernbert:tiny's recipe (MLM at 30%, full_sentences, the trapezoid) at a size that
    compiles in seconds: one phase of 8 steps at length 32, the shared 1000-piece tokenizer."""
    config = modernbert_configs.get_config("tiny")
    set_keys(
        config,
        {
            "total_steps": STEPS,
            "phase1.fraction": 1.0,
            "phase2.fraction": 0.0,
            "phase1.max_seq_length": 32,
            "phase1.max_predictions_per_seq": 10,
            "phase1.batch_size": 8,
            "model.hidden_size": 32,
            "model.intermediate_size": 48,
            "model.local_attention": 8,
            "optimizer.warmup_steps": 2,
            "optimizer.decay_fraction": 0.5,
            "data.tokenizer": shared_dirs["tokenizer"],
            "data.cache_dir": shared_dirs["cache"],
            "data.shuffle_buffer_size": 100,
            "checkpoint.every_steps": 4,
            "log_every_steps": 1,
            "eval.every_steps": 0,
            **overrides,
        },
    )
    return config


@pytest.fixture
def reference(modernbert_reference):
    """The reference run (tests/conftest.py: one per test process, shared with
    test_modernbert_loose_ends)."""
    return modernbert_reference


def test_the_run_trains_modernbert_on_the_trapezoid(reference):
    """The run's model is ModernBERT's (its export says so); the logged rates are the wsd
    schedule's: warmup, the peak held, then 1 - sqrt over the last half."""
    from bert_jax.convert import model_dir
    from bert_jax.core.modernbert_config import ModernBertConfig
    from bert_jax.training import metric_writers

    workdir, result = reference
    rows = metric_writers.read_jsonl(os.path.join(workdir, "metrics.jsonl"), kind="train")
    schedule = optim.warmup_decay(1e-3, 2, STEPS, decay="wsd", decay_fraction=0.5)
    logged = [row["learning_rate"] for row in sorted(rows, key=lambda r: r["step"])]
    expected = [float(schedule(step)) for step in range(STEPS)]
    np.testing.assert_allclose(logged, expected, rtol=1e-6)
    assert expected[2:5] == pytest.approx([1e-3] * 3) and expected[5] < 0.999e-3
    assert all(np.isfinite(row["loss"]) and "nsp_loss" not in row for row in rows)
    config, _ = model_dir.read_config(result.model_dir)
    assert isinstance(config, ModernBertConfig)
    assert config.layer_types == ("full_attention", "sliding_attention")
    assert (config.vocab_size, config.pad_token_id) == (1000, 0)  # the tokenizer's


def test_sigterm_then_resume_is_exact(reference, shared_dirs, tmp_path):  # noqa: F811
    workdir = str(tmp_path / "run")
    config = small_config(shared_dirs, export_model=False)
    first = pretrain.pretrain(config, workdir, step_hook=sigterm_at(4))
    assert first.preempted and first.final_step == 5
    second = pretrain.pretrain(small_config(shared_dirs, export_model=False), workdir)
    assert second.final_step == STEPS and not second.preempted
    expected = losses_by_step(reference[0])
    got = losses_by_step(workdir)
    assert [got[s] for s in range(1, STEPS + 1)] == [expected[s] for s in range(1, STEPS + 1)]


def test_the_export_is_a_transformers_modernbert_computing_the_same(reference, tmp_path):
    """`convert --to hf` of the run's model directory loads as ModernBertForMaskedLM with no
    missing or unexpected weight, and its logits equal ours (float32)."""
    import torch
    import transformers

    from bert_jax.cli import main
    from bert_jax.convert import model_dir
    from bert_jax.core.trainer import pretraining_model

    _, result = reference
    out = tmp_path / "hf"
    assert main(["convert", "--from", "bert-jax", result.model_dir, "--to", "hf", str(out)]) == 0
    theirs, info = transformers.ModernBertForMaskedLM.from_pretrained(
        str(out), output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    loaded = model_dir.load_model_dir(result.model_dir)
    ids = np.array([[2, 17, 93, 401, 5, 3, 0, 0], [2, 8, 999, 44, 61, 7, 250, 3]], np.int32)
    mask = (ids != 0).astype(np.int32)
    ours = pretraining_model(loaded.config).apply({"params": loaded.params}, ids, mask)
    ours = np.asarray(jax.device_get(ours["mlm_logits"]))
    with torch.no_grad():
        logits = theirs.eval()(
            input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask)
        ).logits.numpy()
    real = mask.astype(bool)
    np.testing.assert_allclose(ours[real], logits[real], atol=1e-4)
    assert config_lib.count_parameters(loaded.config) == theirs.num_parameters()
