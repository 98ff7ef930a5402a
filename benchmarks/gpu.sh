#!/usr/bin/env bash
# The GPU rows of docs/performance.md, in one go (one H100/H200; bf16):
#   BERT-Base seq 128 and BERT-Large seq 512 beside Hugging Face's FlaxBertForPreTraining, then
#   the fused-attention check (benchmarks/gpu_attention.py).
# Usage: benchmarks/gpu.sh OUT_DIR [extra `bert-jax bench` flags]
# BERT_JAX (default `.venv/bin/bert-jax`) and PEER_PYTHON (default: .venv-peer/bin/python, made
# by `make bench-peer`) name the two environments.
set -uo pipefail
out=${1:?usage: benchmarks/gpu.sh OUT_DIR [bench flags]}
shift
mkdir -p "$out"
bert_jax=${BERT_JAX:-.venv/bin/bert-jax}
peer=(--peer hf-flax ${PEER_PYTHON:+--peer-python "$PEER_PYTHON"})
bench() {
  local name=$1
  shift
  timeout "${BENCH_TIMEOUT:-900}" $bert_jax bench "$@" --config.model.dtype=bfloat16 "${peer[@]}" --json "$out/$name.json" \
    2>&1 | tee "$out/$name.txt"
}
bench base128 --config configs/bert.py:base --seq-len 128 --batch 256 --steps 20 --windows 5 "$@"
bench large512 --config configs/bert.py:large --seq-len 512 --batch 32 --steps 10 --windows 5 "$@"
timeout "${BENCH_TIMEOUT:-900}" ${PYTHON:-.venv/bin/python} benchmarks/gpu_attention.py --json "$out/attention.json" 2>&1 |
  tee "$out/attention.txt"
