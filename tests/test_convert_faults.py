"""`bert-jax convert --from hf` of damaged transformers directories, as a user meets them: one
line naming the file and what is wrong, exit 2, nothing written; `--drop-heads` is suggested only
where the heads are the problem (the encoder converts alone)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers

from bert_jax.convert.safetensors import read_safetensors, write_safetensors
from tests.faults import assert_user_error, run_cli
from tests.helpers import hf_config, tiny_config
from tests.modernbert_fixtures import CONFIG, hf_masked_lm

HINT = "--drop-heads"


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """A random transformers ModernBertForMaskedLM and BertForSequenceClassification, saved."""
    root = tmp_path_factory.mktemp("sources")
    hf_masked_lm(CONFIG).save_pretrained(root / "modernbert")
    torch.manual_seed(0)
    config = hf_config(tiny_config(num_hidden_layers=1))
    config.num_labels = 3
    transformers.BertForSequenceClassification(config).save_pretrained(root / "bert")
    return root


def _damaged(sources, tmp_path, family, drop=None, config_without=None):
    """A copy of the family's directory without tensor `drop` or config.json key."""
    out = tmp_path / f"{family}-damaged"
    shutil.copytree(sources / family, out)
    if config_without is not None:
        values = json.loads((out / "config.json").read_text())
        del values[config_without]
        (out / "config.json").write_text(json.dumps(values))
    if drop is not None:
        weights = read_safetensors(out / "model.safetensors")
        tensors = {name: weights.read(name) for name in weights.shapes if name != drop}
        write_safetensors(out / "model.safetensors", tensors, {"format": "pt"})
    return out


def _convert(capsys, source, tmp_path):
    outcome = run_cli(
        capsys,
        ["convert", "--from", "hf", str(source), "--to", "bert-jax"] + [str(tmp_path / "out")],
    )
    assert not (tmp_path / "out").exists()
    return outcome


def test_a_modernbert_config_without_its_layer_count_names_the_key(sources, tmp_path, capsys):
    source = _damaged(sources, tmp_path, "modernbert", config_without="num_hidden_layers")
    outcome = _convert(capsys, source, tmp_path)
    assert_user_error(outcome, f"{source / 'config.json'} has no 'num_hidden_layers'")
    assert "layer_types" not in outcome.message


@pytest.mark.parametrize(
    "family, tensor, hint",
    [
        ("modernbert", "model.layers.1.attn.Wo.weight", False),  # the encoder's: no hint
        ("modernbert", "head.dense.weight", True),  # the head's: the encoder converts alone
        ("bert", "bert.encoder.layer.0.output.dense.weight", False),
        ("bert", "classifier.bias", True),  # a BertForSequenceClassification's head
    ],
)
def test_drop_heads_is_suggested_only_where_it_helps(
    sources, tmp_path, capsys, family, tensor, hint
):
    outcome = _convert(capsys, _damaged(sources, tmp_path, family, drop=tensor), tmp_path)
    assert outcome.code == 2 and "Traceback" not in outcome.err
    assert f"missing tensor '{tensor}'" in outcome.err
    assert (HINT in outcome.err) == hint, outcome.err
    if hint:  # and it does help: the encoder converts alone
        source = tmp_path / f"{family}-damaged"
        argv = ["convert", "--from", "hf", str(source), "--to", "bert-jax", str(tmp_path / "out")]
        assert run_cli(capsys, [*argv, HINT]).code == 0
