#!/usr/bin/env bash
# The GPU rows of docs/performance.md in one run on one H100/H200 (bf16, dropout 0.1), within
# BUDGET_S seconds (default 450: 8 minutes with room to start), stages in order of worth:
#   1. check: the compiled Pallas attention against the einsum path (tests/pallas_gpu_check.py),
#      again with the einsum form's backward if the Pallas backward kernels fail;
#   2. Base seq 128, packed: ours with attention_impl=xla beside Hugging Face's Flax BERT, then
#      beside Hugging Face's PyTorch BERT (eager and torch.compile, bf16 autocast), then ours
#      with attention_impl=pallas (the fused kernel that keeps attention dropout);
#   3. Large seq 512, packed: ours, xla then pallas;
#   4. profile: a Base seq-128 step (batch 64) per attention_impl, device time per kernel class;
#   5. Large seq 512 beside the peers (last: the peers' Large compiles are the longest; ours
#      comes from the persistent compilation cache that stage 3 filled).
# Each peer runs in its own bench run beside ours, so that a peer that fails or does not fit in
# the device's memory beside ours costs only its own row.
# Each stage gets what is left of the budget; one that fails or runs out is noted and the next
# runs. What to read lands in OUT_DIR (summary.txt, a .txt log and .json per stage,
# profile_summary.txt); the bulky parts (traces, compilation cache, installed wheels) in WORK
# (default $TMPDIR/bert_jax_gpu_sh), so that OUT_DIR stays small enough to fetch back.
#
# Usage: benchmarks/gpu.sh OUT_DIR [--dry-run | --tiny]
#   --dry-run  print the commands, run nothing;  --tiny  Mini-sized, runs on CPU in a few minutes
#              (checks the script end to end; the fused runs fall back to the einsum path there).
# Environment: PYTHON (default .venv/bin/python, else python3). The GPU image needs no TensorFlow;
# ml_collections (bench's --config) must be importable: WHEELS=DIR installs it, and the peer's
# transformers 4.57.6 (the last with Flax BERT; transformers 5 has none), from wheels made by
# `make gpu-wheels` into WORK/pydeps. PEER_PYTHON: a Python with transformers 4.57.6, if any.
# The PyTorch peer runs in PYTHON itself: the image's CUDA torch and its transformers (any
# version with BertForPreTraining and SDPA attention). Without a peer, the bench rows run ours
# only and say so.
set -uo pipefail
out=${1:?usage: benchmarks/gpu.sh OUT_DIR [--dry-run | --tiny]}
mode=${2:-}
work=${WORK:-${TMPDIR:-/tmp}/bert_jax_gpu_sh}
mkdir -p "$out" "$work/profile"
out=$(cd "$out" && pwd)
[[ -n ${WHEELS:-} ]] && WHEELS=$(cd "$WHEELS" && pwd)
cd "$(dirname "$0")/.."
python=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
budget=${BUDGET_S:-450}
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$work/jax_cache}
start=$SECONDS
summary="$out/summary.txt"
: >"$summary"
note() { echo "gpu.sh: $*" | tee -a "$summary"; }
run() { # NAME CAP_S CMD...: run under the smaller of CAP_S and what is left; log to OUT/NAME.txt
  local name=$1 cap=$2 left=$((budget - (SECONDS - start)))
  shift 2
  ((cap > left)) && cap=$left
  if [[ $mode == --dry-run ]]; then
    echo "[$name, <= ${cap}s] $*"
    return 0
  fi
  if ((cap < 20)); then
    note "$name: skipped, ${left}s of the budget left"
    return 1
  fi
  local t0=$SECONDS
  timeout "$cap" "$@" >"$out/$name.txt" 2>&1
  local rc=$?
  note "$name: exit $rc after $((SECONDS - t0))s$( ((rc == 124)) && echo ' (timed out)')"
  tail -n 12 "$out/$name.txt"
  return $rc
}

# --- environment: ml_collections for ours, transformers 4.57.6 (Flax) for the peer ---
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if [[ -n ${WHEELS:-} && $mode != --dry-run ]]; then
  "$python" -m pip install --quiet --upgrade --no-index --no-deps --find-links "$WHEELS" \
    --target "$work/pydeps" ml-collections transformers huggingface-hub tokenizers \
    2>&1 | tail -n 3
  export PYTHONPATH=$PYTHONPATH:$work/pydeps
fi
"$python" -c "import jax, ml_collections; print('jax', jax.__version__, jax.devices())" 2>&1 |
  tee -a "$summary" || note "ml_collections missing: bench and profile will fail (set WHEELS)"
peer=()
peer_python=${PEER_PYTHON:-$python}
if "$peer_python" -c "from transformers import FlaxBertForPreTraining" >/dev/null 2>&1; then
  peer=(--peer hf-flax --peer-python "$peer_python")
else
  note "no Hugging Face Flax BERT in $peer_python (transformers 5 has none): no hf-flax rows"
fi
torch_peer=()
if "$python" -c "import torch; from transformers import BertForPreTraining" >/dev/null 2>&1; then
  torch_peer=(--peer hf-torch)
  "$python" -c "import torch, transformers; print('torch', torch.__version__, 'cuda',
