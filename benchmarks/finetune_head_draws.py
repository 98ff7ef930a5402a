"""Fine-tuning's initial heads (not a test): how each stack's generator draws the classifier head a
seed starts from, and how much of a side-by-side run's dev score that draw explains.

A binary sentence task's head starts as two random vectors; on the training set their logit
difference is a random projection of the pooled [CLS] outputs. Its *alignment* is the AUC of that
projection against the train labels: 0.5 points nowhere, below 0.5 the head starts pointing
against the labels and has to turn round within the run. For seeds 0..N-1 this draws bert-jax's
head (the tuner's init under the run's init key) and transformers' (`BertForSequenceClassification`
under the torch seed `finetune_side_by_side.py` gives it) and prints both distributions of the
alignment with two tests of "one distribution" (Kolmogorov-Smirnov, Levene).

Given side-by-side workdirs (`--runs OUT ...`, each made by `finetune_side_by_side.py` on the same
task, data and length), it fits every run's dev score by its stack and its head's alignment
(least squares on the alignment below 0.5 and its square: only a start against the labels costs)
and prints the stack's coefficient, bert-jax's difference from transformers with the draw held
equal, beside the raw difference of the means.

Given seeds (`--seeds 64 65 ...`), it names each stack's seeds among them whose head starts
against the labels (AUC below 0.42), before any of them is run: which stack's seeds spread wider
on a range of seeds is mostly which stack drew more of those heads there.

So the spread over a range of seeds is a noisy measure of a stack's spread. With the runs from each
stack's own heads it also estimates each stack's mean and spread over all the heads it draws
(seeds 0..N-1): a mixture of its runs from heads against the labels, in the proportion its
generator draws them, and its runs from the others (stratified sampling). Run every seed whose head
starts against the labels in a range (`--seeds` names them) and a range of seeds for the rest; it
prints bert-jax's difference in mean and its ratio of spreads with 95% bootstrap intervals.

    .venv/bin/python benchmarks/finetune_head_draws.py --model MODEL --task glue/SST-2 \
        --data DIR --max-seq-length 32 [--draws 600] [--runs OUT [OUT ...]] [--seeds S ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import finetune_side_by_side as side_by_side  # noqa: E402 (the benchmark beside this one)

# Below this AUC a head starts against the labels: the low seeds of both stacks start there.
AGAINST = 0.42


def pooled_train(encoder, task, data: str, max_seq_length: int):
    """The pooled [CLS] outputs of the train split (dropout off) and its labels."""
    import jax

    from bert_jax.core.model import BertModel
    from bert_jax.finetune.tuning import batches

    split = batches.load_task_data(data, task, encoder.tokenizer, max_seq_length).train
    model = BertModel(encoder.config)
    rows = split.features

    @jax.jit
    def pooled(params, ids, mask, segments):
        out = model.apply({"params": params}, ids, mask, segments, deterministic=True)
        return out["pooled_output"]

    outputs = pooled(
        encoder.bert_params, rows["input_ids"], rows["input_mask"], rows["segment_ids"]
    )
    return np.asarray(outputs, np.float64), np.asarray(split.labels)


def alignment(pooled: np.ndarray, labels: np.ndarray, kernel_Dx2: np.ndarray) -> float:
    """The AUC of the head's initial logit difference against the labels (ties count half)."""
    from scipy import stats

    z = pooled @ (kernel_Dx2[:, 1] - kernel_Dx2[:, 0])
    positive, negative = z[labels == 1], z[labels == 0]
    u = stats.mannwhitneyu(positive, negative).statistic
    return float(u / (positive.size * negative.size))


