"""SWAG: the official CSV layout (quoted commas, a malformed row), the multiple-choice scores
against Hugging Face's BertForMultipleChoice, and a tiny encoder learning a synthetic SWAG."""

from __future__ import annotations

import csv
import json
import random

import jax
import numpy as np
import pytest
import torch
import transformers

from bert_jax import cli
from bert_jax.convert import hf as hf_convert
from bert_jax.core import partitioning
from bert_jax.finetune.heads.pooled import BertForMultipleChoice
from bert_jax.finetune.runs import multiple_choice as swag_task
from bert_jax.finetune.tasks import swag
from tests.convert_fixtures import random_params
from tests.glue_fixtures.tiny import tiny_pretrained
from tests.helpers import hf_config, tiny_config

HEADER = list(swag.HEADER)


def _row(index, sent1, sent2, endings, label="0"):
    return [str(index), "anetv_x", "7", f"{sent1} {sent2}", sent1, sent2, "gold", *endings, label]


def _write(path, rows, header=HEADER):
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def test_reader_keeps_quoted_commas_and_quotes(tmp_path):
    rows = [
        _row(0, 'He says, "hello, there"', "she", ["nods, smiling.", "a", "b", 'c "d"'], "3"),
        _row(1, "Someone, somewhere", "", ["x", "y, z", "w", "v"], "1"),
    ]
    _write(tmp_path / "val.csv", rows)
    examples = swag.read_csv(str(tmp_path / "val.csv"))
    assert examples[0].sent1 == 'He says, "hello, there"'
    assert examples[0].endings == ("nods, smiling.", "a", "b", 'c "d"')
    assert [e.label for e in examples] == [3, 1]
    assert swag.choice_texts(examples[1])[1] == ("Someone, somewhere", "y, z")
    # test.csv: the official one has no label column.
    _write(tmp_path / "test.csv", [r[:-1] for r in rows], HEADER[:-1])
    test = swag.read_split(str(tmp_path), "test")
    assert [e.label for e in test] == [None, None] and test[1].example_id == "1"


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda r: r[:-2], r"val\.csv: row 2: expected 12 fields, found 10"),
        (lambda r: [*r[:-1], "7"], r"val\.csv: row 2: label '7' is not one of 0\.\.3"),
    ],
)
def test_a_malformed_row_is_one_line_naming_file_and_row(tmp_path, bad, message):
    good = _row(0, "a, b", "c", ["d", "e", "f", "g"])
    _write(tmp_path / "val.csv", [good, bad(_row(1, "a", "b", ["c", "d", "e", "f"])), good])
    with pytest.raises(swag.SwagDataError, match=message) as caught:
        swag.read_csv(str(tmp_path / "val.csv"))
    assert "\n" not in str(caught.value)


def test_features_pair_sent1_with_sent2_and_each_ending():
    encoder = tiny_pretrained()
    example = swag.SwagExample("0", "the man", "he", ("runs", "sits", "eats", "reads"), 2)
    arrays = swag.build_features([example], encoder.tokenizer, 16)
    assert arrays["input_ids"].shape == (1, 4, 16) and arrays["labels"].tolist() == [2]
    tok = encoder.tokenizer
    ids = arrays["input_ids"][0, 1]
    want = [tok.cls_id, *tok.encode("the man"), tok.sep_id, *tok.encode("he sits"), tok.sep_id]
    assert ids[: len(want)].tolist() == want
    assert arrays["segment_ids"][0, 1, : len(want)].tolist() == [0] * 4 + [1] * (len(want) - 4)


def test_choice_scores_equal_hugging_face_bert_for_multiple_choice():
    config = tiny_config(hidden_act="gelu")
    params = random_params(config, seed=5, with_heads=False)
    rng = np.random.default_rng(0)
    kernel = (0.1 * rng.standard_normal((config.hidden_size, 1))).astype(np.float32)
    bias = np.asarray([0.3], np.float32)
    params["classifier"] = {"output": {"kernel": kernel, "bias": bias}}
    state = hf_convert.hf_state_dict_from({"bert": params["bert"]}, config)
    state["classifier.weight"] = kernel.T
    state["classifier.bias"] = bias
    reference = transformers.BertForMultipleChoice(hf_config(config)).eval()
    missing, unexpected = reference.load_state_dict(
        {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}, strict=False
    )
    assert not unexpected and not [k for k in missing if "position_ids" not in k]
    batch, length = 3, 12
    input_ids = rng.integers(5, config.vocab_size, (batch, 4, length)).astype(np.int32)
    input_mask = np.ones_like(input_ids)
    input_mask[:, :, 9:] = 0
    input_mask[1, 2, 5:] = 0
    segment_ids = np.zeros_like(input_ids)
    segment_ids[:, :, 4:] = 1
    ours = BertForMultipleChoice(config).apply(
        {"params": params}, input_ids, input_mask, segment_ids, deterministic=True
    )
    with torch.no_grad():
        ref = reference(
            input_ids=torch.tensor(input_ids, dtype=torch.long),
            attention_mask=torch.tensor(input_mask, dtype=torch.long),
            token_type_ids=torch.tensor(segment_ids, dtype=torch.long),
        ).logits.numpy()
    error = float(np.max(np.abs(np.asarray(ours) - ref)))
    print(f"SWAG choice scores vs BertForMultipleChoice: max abs error {error:.2e}")
    assert ours.shape == (batch, 4)
    np.testing.assert_allclose(np.asarray(ours), ref, atol=1e-5, rtol=0)


