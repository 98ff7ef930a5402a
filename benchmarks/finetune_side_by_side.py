"""Fine-tuning side by side (not a test): bert-jax and Hugging Face PyTorch on the same task files,
model and seeds, and the spread of the dev score over the seeds.

Both stacks run through bert-jax's own task code (`finetune.runs.one_task.run_task`, what `bert-jax
finetune` runs: the readers of the official formats, the features, the batches and their order, the
dev scoring and the result files). For the "bert-jax" stack the steps and their learning rates are
bert-jax's (JAX, `--optimizer`, default adamw-hf, and `--decay-from`); for the "transformers" stack
the train and predict steps are those of the `transformers` model of the task (BertFor...
SequenceClassification, MultipleChoice, QuestionAnswering, TokenClassification) with the same
starting encoder weights, trained as Hugging Face's Trainer does (torch AdamW in its two parameter
groups, eps 1e-8, `clip_grad_norm_`, the linear schedule after a ceil(10%) warmup). Each stack
initialises the task head and draws dropout with its own generator under the seed. The task
directory is any `bert-jax finetune` reads: GLUE TSV (glue/NAME), SQuAD JSON (squad/v1.1,
squad/v2.0), CoNLL-2003 (conll2003) or the SWAG CSV files (swag).

    .venv/bin/python benchmarks/finetune_side_by_side.py --model MODEL --task glue/SST-2 \
        --data DIR --workdir OUT [--seeds 0 1 2] [--learning-rate 2e-5] [--epochs 3] \
        [--batch-size 32] [--max-seq-length 128] [--dropout 0.1] [--optimizer adamw-hf] \
        [--decay-from warmup-end|step-0] [--stacks both] [--same-head [transformers|bert-jax]] \
        [--dropout-impl hash|prng] [--adam-epsilon EPS]
    .venv/bin/python benchmarks/finetune_side_by_side.py --write-synthetic-sst2 DIR \
        [--train-size 400] [--dev-size 200]
    .venv/bin/python benchmarks/finetune_side_by_side.py --write-prose-swag DIR [--train-size N]
    .venv/bin/python benchmarks/finetune_side_by_side.py --write-prose-pairs DIR [--train-size N]

MODEL is a bert-jax model directory (`bert-jax convert --from hf ... --to bert-jax MODEL` makes one
from a Hugging Face checkpoint). Runs land in OUT/<stack>/seed=N (a finished one is reused); the
summary (each stack's mean, std and range, and a paired test over the seeds) is printed and written
to OUT/side_by_side.json. `--same-head` starts bert-jax from transformers' initial head of each
seed, so that the stacks differ only in their dropout masks (`--same-head bert-jax`: the reverse,
transformers from bert-jax's head); `--dropout-impl` picks bert-jax's masks (fine-tuning's
setting: hash, or prng) and `--adam-epsilon` its Adam's epsilon (fine-tuning's setting, 1e-8;
1e-6 is the original code's). The prose sets come from the embedded corpus (real prose shipped with
Python): multiple choice in SWAG's files and next-sentence pairs in RTE's, train and dev from
different documents. Sets where the model learns
(docs/finetuning.md: 256 multiple-choice rows, 512 pairs, 512 negation sentences) spread over 1-2
points a seed; on smaller ones a run's score is its seed's lottery (5-13 points), and eight seeds
cannot tell the stacks apart within a point.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Any

import numpy as np

STACKS = ("bert-jax", "transformers")


# ------------------------------------------------------------------------------------------------
# Hugging Face's steps behind the tuner interface bert-jax's loops drive
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class TorchState:
    params: Any  # the torch model: what the predict step reads
    optimizer: Any
    skipped: int = 0


class TorchTuner:
    """A `transformers` task model and the Trainer's optimizer behind the interface of bert-jax's
    tuners (`init`, `global_batch`, `train_step`, `predict`), so `steps.run_steps` and the tasks'
    prediction code drive it as they drive bert-jax's."""

    def __init__(
        self,
        kind: str,
        config,
        num_outputs: int,
        weight_decay: float,
        clip_norm: float,
        head_source=None,
    ):
        self.kind, self.config, self.num_outputs = kind, config, num_outputs
        self.weight_decay, self.clip_norm = weight_decay, clip_norm
        # bert-jax's tuner of the same task, whose initial head this one starts from (None: its
        # own draw under the seed; `--same-head bert-jax`).
        self.head_source = head_source

    def _model(self):
        import transformers

        from bert_jax.convert import hf as hf_convert

        fields = hf_convert.hf_config_from(self.config, with_heads=False)
        fields.pop("architectures", None)
        config = transformers.BertConfig(**fields)
        if self.kind == "glue":
            config.num_labels = self.num_outputs
            one = self.num_outputs == 1
            config.problem_type = "regression" if one else "single_label_classification"
            return transformers.BertForSequenceClassification(config)
        if self.kind == "swag":
            return transformers.BertForMultipleChoice(config)
        if self.kind == "span":
            return transformers.BertForQuestionAnswering(config)
        config.num_labels = self.num_outputs
        return transformers.BertForTokenClassification(config)

    def init(self, rng, bert_params) -> TorchState:
        import jax
        import torch
        import transformers

        from bert_jax.convert import hf as hf_convert

        torch.manual_seed(torch_seed(rng))
        model = self._model()  # the head: torch's initialisation under the seed
        encoder = hf_convert.hf_state_dict_from({"bert": bert_params}, self.config)
        missing, _ = model.load_state_dict(
            {key: torch.from_numpy(np.array(value)) for key, value in encoder.items()}, strict=False
        )
        assert all(not key.startswith("bert.") for key in missing), missing
        if self.head_source is not None:
            drawn = self.head_source.init(rng, bert_params).params["classifier"]["output"]
            kernel, bias = (np.asarray(jax.device_get(drawn[k])) for k in ("kernel", "bias"))
            with torch.no_grad():
                model.classifier.weight.copy_(torch.from_numpy(kernel.reshape(-1, bias.size).T))
                model.classifier.bias.copy_(torch.from_numpy(bias))
        decay = set(transformers.Trainer.get_decay_parameter_names(None, model))
        named = list(model.named_parameters())
        defaults = {f.name: f.default for f in dataclasses.fields(transformers.TrainingArguments)}
        optimizer = torch.optim.AdamW(
            [
                {"params": [p for n, p in named if n in decay], "weight_decay": self.weight_decay},
                {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
            ],
            lr=0.0,
            betas=(defaults["adam_beta1"], defaults["adam_beta2"]),
            eps=defaults["adam_epsilon"],
            fused=defaults["optim"] == "adamw_torch_fused",
        )
        return TorchState(model, optimizer)

    def global_batch(self, local_batch):
        return dict(local_batch)

    def _inputs(self, batch, rows):
        import torch

        def tensor(name):
            return torch.from_numpy(np.asarray(batch[name])[rows].astype(np.int64))

        return {
            "input_ids": tensor("input_ids"),
            "attention_mask": tensor("input_mask"),
            "token_type_ids": tensor("segment_ids"),
        }

    def train_step(self, state: TorchState, batch, rng, learning_rate: float):
        import torch

        rows = np.asarray(batch["weights"]) > 0  # the Trainer's last batch holds real rows only
        inputs = self._inputs(batch, rows)
        if self.kind in ("glue", "swag"):
            labels = np.asarray(batch["labels"])[rows]
            regression = self.kind == "glue" and self.num_outputs == 1
            labels = labels.astype(np.float32 if regression else np.int64)
            inputs["labels"] = torch.from_numpy(labels)
            weight = float(rows.sum())
        elif self.kind == "span":
            for name in ("start_positions", "end_positions"):
                inputs[name] = torch.from_numpy(np.asarray(batch[name])[rows].astype(np.int64))
            weight = float(rows.sum())
        else:
            labelled = np.asarray(batch["label_weights"])[rows] > 0
            labels = np.where(labelled, np.asarray(batch["labels"])[rows], -100)
            inputs["labels"] = torch.from_numpy(labels.astype(np.int64))
            weight = float(labelled.sum())
        model = state.params
        model.train()
        loss = model(**inputs).loss
        loss.backward()
        if self.clip_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), self.clip_norm)
        for group in state.optimizer.param_groups:
            group["lr"] = learning_rate  # the schedule's rate, as run_steps passes it
        state.optimizer.step()
        model.zero_grad()
        return state, {"loss_sum": float(loss.detach()) * weight, "weight": weight}

    def predict(self, model, batch):
        import torch

        model.eval()
        with torch.no_grad():
            out = model(**self._inputs(batch, slice(None)))
        if self.kind == "span":
            return torch.stack([out.start_logits, out.end_logits], dim=-1).numpy()
        return out.logits.numpy()


