"""Where a train step's device time goes (a benchmark, not a test): time, then profile.

    python benchmarks/gpu_profile.py --size base --seq-len 128 --batch 256 --dtype bfloat16 \
        --variant base --variant prng:dropout_impl=prng --out DIR

Each `--variant NAME[:field=value,...]` overrides `BertConfig` fields of the `configs/bert.py`
size; the field `bf16_lookup=True` instead restores the earlier embedding lookup (the table cast
to the compute dtype before the gather, so its gradient is a bf16 scatter-add), for comparison.
Per variant: our real train step (`bench.ours.OursRunner`: forward, backward, BERT AdamW,
dropout, donated state) is compiled, timed (median of windows), and 3 steps are traced with
`jax.profiler`. Printed: step time and MFU, then the device kernels that took the most time
per step (where `xprof` is installed; else run `--summarize DIR/NAME.xplane.pb` on a machine
that has it: the profile is read offline), and, without xprof, the device time per kernel class
(matmul, fused attention, reduction, elementwise, layout, scatter/gather, ...) read from the
trace's Perfetto JSON. Written to DIR: `NAME.xplane.pb` (xprof's kernel stats, hlo_stats and
trace viewer read it), `NAME.perfetto.json.gz`, and `summary.txt` (every printed line).

With XLA:GPU's command buffers (CUDA graphs) on, a trace may show a graph, not its kernels; run
with `XLA_FLAGS=--xla_gpu_enable_command_buffer=` (as benchmarks/gpu.sh does) to see them.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import glob
import gzip
import json
import os
import re
import shutil
import statistics
import sys
import tempfile


def parse_variant(text: str) -> tuple[str, dict]:
    name, _, fields = text.partition(":")
    overrides = {}
    for item in filter(None, fields.split(",")):
        key, _, value = item.partition("=")
        for cast in (int, float):
            try:
                value = cast(value)
                break
            except ValueError:
                pass
        if value in ("True", "False"):
            value = value == "True"
        overrides[key] = value
    return name, overrides


def kernel_stats(xplane_path: str, steps: int, top: int) -> list[str]:
    """The `top` device kernels by total time, per step, from a profile (needs `xprof`).

    XLA:GPU runs most of a step as one CUDA graph ("command buffer"), so the trace's op events
    show a single op; the kernels inside come from xprof's kernel_stats.
    """
    from xprof.convert import raw_to_tool_data

    data, _ = raw_to_tool_data.xspace_to_tool_data([xplane_path], "kernel_stats", {})
    table = json.loads(data)
    names = [column["id"] for column in table["cols"]]
    rows = [dict(zip(names, (cell["v"] for cell in row["c"]))) for row in table["rows"]]
    total = sum(r["total_duration_us"] for r in rows)
    lines = [
        f"device kernels: {total / steps / 1e3:.1f} ms per step, "
        f"{sum(r['occurrences'] for r in rows) / steps:.0f} launches per step"
    ]
    for r in sorted(rows, key=lambda r: -r["total_duration_us"])[:top]:
        us = r["total_duration_us"]
        lines.append(
            f"  {us / steps / 1e3:8.2f} ms {us / total:6.1%} {r['occurrences'] / steps:5.0f}x"
            f"  {r['kernel_name'][:90]}"
        )
    return lines


# Kernel name -> class, first match wins (XLA:GPU names fusions by their root: loop_*_fusion,
# input_reduce_fusion, wrapped_transpose...; cuBLAS/cuDNN kernels by their library).
KERNEL_CLASSES = (
    ("fused attention", r"bert_flash_attention|flash|fmha|cudnn"),
    ("matmul", r"gemm|nvjet|cublas|cutlass|xmma|triton_dot|ynn_fusion|dot"),
    ("collective/copy", r"nccl|all-reduce|all_reduce|memcpy|memset"),
    ("scatter/gather", r"scatter|gather|dynamic_slice|dynamic_update"),
    ("reduction", r"reduce|softmax|norm"),
    ("layout (transpose/copy)", r"transpose|copy|concatenate|slice|pad\b|bitcast"),
    ("elementwise fusion", r"fusion|loop_|wrapped_|convert|add|multiply|select|exp"),
)


def kernel_class(name: str) -> str:
    for label, pattern in KERNEL_CLASSES:
        if re.search(pattern, name, re.IGNORECASE):
            return label
    return "other"


def class_times(perfetto_path: str, steps: int) -> list[str]:
    """Device time per kernel class per step, from a trace's Perfetto JSON (no xprof needed):
    the events of /device:* processes (GPU kernels), else the XLA threads of a CPU host."""
    with gzip.open(perfetto_path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    meta = [e for e in events if e.get("ph") == "M"]
    procs = {e["pid"]: e["args"]["name"] for e in meta if e.get("name") == "process_name"}
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in meta if e.get("name") == "thread_name"
    }
    device = {pid for pid, name in procs.items() if name.startswith("/device:")}
    # A GPU's kernels are on its "Stream #N" lines; derived lines (XLA Modules, XLA Ops, Steps)
    # repeat the same time and are left out.
    streams = {key for key, name in threads.items() if key[0] in device and "Stream" in name}

    def is_kernel(e) -> bool:
        if streams:
            return (e["pid"], e["tid"]) in streams
        if device:
            name = threads.get((e["pid"], e["tid"]), "")
            return e["pid"] in device and not re.search(r"Modules|Steps|Framework", name)
        on_xla_thread = threads.get((e["pid"], e["tid"]), "").startswith(("tf_XLA", "XLA"))
        return on_xla_thread and not re.search(r"ThunkExecutor|ThreadPool", e["name"])

    per_class = collections.Counter()
    per_kernel = collections.Counter()
    for e in events:
        if e.get("ph") == "X" and is_kernel(e):
            per_class[kernel_class(e["name"])] += e.get("dur", 0.0)
            per_kernel[e["name"]] += e.get("dur", 0.0)
    total = sum(per_class.values()) or 1.0
    lines = [f"device time by kernel class: {total / steps / 1e3:.2f} ms per step"]
    for label, us in per_class.most_common():
        lines.append(f"  {us / steps / 1e3:8.2f} ms {us / total:6.1%}  {label}")
    lines.append("top kernels:")
    for name, us in per_kernel.most_common(10):
        lines.append(
            f"  {us / steps / 1e3:8.2f} ms {us / total:6.1%}  [{kernel_class(name)}] {name[:80]}"
        )
    return lines


def _cast_then_gather(gathered_table, dtype, table, rows_axis):
    """The earlier lookup: tables cast to the compute dtype before `jnp.take`."""
    return gathered_table(table.astype(dtype), rows_axis)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="base")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--variant", action="append", default=[])
    parser.add_argument("--out", help="directory for the profiles")
    parser.add_argument(
        "--summarize", metavar="XPLANE", help="only print the kernels of a profile taken earlier"
    )
    args = parser.parse_args(argv)
    if args.summarize:
        print("\n".join(kernel_stats(args.summarize, 3, args.top)))
        return 0
    if not args.out:
        parser.error("--out is required")

    import jax

    from bert_jax.bench import data as bench_data
    from bert_jax.bench import spec as bench_spec
    from bert_jax.bench.ours import OursRunner
    from bert_jax.core import model as model_lib
    from bert_jax.training.config_lib import pretraining_config

    original_gathered_table = model_lib.gathered_table

    os.makedirs(args.out, exist_ok=True)
    config = pretraining_config(args.size)
    summary = []
    for text in args.variant or ["base"]:
        name, overrides = parse_variant(text)
        bf16_lookup = overrides.pop("bf16_lookup", False)
        model_lib.gathered_table = (
            functools.partial(_cast_then_gather, original_gathered_table, args.dtype)
            if bf16_lookup
            else original_gathered_table
        )
        spec = bench_spec.spec_from_config(
            config,
            seq_len=args.seq_len,
            batch_size=args.batch,
            steps=args.steps,
            windows=args.windows,
        )
        spec = dataclasses.replace(
            spec, model=spec.model.replace(**{"dtype": args.dtype, **overrides})
        )
        runner = OursRunner(spec, bench_data.synthetic_data(spec).batches)
        seconds = statistics.median(
            w.seconds / w.steps for w in (runner.window(args.steps) for _ in range(args.windows))
        )
        tokens = args.batch * args.seq_len
        flops = bench_spec.model_flops_per_token(spec) * tokens / seconds
        peak = bench_spec.peak_flops(spec, runner.devices[0].device_kind)
        mfu = f"{flops / peak:.1%}" if peak else "-"
        line = (
            f"{name}: {seconds * 1e3:.1f} ms/step, {tokens / seconds:,.0f} tok/s, "
            f"{flops / 1e12:.1f} TFLOP/s, MFU {mfu}, compile {runner.compile_seconds:.0f}s"
        )
        print(line, flush=True)
        summary.append(line)

        trace_dir = tempfile.mkdtemp(prefix=f"trace_{name}_")
        jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
        runner.window(3)
        jax.profiler.stop_trace()
        for path in glob.glob(os.path.join(trace_dir, "plugins/profile/*/*.xplane.pb")):
            shutil.copy(path, os.path.join(args.out, f"{name}.xplane.pb"))
        for path in glob.glob(os.path.join(trace_dir, "plugins/profile/*/perfetto_trace.json.gz")):
            perfetto = os.path.join(args.out, f"{name}.perfetto.json.gz")
            shutil.copy(path, perfetto)
            classes = class_times(perfetto, 3)
            print("\n".join(classes))
            summary.extend(f"{name}: {line}" for line in classes)
        try:
            print("\n".join(kernel_stats(os.path.join(args.out, f"{name}.xplane.pb"), 3, args.top)))
        except ImportError:
            print(f"  kernels: `pip install xprof`, then --summarize {name}.xplane.pb")
        runner.close()
        del runner
    print("\n".join(summary))
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write("\n".join(summary) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
