"""`bert-jax bench --config configs/modernbert.py:SIZE`: the spec of a ModernBERT model (its JSON
round trip, its FLOPs), and transformers' ModernBertForMaskedLM timed beside ours from the same
weights (the first-step losses agree). No timing is asserted."""

from __future__ import annotations

import json
import os
import re

import pytest

from bert_jax import cli
from bert_jax.bench import spec as bench_spec
from bert_jax.bench.settings import BenchSettings
from bert_jax.configs import modernbert as modernbert_configs
from bert_jax.core.modernbert_config import ModernBertConfig
from bert_jax.training import flops

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A 512-entry vocabulary, 4 rows of 16, a sliding window of 8 in the second layer.
TINY = [
    "--config",
    os.path.join(REPO, "configs", "modernbert.py:tiny"),
    "--config.model.vocab_size=512",
    "--config.model.local_attention=8",
    "--seq-len",
    "16",
    "--batch",
    "4",
    "--steps",
    "1",
    "--windows",
    "1",
    "--warmup",
    "1",
]


def test_spec_of_a_modernbert_config_round_trips_and_counts_its_flops():
    config = modernbert_configs.get_config("tiny")
    spec = bench_spec.spec_from_config(config, BenchSettings(seq_len=64, batch_size=2))
    assert isinstance(spec.model, ModernBertConfig)
    # Synthetic rows leave ids 0-4 out: the special ids are the reserved layout's, in range.
    assert (spec.model.pad_token_id, spec.model.cls_token_id, spec.model.sep_token_id) == (0, 2, 3)
    assert bench_spec.spec_from_json(json.loads(json.dumps(bench_spec.spec_to_json(spec)))) == spec
    share = spec.max_predictions / spec.seq_len
    assert bench_spec.model_flops_per_token(spec) == flops.flops_per_token(spec.model, 64, share)
    padded = spec.model.replace(vocab_size=spec.model.padded_vocab_size)
    assert bench_spec.hardware_flops_per_position(spec) == flops.flops_per_token(padded, 64, share)


def test_hf_flax_peer_is_refused_for_modernbert(capsys):
    assert cli.main(["bench", *TINY, "--peer", "hf-flax"]) == 2
    err = capsys.readouterr().err
    assert "--peer hf-flax" in err and "ModernBERT" in err and "Traceback" not in err


def test_modernbert_for_masked_lm_trains_beside_ours_from_the_same_weights(capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    assert cli.main(["bench", *TINY, "--peer", "hf-torch-eager"]) == 0
    out = capsys.readouterr().out
    assert "\nbert-jax bench: ModernBERT, 2 layers" in out
    assert re.search(r"^\| hf-torch-eager +\| +\d+\.\d \|", out, re.MULTILINE)
    (line,) = [x for x in out.splitlines() if x.startswith("first-step loss")]
    losses = dict(re.findall(r"(\S+) (\d+\.\d+)", line.split(": ", 1)[1]))
    assert set(losses) == {"bert-jax", "hf-torch-eager"}
    assert abs(float(losses["bert-jax"]) - float(losses["hf-torch-eager"])) < 1e-4
    assert "sliding window as a mask" in out and "NSP" not in out
