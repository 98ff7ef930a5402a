"""A ModernBERT pretraining workdir and model directory where BERT's were read: the workdir's
checkpoint read as a model keeps the run's special-token ids, config.init_from starts a run of
the same family (and refuses the other), and adamw-hf leaves the [PAD] row of ModernBERT's
token embeddings untrained, as transformers does."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.configs import bert as bert_configs
from bert_jax.convert import model_dir
from bert_jax.core import hf_adamw
from bert_jax.core.modernbert_config import ModernBertConfig
from bert_jax.core.trainer import pretraining_model
from bert_jax.data.tokenizers.load_or_train import load_tokenizer
from bert_jax.finetune.tuning import tuning_loop
from bert_jax.finetune.tuning.settings import FinetuneSettings
from bert_jax.runtime.errors import UserError
from bert_jax.training import load_model, pretrain
from tests.helpers import random_params
from tests.test_modernbert_pretrain import reference, small_config  # noqa: F401
from tests.test_pretrain import losses_by_step


def test_the_workdirs_checkpoint_keeps_the_runs_special_ids(reference):  # noqa: F811
    workdir, _ = reference
    loaded = load_model.load_workdir_checkpoint(workdir, load_params=False)
    tokenizer = load_tokenizer(f"{workdir}/tokenizer")
    config = loaded.config
    assert isinstance(config, ModernBertConfig)
    assert (config.pad_token_id, config.cls_token_id, config.sep_token_id) == (
        tokenizer.pad_id,
        tokenizer.cls_id,
        tokenizer.sep_id,
    )
    assert config == load_model.load_model_dir(f"{workdir}/model", load_params=False).config


def test_init_from_a_modernbert_model(reference, shared_dirs, tmp_path):  # noqa: F811
    workdir, _ = reference
    model = f"{workdir}/model"
    exported = load_model.load_model_dir(model).params
    config = small_config(shared_dirs, total_steps=1, init_from=model)
    result = pretrain.pretrain(config, str(tmp_path / "from_model"))
    assert result.final_step == 1
    # The first step's loss is the trained model's: below the fresh model's on the same batch.
    assert result.last_train["loss"] < losses_by_step(workdir)[1] - 0.05
    assert exported["model"]["embeddings"]["tok_embeddings"]["embedding"].shape[0] >= 1000


# One layer, 64 ids padded to a multiple of 8, [PAD] at 0.
TINY_MODERNBERT = ModernBertConfig(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=24,
    num_hidden_layers=1,
    num_attention_heads=2,
    pad_token_id=0,
    vocab_pad_multiple=8,
)


def test_init_from_a_model_of_the_other_family_is_refused(shared_dirs, tmp_path):
    """Refused from the model directory's config.json, before anything is built or read."""
    model = tmp_path / "modernbert_model"
    model.mkdir()
    payload = model_dir.config_dict(TINY_MODERNBERT, has_heads=True, tokenizer=None, extra=None)
    (model / model_dir.CONFIG_NAME).write_text(json.dumps(payload), encoding="utf-8")
    bert_config = bert_configs.get_config("tiny")
    bert_config.init_from = str(model)
    bert_config.data.tokenizer = shared_dirs["tokenizer"]
    with pytest.raises(UserError, match=r"config\.init_from=.* is a modernbert model; this run"):
        pretrain.pretrain(bert_config, str(tmp_path / "bert_from_modernbert"))


def test_adamw_hf_leaves_modernberts_pad_row_untrained():
    config = TINY_MODERNBERT
    model = pretraining_model(config)
    ids = jnp.array([[2, 5, 0, 7]], jnp.int32)
    params = random_params(model, ids, jnp.ones_like(ids))["params"]  # the init is not tested
    settings = FinetuneSettings(optimizer="adamw-hf")
    tx = hf_adamw.torch_adamw(lambda _: 1e-3)
    loss_params = tuning_loop.loss_params(settings, config.pad_token_id)

    @jax.jit  # eagerly, the update goes op by op (seconds on CPU)
    def first_update(params):
        # A gradient of one for every parameter, as the loss reads them under "adamw-hf".
        grads = jax.grad(lambda p: sum(jnp.sum(leaf) for leaf in jax.tree.leaves(loss_params(p))))(
            params
        )
        return tx.update(grads, tx.init(params), params)[0]

    updates = first_update(params)
    table = np.asarray(updates["model"]["embeddings"]["tok_embeddings"]["embedding"])
    pad_row = np.asarray(params["model"]["embeddings"]["tok_embeddings"]["embedding"])[0]
    # The [PAD] row moves by the decoupled weight decay alone (no gradient step); others by both.
    np.testing.assert_allclose(table[0], -1e-3 * 0.01 * pad_row, rtol=1e-5, atol=1e-12)
    assert np.abs(table[1:]).min() > 1e-4