def torch_seed(rng) -> int:
    """The torch seed of a run's init key (the key's last word)."""
    import jax

    return int(np.asarray(jax.random.key_data(rng)).ravel()[-1])


def start_from_transformers_heads() -> None:
    """bert-jax's tuners start from the head transformers draws under the seed (an elimination:
    with it the stacks differ only in their dropout masks). Sentence classification and
    multiple choice."""
    import jax
    import torch

    from bert_jax.finetune.tuning.head_tuner import HeadTuner

    drawn_by_flax = HeadTuner.init

    def init(self, rng, pretrained_bert):
        state = drawn_by_flax(self, rng, pretrained_bert)
        classifier = state.params["classifier"]
        kernel = classifier["output"]["kernel"]
        kind = "swag" if type(self).__name__ == "ChoiceTuner" else "glue"
        torch_tuner = TorchTuner(kind, self.model.config, kernel.shape[-1], 0.0, 0.0)
        torch.manual_seed(torch_seed(rng))
        head = torch_tuner._model().classifier
        drawn = {
            "output": {
                "kernel": head.weight.detach().numpy().T.reshape(kernel.shape),
                "bias": head.bias.detach().numpy(),
            }
        }
        placed = jax.tree.map(
            lambda new, old: jax.device_put(new.astype(old.dtype), old.sharding), drawn, classifier
        )
        return dataclasses.replace(state, params={**state.params, "classifier": placed})

    HeadTuner.init = init