def draw_heads(encoder, draws: int) -> dict[str, dict[int, np.ndarray]]:
    """Each stack's initial head kernel [D, 2] for seeds 0..draws-1, under the init key (and its
    torch seed) that `one_task.run_task` gives the tuner."""
    import jax
    import torch

    from bert_jax.core import partitioning
    from bert_jax.finetune.tuning import sentence_tuning, tuning_loop

    settings = sentence_tuning.FinetuneSettings(mesh_shape=(1, 1, 1))
    mesh = partitioning.make_mesh((1, 1, 1), devices=jax.devices()[:1])
    config = tuning_loop.run_config(encoder, settings, mesh)
    tuner = sentence_tuning.fine_tuner(config, 2, mesh, settings)
    reference = side_by_side.TorchTuner("glue", config, 2, 0.0, 0.0)
    heads: dict[str, dict[int, np.ndarray]] = {stack: {} for stack in side_by_side.STACKS}
    for seed in range(draws):
        init_rng, _ = jax.random.split(jax.random.key(seed))
        params = tuner.init(init_rng, encoder.bert_params).params
        heads["bert-jax"][seed] = np.asarray(params["classifier"]["output"]["kernel"], np.float64)
        torch.manual_seed(side_by_side.torch_seed(init_rng))
        weight = reference._model().classifier.weight.detach().numpy()
        heads["transformers"][seed] = weight.T.astype(np.float64)
    return heads


def read_runs(workdirs: list[str]) -> list[tuple[str, str, int, float]]:
    """(stack, whose head it started from, seed, dev score) of every finished run in the
    side-by-side workdirs, the head read from each workdir's side_by_side.json."""
    from bert_jax.finetune.runs import one_task
    from bert_jax.runtime.errors import UserError

    runs = []
    for workdir in workdirs:
        if not os.path.exists(os.path.join(workdir, "side_by_side.json")):
            raise UserError(f"--runs {workdir}: no side_by_side.json (finetune_side_by_side.py)")
        with open(os.path.join(workdir, "side_by_side.json"), encoding="utf-8") as f:
            summary = json.load(f)
        shared = summary.get("head", "own")
        if "head (bert-jax)" in summary:  # before `--same-head bert-jax`
            shared = "transformers" if summary["head (bert-jax)"] == "transformers' draw" else "own"
        for stack in side_by_side.STACKS:
            head = stack if shared == "own" else shared
            directory = os.path.join(workdir, stack)
            for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
                path = os.path.join(directory, name, "result.json")
                if name.startswith("seed=") and os.path.exists(path):
                    with open(path, encoding="utf-8") as f:
                        score = one_task.dev_score(json.load(f))[1]
                    runs.append((stack, head, int(name.split("=")[1]), score))
    return runs


def over_draws(rate, against: np.ndarray, along: np.ndarray, ddof: int = 1):
    """Mean and standard deviation of the dev score over a stack's head draws, a fraction `rate`
    of which start against the labels: the mixture of the two strata's scores (each stratum's
    scores along the last axis, so that a batch of resamples is one call)."""
    m_against, m_along = np.mean(against, axis=-1), np.mean(along, axis=-1)
    variance = (
        rate * np.var(against, ddof=ddof, axis=-1)
        + (1 - rate) * np.var(along, ddof=ddof, axis=-1)
        + rate * (1 - rate) * (m_along - m_against) ** 2
    )
    return rate * m_against + (1 - rate) * m_along, np.sqrt(variance)


def compare_over_draws(
    strata: dict[str, tuple[int, int, np.ndarray, np.ndarray]], samples: int = 10_000, seed: int = 0
) -> dict[str, float]:
    """bert-jax's difference from transformers in `over_draws`'s mean and spread, and the ratio
    of their spreads, each with a 95% bootstrap interval. `strata[stack]` is (heads drawn, of them
    against the labels, scores from those, scores from the others); a bootstrap sample redraws the
    count against the labels (binomial) and each stratum's scores. The ratio is None when
    transformers' spread is 0 in the runs or in a resample (scores that all hit 100 do that)."""
    point = {
        stack: over_draws(n_against / n, a, b) for stack, (n, n_against, a, b) in strata.items()
    }
    rng = np.random.default_rng(seed)
    drawn = {}
    for stack, (n, n_against, a, b) in strata.items():
        rates = rng.binomial(n, n_against / n, samples) / n
        resampled_a = a[rng.integers(0, len(a), (samples, len(a)))]
        resampled_b = b[rng.integers(0, len(b), (samples, len(b)))]
        drawn[stack] = over_draws(rates, resampled_a, resampled_b)
    (mean_ours, sd_ours), (mean_theirs, sd_theirs) = (drawn[s] for s in side_by_side.STACKS)
    mean_difference, spread_difference = mean_ours - mean_theirs, sd_ours - sd_theirs
    p_wider = float(np.mean(sd_ours > sd_theirs))
    ratio = sd_ours / sd_theirs if np.all(sd_theirs > 0) else None
    (mean_ours, sd_ours), (mean_theirs, sd_theirs) = (point[s] for s in side_by_side.STACKS)
    return {
        "mean_difference": float(mean_ours - mean_theirs),
        "mean_difference_95": tuple(np.percentile(mean_difference, [2.5, 97.5])),
        "spread_difference": float(sd_ours - sd_theirs),
        "spread_difference_95": tuple(np.percentile(spread_difference, [2.5, 97.5])),
        "spread_ratio": None if ratio is None else float(sd_ours / sd_theirs),
        "spread_ratio_95": None if ratio is None else tuple(np.percentile(ratio, [2.5, 97.5])),
        "p_wider": p_wider,
    }