torch.cuda.is_available(), 'transformers', transformers.__version__)" 2>&1 | tee -a "$summary"
else
  note "no torch with transformers' BertForPreTraining in $python: no hf-torch rows"
fi

if [[ $mode == --tiny ]]; then
  sizes=("mini128:configs/bert.py:mini:128:8" "mini256:configs/bert.py:mini:256:4")
  timing=(--steps 1 --windows 1 --warmup 1)
  # torch.compile on CPU takes minutes; the script's check needs the eager step only.
  ((${#torch_peer[@]})) && torch_peer=(--peer hf-torch-eager)
  profile=(--size mini --seq-len 64 --batch 4 --steps 1 --windows 1 --dtype float32)
  dtype=float32
else
  sizes=("base128:configs/bert.py:base:128:256" "large512:configs/bert.py:large:512:32")
  timing=(--steps 5 --windows 3 --warmup 2)
  profile=(--size base --seq-len 128 --batch 64 --steps 3 --windows 1 --dtype bfloat16)
  dtype=bfloat16
fi

# 1. The fused kernel is only benchmarked where it equals the einsum path.
fused_ok=1
if [[ $mode == --tiny ]]; then
  note "check: skipped in --tiny (needs a GPU; tests/test_attention.py covers the interpreter)"
else
  if ! run check 90 "$python" -m tests.pallas_gpu_check --quick; then
    # The forward kernel alone, gradients through the einsum form: still keeps the probabilities
    # out of the forward pass.
    export BERT_JAX_ATTENTION_BACKWARD=reference
    run check-reference-backward 60 "$python" -m tests.pallas_gpu_check --quick || fused_ok=0
    ((fused_ok)) && note "fused rows below use BERT_JAX_ATTENTION_BACKWARD=reference"
  fi
fi

# 2-3. Each size: einsum attention beside the peer, then the fused kernel alone.
# The packed rows' instances: BERT's uncased vocabulary where carried (as on the CPU rows), else
# bench trains a small SentencePiece model on the embedded corpus.
tokenizer=()
[[ -f ${WHEELS:-}/tokenizer.json ]] && tokenizer=(--tokenizer "$WHEELS/tokenizer.json")
bench() { # NAME CAP_S CONFIG SEQ BATCH IMPL [flags]
  local name=$1 cap=$2 config=$3 seq=$4 batch=$5 impl=$6
  shift 6
  run "$name" "$cap" "$python" -m bert_jax.cli bench --config "$config" --seq-len "$seq" \
    --batch "$batch" --packing "${timing[@]}" --config.model.dtype="$dtype" \
    --config.model.attention_impl="$impl" --json "$out/$name.json" "${tokenizer[@]}" "$@"
  # The result rows, for the table: ours, the peers, their ratios, the first-step losses.
  [[ -f $out/$name.txt ]] &&
    grep -E '^\| (bert-jax|hf-flax|hf-torch)|^bert-jax / |^first-step loss' "$out/$name.txt" |
    sed "s/^/$name: /" >>"$summary"
}
for entry in "${sizes[@]}"; do
  IFS=: read -r name file arg seq batch <<<"$entry"
  if [[ $entry == "${sizes[0]}" ]]; then
    bench "$name-xla" 150 "$file:$arg" "$seq" "$batch" xla "${peer[@]}"
    # Ours again from the compilation cache; the peer compiles twice (eager's first step, then
    # Inductor's kernels).
    ((${#torch_peer[@]})) && bench "$name-xla-torch" 200 "$file:$arg" "$seq" "$batch" xla \
      "${torch_peer[@]}"
  else
    bench "$name-xla" 120 "$file:$arg" "$seq" "$batch" xla
  fi
  if ((fused_ok)); then
    bench "$name-pallas" 100 "$file:$arg" "$seq" "$batch" pallas
  else
    note "$name-pallas: skipped, the kernel check failed (check.txt)"
  fi
done

# 4. Where the time goes, per kernel class; command buffers off so the trace shows kernels.
variants=(--variant xla:attention_impl=xla)
((fused_ok)) && variants+=(--variant pallas:attention_impl=pallas)
XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer=" run profile 150 \
  "$python" benchmarks/gpu_profile.py "${profile[@]}" "${variants[@]}" --top 15 --out "$work/profile"
if [[ -f $work/profile/summary.txt ]]; then
  cp "$work/profile/summary.txt" "$out/profile_summary.txt"
  sed "s/^/profile: /" "$work/profile/summary.txt" >>"$summary"
fi

# 5. The second size beside the peers, with what is left: PyTorch first (the peer users run).
IFS=: read -r name file arg seq batch <<<"${sizes[1]}"
if ((${#torch_peer[@]})); then
  bench "$name-xla-torch" 240 "$file:$arg" "$seq" "$batch" xla "${torch_peer[@]}"
fi
if ((${#peer[@]})); then
  bench "$name-xla-peer" 240 "$file:$arg" "$seq" "$batch" xla "${peer[@]}"
fi
note "done in $((SECONDS - start))s of ${budget}s"