def use_transformers_steps(heads_from_bert_jax: bool = False) -> None:
    """Puts `TorchTuner` where bert-jax's task code builds its tuners (GLUE, SWAG, SQuAD, NER);
    with `heads_from_bert_jax` (sentence classification and multiple choice) each starts from
    the head bert-jax's tuner draws under the seed, the reverse of `start_from_transformers_heads`
    (whether a seed's score follows its head draw whichever stack trains it)."""
    from bert_jax.finetune.runs import multiple_choice as swag_task
    from bert_jax.finetune.tuning import sentence_tuning as loop
    from bert_jax.finetune.tuning import token_tuning as token_loop

    bert_jax_glue, bert_jax_choices = loop.fine_tuner, swag_task.choice_tuner

    def glue(config, num_labels, mesh, settings, *rest):
        source = None
        if heads_from_bert_jax:
            source = bert_jax_glue(config, num_labels, mesh, settings, *rest)
        return TorchTuner(
            "glue", config, num_labels, settings.weight_decay, settings.clip_norm, source
        )

    def tokens(config, num_outputs, kind, mesh, head_dropout, settings):
        return TorchTuner(kind, config, num_outputs, settings.weight_decay, settings.clip_norm)

    def choices(config, mesh, settings):
        source = bert_jax_choices(config, mesh, settings) if heads_from_bert_jax else None
        return TorchTuner("swag", config, 4, settings.weight_decay, settings.clip_norm, source)

    loop.fine_tuner, token_loop.token_tuner, swag_task.choice_tuner = glue, tokens, choices


# ------------------------------------------------------------------------------------------------
# Runs and their spread
# ------------------------------------------------------------------------------------------------


def run_seed(encoder, stack: str, args, seed: int) -> dict[str, Any]:
    from bert_jax.finetune.runs import one_task as run

    overrides = {
        "seed": seed,
        "learning_rate": args.learning_rate,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "eval_batch_size": args.batch_size,
        "max_seq_length": args.max_seq_length,
        # transformers' stack runs the Trainer's schedule whatever bert-jax's recipe is.
        "optimizer": "adamw-hf" if stack == "transformers" else args.optimizer,
        "decay_from": None if stack == "transformers" else args.decay_from,
        "dropout": args.dropout,
        "dropout_impl": None if stack == "transformers" else args.dropout_impl,
        "adam_epsilon": None if stack == "transformers" else args.adam_epsilon,
        "log_every": args.log_every,
        "mesh_shape": (1, 1, 1) if stack == "transformers" else None,
    }
    workdir = os.path.join(args.workdir, stack, f"seed={seed}")
    started = time.time()
    result = run.run_task(
        encoder,
        args.task,
        args.data,
        workdir,
        overrides,
        run.TaskOptions(predict_test=False),
        log=lambda line: print(f"[{stack} seed={seed}] {line}", flush=True),
    )
    metric, score = run.dev_score(result)
    steps = result.get("num_train_steps")
    return {
        "seed": seed,
        "metric": metric,
        "score": score,
        "steps": steps,
        "seconds": round(time.time() - started, 1),
    }