def _synthetic_swag(path, count, seed, words, labelled=True):
    """The gold ending holds the word "good", the others do not; contexts are noise."""
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        label = rng.randrange(4)
        endings = [
            " ".join(rng.sample(words, 2) + (["good"] if i == label else [rng.choice(words)]))
            for i in range(4)
        ]
        sent1 = ", ".join(rng.sample(words, 3))  # commas inside a field
        row = _row(index, sent1, rng.choice(words), endings, str(label))
        rows.append(row)
    if labelled:
        _write(path, rows)
    else:
        _write(path, [r[:-1] for r in rows], HEADER[:-1])


def test_tiny_encoder_learns_synthetic_swag_resumes_and_refuses_bad_rows(tmp_path, capsys):
    encoder = tiny_pretrained()
    words = [t for t in encoder.tokenizer.vocab[120:] if t.isalpha() and len(t) > 3]
    words = [w for w in words if w != "good"][:30]
    assert "good" in encoder.tokenizer.vocab
    data = tmp_path / "swag"
    data.mkdir()
    _synthetic_swag(data / "train.csv", 128, 1, words)
    _synthetic_swag(data / "val.csv", 32, 2, words)
    _synthetic_swag(data / "test.csv", 8, 3, words, labelled=False)
    settings = swag_task.task_settings(
        dict(max_seq_length=16, epochs=3.0, learning_rate=1e-3, dropout=0.0, eval_every_epoch=True)
    )
    mesh = partitioning.make_mesh((1, 1, 1), jax.devices()[:1])
    workdir = tmp_path / "run"
    result = swag_task.run_swag(encoder, str(data), str(workdir), settings, mesh=mesh)
    assert result["dev_metrics"]["accuracy"] > 90
    assert result["settings"]["batch_size"] == 16 and result["num_train_steps"] == 24
    assert [h["epoch"] for h in result["history"]] == [1.0, 2.0, 3.0]
    assert json.loads((workdir / "result.json").read_text())["dev_metrics"] == result["dev_metrics"]
    test_lines = (workdir / "test_predictions.csv").read_text().splitlines()
    assert test_lines[0] == "id,prediction,score0,score1,score2,score3" and len(test_lines) == 9
    report = (workdir / "results.md").read_text()
    assert "| BERT-Base (paper, dev) | 81.6 |" in report
    # Beside the score, the majority class's: the ending most often gold on dev, for every example.
    gold = [example.label for example in swag.read_split(str(data), "dev")]
    majority = max(range(4), key=gold.count)
    baseline = result["dev_baseline"]["swag"]
    assert baseline["prediction"] == f"ending{majority}"
    assert baseline["metrics"]["accuracy"] == pytest.approx(100 * gold.count(majority) / len(gold))
    assert f"| majority class (dev: ending{majority} for every example) |" in report
    assert result["prediction_summary"]["dev"]["swag"]["single"] is None  # it learnt the task
    assert "predicts a single class" not in report
    assert (workdir / "plots" / "swag.png").stat().st_size > 1000
    # Run again: the finished run is reused, nothing trains.
    again = swag_task.run_swag(encoder, str(data), str(workdir), settings, mesh=mesh)
    assert again["finished_at"] == result["finished_at"]
    # The command: a malformed row is one line and exit status 2.
    with open(data / "val.csv", "a", encoding="utf-8") as f:
        f.write('99,"unclosed, row\n')
    code = cli.main(
        ["finetune", "--task", "swag", "--model", "unused", "--data", str(data), "--workdir",
         str(tmp_path / "other")]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "val.csv: row 33: expected 12 fields, found 2" in err, err
    assert len(err.strip().splitlines()) == 1
    print(f"synthetic SWAG dev accuracy {result['dev_metrics']['accuracy']:.1f}")  # after capsys
