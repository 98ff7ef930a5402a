"""Fine-tuned models to and from transformers, as a user moves them: `bert-jax convert --from
bert-jax FINETUNED --to hf OUT` of a fine-tuned model directory (every head kind, both families:
tiny random encoders with the real all-MiniLM-L6-v2 WordPiece vocabulary) loads strictly as
transformers' class (no missing, unexpected or mismatched key) with its labels, its logits equal
bert-jax's forward of the same params to 1e-5 on real sentences, and transformers' pipelines
(text-classification, question-answering, token-classification) give `bert-jax predict`'s
predictions on the same inputs (multiple choice has no pipeline: the class's logits). And `convert
--from hf` of a transformers model of each class (random weights, "fine-tuned elsewhere") gives a
fine-tuned model directory with the task entry and tokenizer, that `predict` reads and that exports
back to the same tensors."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
import transformers

from bert_jax import cli
from bert_jax.convert import hf, hf_modernbert, model_dir, modernbert_names, task_heads
from bert_jax.convert.safetensors import read_safetensors
from bert_jax.core.model import BertConfig
from bert_jax.core.modernbert_config import ModernBertConfig
from bert_jax.data.tokenizers.load_or_train import load_tokenizer
from bert_jax.finetune.heads import modernbert_pooled, per_token, pooled
from bert_jax.finetune.tuning.settings import load_pretrained
from bert_jax.inference.predict import predict
from tests.convert_fixtures import random_params
from tests.helpers import REAL_SENTENCES, minilm_dir
from tests.modernbert_fixtures import TINY, hf_masked_lm, params_from_hf

TOLERANCE = 1e-5
LABELS = {
    "classification": ["contradiction", "entailment", "neutral"],
    "tags": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"],
}
TASKS = {"classification": "glue/MNLI", "regression": "glue/STS-B", "multiple_choice": "swag"}
TASKS |= {"span": "squad", "tags": "conll2003"}
AUTO_CLASSES = {
    "classification": transformers.AutoModelForSequenceClassification,
    "regression": transformers.AutoModelForSequenceClassification,
    "multiple_choice": transformers.AutoModelForMultipleChoice,
    "span": transformers.AutoModelForQuestionAnswering,
    "tags": transformers.AutoModelForTokenClassification,
}
PAIRS = [(REAL_SENTENCES[i], REAL_SENTENCES[i + 1]) for i in range(0, 6, 2)]
QUESTIONS = [
    ("Who pretrained the model?", "The model was pretrained by a small team in Paris last year."),
    ("What hides tokens?", REAL_SENTENCES[2] + " " + REAL_SENTENCES[3]),
]
WORDS = [s.rstrip(".").split() for s in REAL_SENTENCES[:3]]
CHOICES = [("The cat sat on the", ["mat.", "moon.", "idea of it.", "rug by the door."])]


def _config(family: str, tokenizer) -> BertConfig | ModernBertConfig:
    if family == "bert":
        return BertConfig(
            vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1,
            num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
        )  # fmt: skip
    ids = dict(pad_token_id=tokenizer.pad_id, cls_token_id=tokenizer.cls_id)
    ids |= dict(sep_token_id=tokenizer.sep_id, bos_token_id=tokenizer.cls_id)
    ids |= dict(eos_token_id=tokenizer.sep_id, vocab_size=tokenizer.vocab_size)
    return ModernBertConfig(**{**TINY, **ids, "classifier_pooling": "mean"})


def _task(head: str) -> dict:
    """The task entry `finetune` would write for the head kind (model_dir's format)."""
    return {
        "name": TASKS[head],
        "head": head,
        "labels": LABELS.get(head, []),
        "max_seq_length": 64,
        "settings": {"eval_batch_size": 4},
        "options": {"doc_stride": 32, "max_query_length": 16} if head == "span" else {},
    }


@pytest.fixture(scope="module", params=["bert", "modernbert"])
def family(request, tmp_path_factory):
    """(family, root, config, tokenizer, {head: (fine-tuned dir, its export, its params)}): one
    random encoder per family, each head kind fine-tuned on it (random heads), saved and
    exported."""
    root = tmp_path_factory.mktemp(request.param)
    tokenizer = load_tokenizer(minilm_dir())
    config = _config(request.param, tokenizer)
    if request.param == "bert":
        encoder, mlm_head = random_params(config, seed=3)["bert"], None
    else:
        pretrained = params_from_hf(hf_masked_lm(config, seed=3), config)
        encoder, mlm_head = pretrained["model"], pretrained["head"]
    rng = np.random.default_rng(4)
    models = {}
    for head in task_heads.HEADS:
        task = _task(head)
        width = task_heads.get(head).num_outputs(task["labels"])
        output = {
            "kernel": rng.normal(0, 0.5, (config.hidden_size, width)),
            "bias": rng.normal(0, 0.1, width),
        }
        classifier = {"output": output} | ({"head": mlm_head} if mlm_head else {})
        params = jax.tree.map(
            lambda v: np.asarray(v, np.float32), {"bert": encoder, "classifier": classifier}
        )
        model = model_dir.save_model_dir(root / head, config, params, tokenizer, task=task)
        out = root / f"{head}-hf"
        assert cli.main(["convert", "--from", "bert-jax", model, "--to", "hf", str(out)]) == 0
        models[head] = (model, out, params)
    return request.param, root, config, tokenizer, models


# bert-jax's module of each head kind (what fine-tuning trains and predict runs), per family.
MODULES = {
    "bert": {
        "classification": pooled.BertForSequenceClassification,
        "multiple_choice": lambda config, width: pooled.BertForMultipleChoice(config),
        "tokens": per_token.BertForTokenOutputs,
    },
    "modernbert": {
        "classification": modernbert_pooled.ModernBertForSequenceClassification,
        "multiple_choice": lambda config, width: modernbert_pooled.ModernBertForMultipleChoice(
            config
        ),
        "tokens": per_token.ModernBertForTokenOutputs,
    },
}
MODULE_OF_HEAD = {"classification": "classification", "regression": "classification"}
MODULE_OF_HEAD |= {"multiple_choice": "multiple_choice", "span": "tokens", "tags": "tokens"}


def _inputs(fast, head: str) -> dict:
    """transformers' encoded inputs of the head's examples, padded."""
    if head in ("classification", "regression"):
        return fast([a for a, _ in PAIRS], [b for _, b in PAIRS], padding=True, return_tensors="pt")
    if head == "multiple_choice":
        ((start, endings),) = CHOICES
        encoded = fast([start] * len(endings), endings, padding=True, return_tensors="pt")
        return {key: value[None] for key, value in encoded.items()}
    if head == "span":
        return fast(
            [q for q, _ in QUESTIONS], [c for _, c in QUESTIONS], padding=True, return_tensors="pt"
        )
    return fast([" ".join(w) for w in WORDS], padding=True, return_tensors="pt")


def test_export_loads_strictly_and_gives_bert_jax_logits(family):
    name, _, config, _, models = family
    # One transformers tokenizer for the family: every export holds the same files (the
    # pipelines below load each export's own).
    fast = transformers.AutoTokenizer.from_pretrained(models["classification"][1])
    for head, (_, out, params) in models.items():
        task = _task(head)
        cls = AUTO_CLASSES[head]
        theirs, info = cls.from_pretrained(out, output_loading_info=True)
        assert not any(
            info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")
        ), (head, info)
        assert type(theirs).__name__ == task_heads.get(head).architecture(name)
        width = task_heads.get(head).num_outputs(task["labels"])
        if task["labels"]:
            assert theirs.config.id2label == dict(enumerate(task["labels"]))
        assert theirs.config.problem_type == task_heads.get(head).problem_type
        inputs = _inputs(fast, head)
        with torch.no_grad():
            output = theirs.eval()(**inputs)
        expected = (
            torch.stack([output.start_logits, output.end_logits], -1)
            if head == "span"
            else output.logits
        ).numpy()
        segments = inputs.get("token_type_ids", torch.zeros_like(inputs["input_ids"]))
        forward = jax.jit(MODULES[name][MODULE_OF_HEAD[head]](config, width).apply)
        arrays = [inputs[key].numpy() for key in ("input_ids", "attention_mask")]
        ours = np.asarray(forward({"params": params}, *arrays, segments.numpy()))
        if head in ("span", "tags"):  # padding positions differ by definition: the real ones
            mask = inputs["attention_mask"].numpy().astype(bool)
            ours, expected = ours[mask], expected[mask]
        assert np.abs(ours - expected).max() <= TOLERANCE, (head, np.abs(ours - expected).max())


def _pipeline_predictions(head: str, hf_dir) -> list:
    """transformers' pipeline of the head on the examples, in predict's terms."""
    if head in ("classification", "regression"):
        pipe = transformers.pipeline("text-classification", model=str(hf_dir), device="cpu")
        extra = {"function_to_apply": "none"} if head == "regression" else {}
        found = [pipe({"text": a, "text_pair": b}, **extra) for a, b in PAIRS]
        found = [f[0] if isinstance(f, list) else f for f in found]
        if head == "regression":
            return [{"score": f["score"]} for f in found]
        return [{"label": f["label"], "score": f["score"]} for f in found]
    if head == "span":
        fast = transformers.AutoTokenizer.from_pretrained(hf_dir)
        model = AUTO_CLASSES["span"].from_pretrained(hf_dir)
        return [_best_span(fast, model, question, context) for question, context in QUESTIONS]
    pipe = transformers.pipeline("token-classification", model=str(hf_dir), device="cpu")
    tags = []
    for words in WORDS:  # the tag at each word's first sub-token, as bert-jax reads them
        text = " ".join(words)
        starts = {sum(len(w) + 1 for w in words[:i]) for i in range(len(words))}
        found = {t["start"]: t for t in pipe(text, ignore_labels=[]) if t["start"] in starts}
        tags.append([(found[s]["entity"], found[s]["score"]) for s in sorted(starts)])
    return tags


def _best_span(fast, model, question: str, context: str, longest: int = 30) -> str:
    """The answer of transformers' QA class as its (v4) question-answering pipeline read it (the
    pipeline is gone from transformers 5): the context span of the highest start + end logit,
    start <= end, at most `longest` tokens, cut from the context by the tokenizer's offsets."""
    encoded = fast(question, context, return_offsets_mapping=True, return_tensors="pt")
    offsets = encoded.pop("offset_mapping")[0].tolist()
    in_context = [i for i, s in enumerate(encoded.sequence_ids(0)) if s == 1]
    with torch.no_grad():
        out = model(**encoded)
    start, end = out.start_logits[0].numpy(), out.end_logits[0].numpy()
    best = max(
        ((s, e) for s in in_context for e in in_context if s <= e < s + longest),
        key=lambda span: start[span[0]] + end[span[1]],
    )
    return context[offsets[best[0]][0] : offsets[best[1]][1]]


def _rows(head: str) -> list[dict]:
    if head in ("classification", "regression"):
        return [{"text": a, "text_pair": b} for a, b in PAIRS]
    if head == "multiple_choice":
        return [{"context": start, "endings": endings} for start, endings in CHOICES]
    if head == "span":
        return [{"question": q, "context": c} for q, c in QUESTIONS]
    return [{"words": words} for words in WORDS]


def _check_predictions(head: str, model, hf_dir) -> None:
    """`bert-jax predict` on `model` against transformers on `hf_dir` (the same weights)."""
    ours = predict(str(model), _rows(head), log=lambda line: None)
    if head == "multiple_choice":  # no transformers pipeline: the class's logits, argmax
        ((start, endings),) = CHOICES
        fast = transformers.AutoTokenizer.from_pretrained(hf_dir)
        encoded = fast([start] * len(endings), endings, padding=True, return_tensors="pt")
        with torch.no_grad():
            logits = (
                AUTO_CLASSES[head]
                .from_pretrained(hf_dir)(**{k: v[None] for k, v in encoded.items()})
                .logits[0]
            )
        probabilities = torch.softmax(logits, -1).numpy()
        assert ours[0]["label"] == int(np.argmax(probabilities))
        assert abs(ours[0]["score"] - probabilities.max()) <= TOLERANCE
        return
    theirs = _pipeline_predictions(head, hf_dir)
    assert len(ours) == len(theirs)
    for mine, expected in zip(ours, theirs):
        if head == "span":
            assert mine["answer"] == expected
        elif head == "tags":
            assert mine["tags"] == [tag for tag, _ in expected]
            np.testing.assert_allclose(mine["scores"], [s for _, s in expected], atol=TOLERANCE)
        else:
            assert mine.get("label") == expected.get("label")
            assert abs(mine["score"] - expected["score"]) <= TOLERANCE


def test_transformers_pipelines_give_bert_jax_predictions(family):
    _, _, _, _, models = family
    for head, (model, out, _) in models.items():
        _check_predictions(head, model, out)


def _transformers_model(name: str, config, head: str, seed: int):
    """A transformers model of the head's class with random weights (fine-tuned elsewhere)."""
    task = _task(head)
    if name == "bert":
        values = transformers.BertConfig(**hf.hf_config_from(config, with_heads=False))
    else:
        values = transformers.ModernBertConfig(
            **hf_modernbert.hf_config_from(config, with_heads=False), attn_implementation="eager"
        )
    fields = task_heads.transformers_fields(name, task)
    values.id2label = {int(k): v for k, v in fields["id2label"].items()}
    values.label2id = fields["label2id"]
    values.problem_type = fields.get("problem_type")
    values.finetuning_task = task["name"]
    torch.manual_seed(seed)
    model = AUTO_CLASSES[head].from_config(values).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    return model


def test_a_transformers_model_imports_as_a_fine_tuned_model(family, tmp_path, capsys):
    """Each class's model converts to a fine-tuned model directory with the task entry, the
    tokenizer and the encoder `finetune --model` reads, and back to the very same tensors: with
    the export's logits equal to transformers' (above), the import's forward is transformers'.
    `predict` reads one of them (token classification: BERT's class without a pooler)."""
    name, root, config, tokenizer, models = family
    fast = transformers.AutoTokenizer.from_pretrained(models["classification"][1])
    for head, (_, _, params) in models.items():
        source = tmp_path / f"{head}-elsewhere"
        original = _transformers_model(name, config, head, seed=len(head))
        original.save_pretrained(source)
        fast.save_pretrained(source)
        ours = tmp_path / f"{head}-imported"
        assert (
            cli.main(["convert", "--from", "hf", str(source), "--to", "bert-jax", str(ours)]) == 0
        )
        task = model_dir.read_config(ours)[1]["task"]
        expected = {**_task(head), "settings": {}, "options": {}}
        assert task == expected | {"max_seq_length": config.max_position_embeddings}, task
        encoder = load_pretrained(str(ours))  # what `finetune --model` starts from
        assert encoder.bert_params.keys() == params["bert"].keys()
        assert (encoder.tokenizer.kind, encoder.tokenizer.lowercase) == ("wordpiece", True)
        ids = [encoder.tokenizer.encode(s) for s in REAL_SENTENCES]
        assert ids == [tokenizer.encode(s) for s in REAL_SENTENCES]
        if head == "tags":
            _check_predictions(head, ours, source)
            # The encoder alone: BERT's class has no pooler, so the output's is fresh, and said.
            encoder_only = str(tmp_path / "tags-encoder")
            capsys.readouterr()
            argv = ["convert", "--from", "hf", str(source), "--to", "bert-jax", encoder_only]
            assert cli.main([*argv, "--drop-heads"]) == 0
            fresh = "bert/pooler/bias fresh (random) in the encoder-only output"
            assert (fresh in capsys.readouterr().out) == (name == "bert")
            assert model_dir.read_config(encoder_only)[1].get("task") is None
        back = tmp_path / f"{head}-back"
        assert cli.main(["convert", "--from", "bert-jax", str(ours), "--to", "hf", str(back)]) == 0
        weights = read_safetensors(back / "model.safetensors")
        state = original.state_dict()
        assert set(weights.shapes) == set(state) - set(modernbert_names.TIED)
        for key in weights.shapes:
            np.testing.assert_array_equal(weights.read(key), state[key].numpy(), err_msg=key)