def least_squares(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Coefficients, their standard errors and R^2."""
    beta = np.linalg.lstsq(X, y, rcond=None)[0]
    residual = y - X @ beta
    variance = residual @ residual / (len(y) - X.shape[1])
    errors = np.sqrt(np.diag(variance * np.linalg.inv(X.T @ X)))
    r2 = 1 - residual @ residual / np.sum((y - y.mean()) ** 2)
    return beta, errors, float(r2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a bert-jax model directory")
    parser.add_argument("--task", required=True, help="a binary GLUE task: glue/NAME")
    parser.add_argument("--data", required=True, help="the task's directory (GLUE TSV)")
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--draws", type=int, default=600, help="seeds 0..N-1 a stack")
    parser.add_argument("--runs", nargs="*", default=[], help="finetune_side_by_side workdirs")
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="*",
        default=[],
        help=f"name the seeds among these that start against the labels (AUC below {AGAINST})",
    )
    args = parser.parse_args(argv)

    from bert_jax.runtime import topology

    topology.quiet_runtime_without_chips()  # libtpu without a TPU chip: no warnings

    from scipy import stats

    from bert_jax.finetune.tasks import glue
    from bert_jax.finetune.tuning.settings import load_pretrained
    from bert_jax.runtime.errors import UserError

    try:
        if args.draws < 2:
            raise UserError(f"--draws {args.draws}: at least 2 seeds a stack")
        if any(seed < 0 for seed in args.seeds):
            raise UserError(f"--seeds: a seed is 0 or more, not {min(args.seeds)}")
        task = glue.get_task(args.task)
        if task.is_regression or len(task.labels) != 2:
            raise UserError(f"--task {args.task}: a binary classification task is needed")
        runs = read_runs(args.runs)
        encoder = load_pretrained(args.model)
        pooled, labels = pooled_train(encoder, task, args.data, args.max_seq_length)
    except UserError as error:
        parser.error(str(error))
    needed = max([seed for _, _, seed, _ in runs] + args.seeds, default=-1) + 1
    heads = draw_heads(encoder, max(args.draws, needed))
    aligned = {
        stack: {seed: alignment(pooled, labels, k) for seed, k in drawn.items()}
        for stack, drawn in heads.items()
    }
    draws = {stack: np.array([aligned[stack][s] for s in range(args.draws)]) for stack in aligned}
    print(
        f"{args.task} train ({len(labels)} rows): the initial head's alignment (AUC), "
        f"seeds 0-{args.draws - 1}"
    )
    for stack, values in draws.items():
        print(
            f"  {stack:13s} mean {values.mean():.4f} std {values.std(ddof=1):.4f}; "
            f"below {AGAINST}: {np.mean(values < AGAINST):.1%}, "
            f"below 0.46: {np.mean(values < 0.46):.1%}"
        )
    a, b = draws["bert-jax"], draws["transformers"]
    print(
        f"  one distribution? Kolmogorov-Smirnov p {stats.ks_2samp(a, b).pvalue:.2f}, "
        f"Levene p {stats.levene(a, b).pvalue:.2f}"
    )
    if args.seeds:
        print(f"  of the {len(args.seeds)} seeds given, those whose head starts against the labels")
        for stack in side_by_side.STACKS:
            against = [seed for seed in args.seeds if aligned[stack][seed] < AGAINST]
            print(f"  {stack:13s} {len(against)}: {' '.join(map(str, against)) or '-'}")
    if not runs:
        return 0
    y = np.array([score for *_, score in runs])
    ours = np.array([stack == "bert-jax" for stack, *_ in runs], np.float64)
    below = np.array([min(aligned[head][seed] - 0.5, 0.0) for _, head, seed, _ in runs])
    X = np.c_[np.ones_like(y), ours, below, below**2]
    print(f"{len(runs)} runs in {len(args.runs)} workdirs: dev score by stack and head alignment")
    # The fit needs both stacks, heads on both sides of 0.5 and runs to spare over its 4 terms.
    if len(y) > X.shape[1] + 1 and np.linalg.matrix_rank(X) == X.shape[1]:
        beta, errors, r2 = least_squares(X, y)
        raw, raw_errors, _ = least_squares(X[:, :2], y)
        p = 2 * stats.t.sf(abs(beta[1] / errors[1]), len(y) - X.shape[1])
        print(f"  bert-jax - transformers, raw: {raw[1]:+.2f} (se {raw_errors[1]:.2f})")
        print(
            f"  bert-jax - transformers, the head's alignment held equal: {beta[1]:+.2f} "
            f"(se {errors[1]:.2f}, p {p:.2f}); the alignment explains R^2 {r2:.2f}"
        )
    else:
        print(
            "  no fit: it needs runs of both stacks, heads that start against the labels and "
            "more runs than its 4 terms (run more seeds)"
        )
    for low, high in ((0.0, AGAINST), (AGAINST, 0.46), (0.46, 1.0)):
        for stack in side_by_side.STACKS:
            rows = [s for st, h, seed, s in runs if st == stack and low <= aligned[h][seed] < high]
            if rows:
                print(
                    f"  alignment [{low:.2f}, {high:.2f}) {stack:13s} {len(rows):3d} runs, "
                    f"mean {np.mean(rows):.2f}, below 95: {sum(r < 95 for r in rows)}"
                )
    print_over_draws(runs, aligned, args.draws)
    return 0


def print_over_draws(runs, aligned, draws: int) -> None:
    """Each stack's mean and spread over its head draws, seeds 0..draws-1 (`over_draws`), from
    its runs from its own heads among them (one per seed), where each stratum has two or more."""
    strata = {}
    for stack in side_by_side.STACKS:
        own = {seed: s for st, head, seed, s in runs if st == stack == head and seed < draws}
        against = np.array([s for seed, s in own.items() if aligned[stack][seed] < AGAINST])
        along = np.array([s for seed, s in own.items() if aligned[stack][seed] >= AGAINST])
        n_against = sum(aligned[stack][seed] < AGAINST for seed in range(draws))
        if len(against) < 2 or len(along) < 2 or n_against == 0:
            print(
                f"  {stack} over its draws: no estimate (runs from its own heads: {len(against)} "
                f"against the labels, {len(along)} others; two of each are needed)"
            )
            return
        strata[stack] = (draws, n_against, against, along)
        mean, sd = over_draws(n_against / draws, against, along)
        print(
            f"  {stack} over its draws (seeds 0-{draws - 1}): {n_against / draws:.1%} against the "
            f"labels, {len(against)} runs from them (mean {against.mean():.2f}), "
            f"{len(along)} from the others (mean {along.mean():.2f}): mean {mean:.2f}, std {sd:.2f}"
        )
    test = compare_over_draws(strata)
    if test["spread_ratio"] is None:
        low, high = test["spread_difference_95"]
        spread = (
            f"std {test['spread_difference']:+.2f} (95% {low:+.2f} to {high:+.2f}; no ratio: "
            "transformers' scores do not vary in the runs or in a resample"
        )
    else:
        low, high = test["spread_ratio_95"]
        spread = f"std ratio {test['spread_ratio']:.2f} (95% {low:.2f} to {high:.2f}"
    print(
        f"  bert-jax - transformers over their draws: mean {test['mean_difference']:+.2f} "
        f"(95% {test['mean_difference_95'][0]:+.2f} to {test['mean_difference_95'][1]:+.2f}), "
        f"{spread}; wider in {test['p_wider']:.0%} of the resamples)"
    )


if __name__ == "__main__":
    sys.exit(main())