def spread(scores: list[float]) -> dict[str, float]:
    return {
        "mean": float(np.mean(scores)),
        "std": float(np.std(scores, ddof=1)) if len(scores) > 1 else 0.0,
        "min": float(np.min(scores)),
        "max": float(np.max(scores)),
    }


def paired(runs: dict[str, list[dict[str, Any]]]) -> dict[str, float] | None:
    """bert-jax minus transformers on the seeds both ran: the mean difference, two paired tests
    of "no difference" (Wilcoxon signed-rank, t-test) and two of "the same spread": Levene's
    (centred on the median, robust to the few low seeds that make a spread; for runs from each
    stack's own heads, independent draws) and a paired permutation test (for runs from the same
    heads, whose scores move together: under "the same spread" the two scores of a seed are
    exchangeable, so it swaps them within seeds and compares the difference of the standard
    deviations), or None with one stack. Pitman-Morgan's correlation test of the same question
    rejects far more often than its level when scores pile up at 100 with a few low seeds."""
    if set(runs) != set(STACKS):
        return None
    from scipy import stats

    ours, theirs = ({r["seed"]: r["score"] for r in runs[stack]} for stack in STACKS)
    seeds = sorted(set(ours) & set(theirs))
    a, b = np.array([ours[s] for s in seeds]), np.array([theirs[s] for s in seeds])
    if len(seeds) < 2 or np.all(a == b):
        return {"seeds": len(seeds), "mean_difference": float(np.mean(a - b))}
    return {
        "seeds": len(seeds),
        "mean_difference": float(np.mean(a - b)),
        "wilcoxon_p": float(stats.wilcoxon(a, b).pvalue),
        "ttest_rel_p": float(stats.ttest_rel(a, b).pvalue),
        "levene_p": float(stats.levene(a, b).pvalue) if np.ptp(a) + np.ptp(b) > 0 else 1.0,
        "swap_spread_p": swap_spread_p(a, b),
    }


def swap_spread_p(a: np.ndarray, b: np.ndarray, resamples: int = 20_000) -> float:
    """Two-sided p of "paired scores a and b have the same spread": swapping the two scores of a
    pair (every swap where 2^pairs <= resamples, else that many random ones, seeded) against the
    difference of their standard deviations."""
    from scipy import stats

    if np.ptp(a) + np.ptp(b) == 0:
        return 1.0

    def spread_difference(x, y, axis):
        return np.std(x, ddof=1, axis=axis) - np.std(y, ddof=1, axis=axis)

    test = stats.permutation_test(
        (a, b),
        spread_difference,
        permutation_type="samples",
        vectorized=True,
        n_resamples=resamples,
        random_state=0,
    )
    return float(test.pvalue)


