"""Where a train step's device time goes (a benchmark, not a test): time, then profile.

    python benchmarks/gpu_profile.py --size base --seq-len 128 --batch 256 --dtype bfloat16 \
        --variant base --variant prng:dropout_impl=prng --out DIR

Each `--variant NAME[:field=value,...]` overrides `BertConfig` fields of the `configs/bert.py`
size; the field `bf16_lookup=True` instead restores the earlier embedding lookup (the table cast
to the compute dtype before the gather, so its gradient is a bf16 scatter-add), for comparison. Per variant: our real train step (`bench.OursRunner`: forward, backward, BERT AdamW,
dropout, donated state) is compiled, timed (median of windows), and 3 steps are traced with
`jax.profiler`. Printed: step time and MFU, then the device ops that took the most time,
summed over the traced steps (from the trace's JSON). Written to DIR: `NAME.xplane.pb` (for
xprof's hlo_stats / trace viewer) and `NAME.ops.json` (time per op name).
"""

from __future__ import annotations

import argparse
import collections
import functools
import glob
import gzip
import json
import os
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


def device_op_times(trace_json_gz: str) -> dict[str, float]:
    """Microseconds per op name over the device (GPU/TPU) threads of a profiler trace."""
    with gzip.open(trace_json_gz, "rt") as f:
        trace = json.load(f)
    device_pids = {
        e["pid"]
        for e in trace["traceEvents"]
        if e.get("ph") == "M"
        and e.get("name") == "process_name"
        and "/device:" in str(e.get("args", {}).get("name", ""))
    }
    totals: dict[str, float] = collections.defaultdict(float)
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("pid") in device_pids:
            args = e.get("args", {})
            name = args.get("hlo_op") or args.get("long_name") or e.get("name", "?")
            totals[str(name)[:120]] += float(e.get("dur", 0.0))
    return dict(totals)


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
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    import jax

    from bert_jax import bench
    from bert_jax import model as model_lib
    from bert_jax.config_lib import pretraining_config

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
        spec = bench.spec_from_config(
            config,
            seq_len=args.seq_len,
            batch_size=args.batch,
            steps=args.steps,
            windows=args.windows,
        )
        spec = bench.dataclasses.replace(
            spec, model=spec.model.replace(**{"dtype": args.dtype, **overrides})
        )
        runner = bench.OursRunner(spec, bench.synthetic_data(spec).batches)
        seconds = statistics.median(
            w.seconds / w.steps for w in (runner.window(args.steps) for _ in range(args.windows))
        )
        tokens = args.batch * args.seq_len
        flops = bench.model_flops_per_token(spec) * tokens / seconds
        peak = bench.peak_flops(spec, runner.devices[0].device_kind)
        mfu = f"{flops / peak:.1%}" if peak else "-"
        line = (
            f"{name}: {seconds * 1e3:.1f} ms/step, {tokens / seconds:,.0f} tok/s, "
            f"{flops / 1e12:.1f} TFLOP/s, MFU {mfu}, compile {runner.compile_seconds:.0f}s"
        )
        print(line, flush=True)
        summary.append(line)

        trace_dir = tempfile.mkdtemp(prefix=f"trace_{name}_")
        jax.profiler.start_trace(trace_dir)
        runner.window(3)
        jax.profiler.stop_trace()
        for path in glob.glob(os.path.join(trace_dir, "plugins/profile/*/*.xplane.pb")):
            shutil.copy(path, os.path.join(args.out, f"{name}.xplane.pb"))
        traces = glob.glob(os.path.join(trace_dir, "plugins/profile/*/*.trace.json.gz"))
        if traces:
            ops = device_op_times(traces[0])
            with open(os.path.join(args.out, f"{name}.ops.json"), "w") as f:
                json.dump(ops, f, indent=1)
            total = sum(ops.values())
            print(f"  device time per step {total / 3 / 1e3:.1f} ms over {len(ops)} op names")
            for op, us in sorted(ops.items(), key=lambda kv: -kv[1])[: args.top]:
                print(f"  {us / 3 / 1e3:8.2f} ms {us / total:6.1%}  {op}")
        runner.close()
        del runner
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
