"""`bert-jax bench --peer hf-torch*` at tiny size: the ratio lines it prints, and the first-step
loss both sides compute from the same initial weights with dropout off (the evidence that the
two steps do the same work). No timing is asserted."""

from __future__ import annotations

import json
import math
import os
import re

import pytest

from bert_jax import cli
from bert_jax.bench import spec as bench_spec
from bert_jax.runtime.errors import UserError

pytest.importorskip("torch")
pytest.importorskip("transformers")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One narrow layer, a 512-entry vocabulary, 4 rows of 16: the peer's process loads torch and
# transformers (most of this test's time), then runs 2 steps.
TINY = [
    "--config",
    os.path.join(REPO, "configs", "bert.py:tiny"),
    "--config.model.vocab_size=512",
    "--config.model.num_hidden_layers=1",
    "--config.model.hidden_dropout_prob=0",
    "--config.model.attention_probs_dropout_prob=0",
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
RATIO = re.compile(
    r"^bert-jax / (\S+): (\d+\.\d+)x median real tokens/s \(per chip\); window by window: "
    r"(\d+\.\d+)x by wall clock, (\d+\.\d+)x by CPU time$",
    re.MULTILINE,
)


def run_bench(capsys, *flags: str) -> str:
    assert cli.main(["bench", *TINY, *flags]) == 0
    return capsys.readouterr().out


def first_step_losses(out: str) -> dict[str, float]:
    (line,) = [x for x in out.splitlines() if x.startswith("first-step loss")]
    return {
        name: float(value)
        for name, value in re.findall(r"(\S+) (\d+\.\d+)", line.split(": ", 1)[1])
    }


def test_hf_torch_eager_trains_beside_ours_from_the_same_weights(capsys, tmp_path):
    out = run_bench(capsys, "--peer", "hf-torch-eager", "--json", str(tmp_path / "bench.json"))
    ((name, ratio, by_wall, by_cpu),) = RATIO.findall(out)
    assert name == "hf-torch-eager"
    assert all(math.isfinite(float(x)) and float(x) > 0 for x in (ratio, by_wall, by_cpu))
    assert re.search(r"^\| hf-torch-eager +\| +\d+\.\d \|", out, re.MULTILINE)
    # Both sides start from our initial parameters: dropout off, the first losses agree.
    losses = first_step_losses(out)
    assert set(losses) == {"bert-jax", "hf-torch-eager"}
    assert abs(losses["bert-jax"] - losses["hf-torch-eager"]) < 1e-4
    assert losses["bert-jax"] > math.log(512) * 0.9  # a fresh model: near ln(vocab) + ln(2)
    assert "our initial weights" in out and "scaled_dot_product_attention" in out
    report = json.loads((tmp_path / "bench.json").read_text())
    torch_side = report["sides"][1]
    assert torch_side["name"] == "hf-torch-eager" and torch_side["initial_weights"] == "ours"
    assert torch_side["windows"][0]["real_tokens"] == 4 * 16
    assert set(torch_side["versions"]) == {"torch", "transformers"}
    # The table prints two decimals: the JSON's ratio rounds to the printed one.
    printed = float(ratio)
    assert report["ratios"]["hf-torch-eager"]["tokens_per_sec"] == pytest.approx(printed, abs=0.005)


@pytest.mark.skipif(
    not os.environ.get("BERT_JAX_TEST_TORCH_COMPILE"),
    reason="torch.compile's first compile takes about a minute of CPU: make test-bench-torch",
)
def test_hf_torch_times_eager_and_compiled_and_the_faster_ratio(capsys):
    out = run_bench(capsys, "--peer", "hf-torch")
    ratios = {name: float(ratio) for name, ratio, _, _ in RATIO.findall(out)}
    assert set(ratios) == {"hf-torch-eager", "hf-torch-compiled"}
    (fastest, ratio) = re.findall(
        r"^bert-jax / the fastest other \((\S+)\): (\d+\.\d+)x", out, re.MULTILINE
    )[0]
    assert float(ratio) == min(ratios.values()) and ratios[fastest] == float(ratio)
    losses = first_step_losses(out)
    assert abs(losses["hf-torch-compiled"] - losses["bert-jax"]) < 1e-4
    assert abs(losses["hf-torch-eager"] - losses["bert-jax"]) < 1e-4


def test_peer_choices_and_what_the_torch_step_cannot_reproduce():
    assert bench_spec.peer_sides("hf-torch") == ("hf-torch-eager", "hf-torch-compiled")
    assert bench_spec.peer_sides("hf-flax, hf-torch,hf-torch-eager") == (
        "hf-flax",
        "hf-torch-eager",
        "hf-torch-compiled",
    )
    with pytest.raises(UserError, match="unknown peer 'hf-jax'"):
        bench_spec.peer_sides("hf-torch,hf-jax")


def test_torch_peer_refuses_what_it_cannot_reproduce(capsys):
    status = cli.main(
        ["bench", *TINY, "--config.optimizer.bias_correction=False", "--peer", "hf-torch"]
    )
    assert status == 2
    assert "config.optimizer.bias_correction=False" in capsys.readouterr().err