def write_synthetic_sst2(directory: str, train_size: int, dev_size: int, seed: int = 0) -> None:
    """An SST-2 directory (train.tsv, dev.tsv) of generated sentences: filler words around one
    sentiment word, which "not" in front of it turns around in half the sentences; balanced
    labels. A model has to find the word and read the negation to go far beyond 50%."""
    positive = ("great", "good", "delightful", "best", "warm", "funny", "moving", "superb")
    negative = ("dull", "boring", "bad", "worst", "mess", "tedious", "flat", "awful")
    filler = ("the", "film", "movie", "a", "is", "story", "cast", "and", "it", "of", "plot", "this")
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(directory, "SST-2"), exist_ok=True)
    for split, size in (("train", train_size), ("dev", dev_size)):
        rows = []
        for row in range(size):
            label, negated = row % 2, bool(rng.integers(0, 2))
            word = str(rng.choice((negative, positive)[label != negated]))
            words = [str(w) for w in rng.choice(filler, size=int(rng.integers(5, 12)))]
            at = int(rng.integers(0, len(words) + 1))
            words[at:at] = ["not", word] if negated else [word]
            rows.append(f"{' '.join(words)}\t{label}")
        lines = ["sentence\tlabel"] + [rows[i] for i in rng.permutation(size)]
        with open(os.path.join(directory, "SST-2", f"{split}.tsv"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")


def _prose_documents(min_words: int = 5, max_words: int = 40) -> list[list[str]]:
    """The embedded corpus (real prose shipped with Python) as documents of usable sentences:
    5 to 40 words, no tabs, quotes or line breaks (the task files' separators)."""
    from bert_jax.data.sources.embedded import embedded_documents

    documents = []
    for document in embedded_documents("all"):
        sentences = [
            " ".join(s.split())
            for s in document
            if min_words <= len(s.split()) <= max_words and not set(s) & set('\t"')
        ]
        if len(sentences) >= 2:
            documents.append(sentences)
    return documents


def _next_sentence_rows(size_by_split: dict[str, int], seed: int, distractors: int):
    """Per split: (context, true next sentence, [other documents' sentences]) rows. The
    documents are split between the splits (no document gives rows to two), so dev measures
    what was learnt, not what was seen."""
    rng = np.random.default_rng(seed)
    documents = _prose_documents()
    order = rng.permutation(len(documents))
    total = sum(size_by_split.values())
    rows_by_split, start = {}, 0
    for split, size in size_by_split.items():
        # Documents in proportion to the split's share, at least enough pairs for its rows.
        share = max(1, round(len(documents) * size / total))
        mine = set(order[start : start + share].tolist())
        own = [documents[i] for i in sorted(mine)]
        others = [documents[i] for i in range(len(documents)) if i not in mine]
        start += share
        pairs = [(d[i], d[i + 1]) for d in own for i in range(len(d) - 1)]
        if len(pairs) < size:
            raise SystemExit(f"only {len(pairs)} sentence pairs for the {split} split of {size}")
        rows = []
        for pick in rng.permutation(len(pairs))[:size]:
            context, true_next = pairs[pick]
            wrong = []
            for d in rng.choice(len(others), size=distractors, replace=False):
                wrong.append(str(rng.choice(others[d])))
            rows.append((context, true_next, wrong))
        rows_by_split[split] = rows
    return rows_by_split, rng


def write_prose_swag(directory: str, train_size: int, dev_size: int, seed: int = 0) -> None:
    """SWAG files (train.csv, val.csv) from real prose: a context sentence of the embedded
    corpus and four endings, its true next sentence and three sentences of other documents,
    the true one at a random place."""
    import csv

    from bert_jax.finetune.tasks import swag

    rows_by_split, rng = _next_sentence_rows({"train": train_size, "dev": dev_size}, seed, 3)
    os.makedirs(directory, exist_ok=True)
    for split, rows in rows_by_split.items():
        with open(swag.split_path(directory, split), "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(swag.HEADER)
            for number, (context, true_next, wrong) in enumerate(rows):
                label = int(rng.integers(0, 4))
                endings = list(wrong)
                endings.insert(label, true_next)
                writer.writerow(
                    [number, f"prose-{number}", "0", context, context, "", "prose", *endings, label]
                )


def write_prose_pairs(directory: str, train_size: int, dev_size: int, seed: int = 0) -> None:
    """An RTE directory (train.tsv, dev.tsv) from real prose: does sentence2 follow sentence1 in
    its document ("entailment"), or is it a sentence of another document ("not_entailment")?
    Balanced labels."""
    rows_by_split, rng = _next_sentence_rows({"train": train_size, "dev": dev_size}, seed, 1)
    os.makedirs(os.path.join(directory, "RTE"), exist_ok=True)
    for split, rows in rows_by_split.items():
        lines = ["index\tsentence1\tsentence2\tlabel"]
        for number, (context, true_next, wrong) in enumerate(rows):
            follows = number % 2 == 0
            second, label = (true_next, "entailment") if follows else (wrong[0], "not_entailment")
            lines.append(f"{number}\t{context}\t{second}\t{label}")
        with open(os.path.join(directory, "RTE", f"{split}.tsv"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a bert-jax model directory")
    parser.add_argument("--task", help="glue/NAME, squad/v1.1, squad/v2.0, conll2003 or swag")
    parser.add_argument("--data", help="the task's directory in its official format")
    parser.add_argument("--workdir", help="where the runs and the summary go")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--stacks", choices=(*STACKS, "both"), default="both")
    parser.add_argument("--learning-rate", type=float, default=None)
    parser.add_argument("--epochs", type=float, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--max-seq-length", type=int, default=None)
    parser.add_argument("--dropout", type=float, default=None)
    parser.add_argument("--optimizer", default="adamw-hf", help="bert-jax's: adamw-hf or bert")
    parser.add_argument(
        "--decay-from",
        default=None,
        help="bert-jax's (with --optimizer bert): warmup-end or step-0",
    )
    parser.add_argument(
        "--dropout-impl",
        default=None,
        help="bert-jax's dropout masks: hash or prng (default: fine-tuning's, hash)",
    )
    parser.add_argument(
        "--adam-epsilon",
        type=float,
        default=None,
        help="bert-jax's Adam epsilon (default: fine-tuning's, 1e-8; the original code's: 1e-6)",
    )
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument(
        "--same-head",
        nargs="?",
        const="transformers",
        choices=STACKS,
        default=None,
        help="both stacks start from one stack's initial head of each seed (then only the "
        "dropout masks differ): transformers' (the default) or bert-jax's; sentence "
        "classification and multiple choice",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--write-synthetic-sst2", metavar="DIR", default=None)
    parser.add_argument("--write-prose-swag", metavar="DIR", default=None)
    parser.add_argument("--write-prose-pairs", metavar="DIR", default=None)
    # The prose sets share the corpus's ~14,000 next-sentence pairs (421 documents) between
    # the splits in proportion to their sizes; a split that asks for more stops with a message.
    parser.add_argument("--train-size", type=int, default=400, help="rows of a written train split")
    parser.add_argument("--dev-size", type=int, default=200, help="rows of a written dev split")
    args = parser.parse_args(argv)

    from bert_jax.runtime import topology

    topology.quiet_runtime_without_chips()  # libtpu without a TPU chip: no warnings
    if args.write_synthetic_sst2:
        write_synthetic_sst2(args.write_synthetic_sst2, args.train_size, args.dev_size)
        print(f"wrote {args.write_synthetic_sst2}/SST-2/train.tsv and dev.tsv")
        return 0
    if args.write_prose_swag:
        write_prose_swag(args.write_prose_swag, args.train_size, args.dev_size)
        print(f"wrote {args.write_prose_swag}/train.csv and val.csv")
        return 0
    if args.write_prose_pairs:
        write_prose_pairs(args.write_prose_pairs, args.train_size, args.dev_size)
        print(f"wrote {args.write_prose_pairs}/RTE/train.tsv and dev.tsv")
        return 0
    missing = [f"--{n}" for n in ("model", "task", "data", "workdir") if not getattr(args, n)]
    if missing:
        parser.error(f"{', '.join(missing)} required")

    import torch

    from bert_jax.finetune.tuning.settings import DEFAULTS, load_pretrained

    if args.threads:
        torch.set_num_threads(args.threads)
    encoder = load_pretrained(args.model)
    if args.same_head == "transformers":
        start_from_transformers_heads()
    stacks = STACKS if args.stacks == "both" else (args.stacks,)
    runs: dict[str, list[dict[str, Any]]] = {}
    for stack in stacks:
        if stack == "transformers":
            # From here on, every run's steps are torch's.
            use_transformers_steps(heads_from_bert_jax=args.same_head == "bert-jax")
        runs[stack] = [run_seed(encoder, stack, args, seed) for seed in args.seeds]
    summary = {
        "task": args.task,
        "data": os.path.abspath(args.data),
        "model": encoder.source,
        "optimizer (bert-jax)": args.optimizer,
        "decay_from (bert-jax)": args.decay_from or "default",
        "dropout_impl (bert-jax)": args.dropout_impl or DEFAULTS["dropout_impl"],
        "adam_epsilon (bert-jax)": args.adam_epsilon or DEFAULTS["adam_epsilon"],
        # Whose initial head both stacks start from: "transformers", "bert-jax" or "own" (each
        # stack its own draw).
        "head": args.same_head or "own",
        "runs": runs,
        "spread": {stack: spread([r["score"] for r in rows]) for stack, rows in runs.items()},
        "paired": paired(runs),
    }
    os.makedirs(args.workdir, exist_ok=True)
    with open(os.path.join(args.workdir, "side_by_side.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    metric = next(iter(runs.values()))[0]["metric"]
    print(f"{args.task} {metric} over seeds {args.seeds}:")
    for stack, rows in runs.items():
        s = summary["spread"][stack]
        scores = ", ".join(f"{r['score']:.2f}" for r in rows)
        print(
            f"  {stack:13s} mean {s['mean']:.2f} std {s['std']:.2f} range {s['min']:.2f}-"
            f"{s['max']:.2f} ({scores}; {rows[0]['steps']} steps)"
        )
    test = summary["paired"]
    if test and "wilcoxon_p" in test:
        print(
            f"  bert-jax - transformers: {test['mean_difference']:+.2f} over {test['seeds']} "
            f"seeds (Wilcoxon p {test['wilcoxon_p']:.3f}, paired t p {test['ttest_rel_p']:.3f}); "
            f"the same spread? Levene p {test['levene_p']:.3f}"
            + (
                f", the paired permutation test's p {test['swap_spread_p']:.3f} (same heads)"
                if summary["head"] != "own"
                else ""
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
