"""TPU slices benchmark (not a test): `bert-jax plan` for BERT-Base and BERT-Large on Cloud TPU
slices, compiled here by XLA's TPU compiler (libtpu, no TPU needed), as docs/performance.md's table.

    .venv/bin/python benchmarks/tpu_plan_table.py [--out tpu_plans.jsonl]
        [--row base:v5p-16 --row large:v5p-16 ...] [--meshes dp,fsdp,dp_fsdp,fsdp_tp]
        [--remat dots] [--set KEY=JSON ...]

Each row is one `plan.plan` of `configs/bert.py:SIZE` (the paper's recipe: global batch 256,
1M steps, 90% at seq 128, 10% at 512) on one slice; each finished row is appended to the JSONL
file at once (a long run can stop and go on: rows already there are skipped), then the Markdown
table of every row in the file is printed. Rows made by the settings search (`plan` searching
dtype, windowed einsums, ZeRO 1 and remat too; "search": 2 in the row) are the table's; rows
from before it are printed below it as not re-searched. Times are XLA's cost-model estimates, not
measurements; a Base compile takes minutes on a small CPU host, Large longer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

SEARCH = 2  # rows made by plan's settings search (mesh, dtype, windowed einsums, ZeRO 1, remat)
FULL_SEARCH = {
    "meshes": "dp,fsdp,dp_fsdp,fsdp_tp",
    "dtypes": "bfloat16,float32",
    "windowed_einsum": "false,true",
    "shard_optimizer_state": "false,true",
    "remat": "dots",
}

DEFAULT_ROWS = (
    "base:v5p-16",
    "large:v5p-16",
    "base:v4-8",
    "base:v5litepod-16",
    "base:v6e-8",
    "large:v5p-128",
    "large:v6e-64",
    "base:v5litepod-256",
    "base:v5p-8",
    "large:v4-8",
)


def _config(size: str, overrides: list[str]):
    from bert_jax.training import config_lib

    config = config_lib.pretraining_config(size)
    for item in overrides:
        key, value = item.split("=", 1)
        node = config
        *path, last = key.split(".")
        for part in path:
            node = node[part]
        node[last] = type(node[last])(json.loads(value)) if node[last] is not None else value
    return config


HEADER = (
    "| model | slice (chips) | seq 128: setting | seqs/replica x accum | peak HBM/chip | est. step "
    "| est. MFU | seq 512: setting | seqs/replica x accum | peak HBM/chip | est. step | est. MFU "
    "| est. days | est. cost | search |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def _setting(c: dict) -> str:
    """The winning setting in short: mesh, dtype, windowed einsums, ZeRO 1, remat."""
    parts = [f"{c['mesh_kind']} {tuple(c['mesh'])}"]
    if "dtype" in c:
        parts.append({"bfloat16": "bf16", "float32": "fp32"}.get(c["dtype"], c["dtype"]))
    if "windowed_einsum" in c and (c["mesh"][1] > 1 or c["mesh"][2] > 1):
        parts.append("windowed " + ("on" if c["windowed_einsum"] else "off"))
    if c.get("shard_optimizer_state"):
        parts.append("ZeRO 1")
    if c.get("remat", "none") != "none":
        parts.append(f"remat {c['remat']}")
    return ", ".join(parts)


def _link(candidate: dict) -> str:
    """The least time of the step's collectives on the links, which the estimate leaves out
    (rows compiled before `link_seconds` existed have none)."""
    seconds = candidate.get("link_seconds")
    return "" if seconds is None else f" (ICI >= {seconds * 1e3:.1f} ms)"


def _row_line(row: dict) -> str:
    plan = row["plan"]
    cells = []
    for s in plan["schedule"]:
        c = s["candidate"]
        if c is None:
            cells += ["does not fit", "-", "-", "-", "-"]
            continue
        cells += [
            _setting(c),
            f"{c['batch_per_replica']} x {c['accum_steps']}",
            f"{c['peak_bytes'] / 2**30:.1f} GiB",
            f"{c['step_seconds'] * 1e3:.1f} ms" + _link(c),
            f"{c['mfu']:.1%}",
        ]
    days = f"{plan['total_seconds'] / 86400:.1f}" if plan["total_seconds"] else "-"
    cost = f"${plan['cost']:,.0f}" if plan["cost"] else "-"
    size = row["size"].capitalize()
    if row.get("search") == SEARCH:
        searched = f"searched, {row['seconds'] / 60:.0f} min, {plan.get('compiles', 0)} compiles"
        narrowed = {k: v for k, v in row.get("searched", {}).items() if v != FULL_SEARCH.get(k, v)}
        if narrowed:
            only = [f"{k} {v}" if v else f"no {k}" for k, v in narrowed.items()]
            searched += " (only " + ", ".join(only) + ")"
    else:
        searched = "not re-searched (fsdp, windowed einsums on)"
    return (
        f"| {size} | {plan['accelerator_type']} ({plan['chips']}) | "
        + " | ".join([*cells, days, cost, searched])
        + " |"
    )


def row_order(row: dict) -> tuple:
    """Table order: by generation, then slice size, then model."""
    return (row["slice"].split("-")[0], row["plan"]["chips"], row["size"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="tpu_plans.jsonl")
    parser.add_argument("--row", action="append", default=None, metavar="SIZE:SLICE")
    parser.add_argument("--meshes", default="dp,fsdp,dp_fsdp,fsdp_tp")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON")
    parser.add_argument("--remat", default="dots", help="policies to try besides the configured")
    parser.add_argument("--dtypes", default="bfloat16,float32", help="model.dtype values to try")
    parser.add_argument("--windowed-einsum", default="false,true", help="values to try")
    parser.add_argument("--shard-optimizer-state", default="false,true", help="values to try")
    args = parser.parse_args(argv)

    from bert_jax.planning import plan
    from bert_jax.runtime import topology

    topology.quiet_runtime_without_chips()
    done = set()
    if os.path.exists(args.out):
        with open(args.out, encoding="utf-8") as f:
            done = {
                (r["size"], r["slice"], r["set"])
                for r in map(json.loads, f)
                if r.get("search") == SEARCH
            }
    prices = plan.load_prices(None)
    for item in args.row or DEFAULT_ROWS:
        size, name = item.split(":", 1)
        key = (size, name, " ".join(args.set))
        if key in done:
            continue
        start = time.perf_counter()
        result = plan.plan(
            _config(size, args.set),
            topology.parse(name),
            kinds=args.meshes.split(","),
            prices=prices,
            remats=[r for r in args.remat.split(",") if r],
            dtypes=args.dtypes.split(","),
            windowed=[v == "true" for v in args.windowed_einsum.split(",")],
            zero=[v == "true" for v in args.shard_optimizer_state.split(",")],
            progress=lambda c, item=item: print(
                f"  {item} {c.phase} {c.stage}: {c.setting.label()}: "
                f"{c.note or f'{c.step_seconds * 1e3:.1f} ms'} "
                f"({'compiled' if c.compiles else 'not compiled'})",
                flush=True,
            ),
        )
        row = {"size": size, "slice": name, "set": key[2], "plan": json.loads(result.to_json())}
        row["search"] = SEARCH
        row["searched"] = {
            "meshes": args.meshes,
            "dtypes": args.dtypes,
            "windowed_einsum": args.windowed_einsum,
            "shard_optimizer_state": args.shard_optimizer_state,
            "remat": args.remat,
        }
        row["seconds"] = time.perf_counter() - start
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        print(f"{item}: {row['seconds']:.0f} s\n{plan.format_plan(result)}", flush=True)
    with open(args.out, encoding="utf-8") as f:
        rows = sorted((json.loads(line) for line in f), key=row_order)
    # The searched row of a slice replaces the one from before the search.
    searched = {(r["size"], r["slice"]) for r in rows if r.get("search") == SEARCH}
    print(HEADER)
    for row in rows:
        if row.get("search") == SEARCH or (row["size"], row["slice"]) not in searched:
            print(_row_line(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
