"""The commands that read a model, on a ModernBERT model directory, against transformers:
`encode` (ModernBertModel's hidden states, pooled by [CLS], by mean, or every token), `fill-mask`
(the fill-mask pipeline's ids and probabilities) and `eval` (MLM accuracy and perplexity of
ModernBertForMaskedLM on records prepared with the model's tokenizer). One random model with
sliding-window layers and a BPE tokenizer.json built here, converted once for the module."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers

from bert_jax import cli
from bert_jax.data.records.tfrecord import read_records
from bert_jax.inference.encode import encode_texts
from bert_jax.inference.fill_mask import fill_mask
from bert_jax.training.load_model import load_model_dir
from tests.modernbert_fixtures import TEXT, fast_tokenizer, modernbert_dirs

TOLERANCE = 1e-5
TEXTS = [
    "The quick fox reads the news.",
    "Rotary positions turn queries ||| and keys by their position, near and far away.",
    "dog",
]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    hf_dir, ours, model = modernbert_dirs(tmp_path_factory.mktemp("modernbert_use"))
    return hf_dir, ours, model, fast_tokenizer(hf_dir)


def _hf_hidden_states(model, fast, texts):
    """transformers' hidden states [N, L, D] per layer (0: embeddings, -1: after the final
    norm) and the attention mask, for the texts tokenized by the fast tokenizer."""
    firsts = [t.split(" ||| ")[0] for t in texts]
    seconds = [t.split(" ||| ")[1] if " ||| " in t else None for t in texts]
    rows = [fast(a, b)["input_ids"] for a, b in zip(firsts, seconds)]
    length = max(map(len, rows))
    ids = np.full((len(rows), length), fast.pad_token_id)
    mask = np.zeros((len(rows), length), np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = row, 1
    with torch.no_grad():
        out = model.model(
            input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
            output_hidden_states=True,
        )  # fmt: skip
    return [h.numpy() for h in out.hidden_states], mask


@pytest.mark.parametrize("pool", ["cls", "mean", "none"])
def test_encode_equals_transformers_hidden_states(dirs, tmp_path, pool):
    _, ours, model, fast = dirs
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "features.npy"
    argv = ["encode", "--model", str(ours), "--input", str(texts), "--output", str(out)]
    assert cli.main([*argv, "--pool", pool, "--batch-size", "2"]) == 0
    features = np.load(out)
    states, mask = _hf_hidden_states(model, fast, TEXTS)
    last = states[-1]
    if pool == "cls":
        expected = last[:, 0]
    elif pool == "mean":
        expected = (last * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    else:
        assert features.shape == last.shape
        assert np.load(tmp_path / "features.lengths.npy").tolist() == mask.sum(1).tolist()
        expected, features = last * mask[..., None], features * mask[..., None]
    assert np.abs(features - expected).max() <= TOLERANCE


def test_encode_layers_index_transformers_hidden_states(dirs):
    _, ours, model, fast = dirs
    loaded = load_model_dir(ours)
    features = encode_texts(loaded, TEXTS[:1], pool="cls", layers="0,1,-2,-1").features
    states, _ = _hf_hidden_states(model, fast, TEXTS[:1])
    expected = np.concatenate([states[i][:, 0] for i in (0, 1, -2, -1)], axis=-1)
    assert np.abs(features - expected).max() <= TOLERANCE


FILL = [
    "The lazy [MASK] sleeps.",
    "Encoders read the [MASK] sentence at once; [MASK] read it left to right.",
    "[MASK]",
]


def test_fill_mask_equals_the_transformers_pipeline(dirs):
    hf_dir, ours, model, fast = dirs
    pipeline = transformers.pipeline("fill-mask", model=model, tokenizer=fast, top_k=5)
    results = fill_mask(str(ours), FILL, top_k=5)
    for text, result in zip(FILL, results):
        # [MASK] takes the space before it (lstrip), as in ModernBERT's tokenizer.json.
        expected = pipeline(text)
        expected = [expected] if isinstance(expected[0], dict) else expected
        assert len(result.masks) == len(expected)
        for mask, theirs in zip(result.masks, expected):
            assert [c.token_id for c in mask.candidates] == [t["token"] for t in theirs]
            scores = [c.score for c in mask.candidates]
            assert np.abs(np.array(scores) - [t["score"] for t in theirs]).max() <= TOLERANCE


def test_fill_mask_command_on_a_modernbert_model(dirs, capsys):
    _, ours, _, _ = dirs
    assert cli.main(["fill-mask", "--model", str(ours), FILL[0], "--json"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["masks"][0]["position"] == 3  # [CLS] The lazy [MASK]


def test_eval_equals_transformers_mlm_loss_on_records_of_its_tokenizer(dirs, tmp_path, capsys):
    _, ours, model, _ = dirs
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(TEXT * 3) + "\n")
    records = tmp_path / "records"
    prepare = ["data", "prepare", "--input", str(corpus), "--tokenizer", f"{ours}/tokenizer"]
    prepare += ["--output", str(records), "--objective", "mlm", "--max-seq-length", "24"]
    prepare += ["--max-predictions-per-seq", "4", "--dupe-factor", "2", "--masked-lm-prob", "0.2"]
    assert cli.main(prepare) == 0
    capsys.readouterr()
    assert cli.main(["eval", "--model", str(ours), "--data", str(records), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["objective"] == "mlm" and "nsp_accuracy" not in result

    loss_sum = correct = weight = 0.0
    for batch in read_records(str(records), 24, 4):
        with torch.no_grad():
            logits = model(
                input_ids=torch.tensor(batch["input_ids"]).long(),
                attention_mask=torch.tensor(batch["input_mask"]),
            ).logits.numpy()
        picked = np.take_along_axis(logits, batch["masked_lm_positions"][..., None], axis=1)
        log_probs = torch.log_softmax(torch.tensor(picked, dtype=torch.float64), -1).numpy()
        target = np.take_along_axis(log_probs, batch["masked_lm_ids"][..., None], -1)[..., 0]
        weights = batch["masked_lm_weights"]
        loss_sum -= float((target * weights).sum())
        correct += float(((picked.argmax(-1) == batch["masked_lm_ids"]) * weights).sum())
        weight += float(weights.sum())
    assert result["examples"] > 4 and weight > 0
    diff = result["mlm_loss"] - loss_sum / weight
    print(f"eval: {result['examples']} records, MLM loss diff {diff:.1e}")
    assert abs(result["mlm_loss"] - loss_sum / weight) <= 1e-5
    assert abs(result["mlm_perplexity"] - np.exp(loss_sum / weight)) <= 1e-3
    assert result["mlm_accuracy"] == pytest.approx(correct / weight, abs=1e-9)
