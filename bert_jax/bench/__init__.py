"""Training throughput: `bert-jax bench`, optionally beside Hugging Face's PyTorch or Flax BERT.

What is timed: the real pretraining step (`trainer.ShardedTrainer`: forward, backward, BERT AdamW
with clipping, dropout on, donated state), compiled once ahead of time (compile time reported),
warmed up, then `windows` windows of `steps` steps each, blocking on the results at the end of
every window; figures are medians over windows. Batches are synthetic (full rows, no padding) or
real: instances made from the embedded corpus, with its real length distribution, optionally
packed several to a row (`data/pipeline/packing.py`).

Reported per side: step time, sequences (instances) per second, tokens per second (real and
padded), model TFLOP/s, MFU and HFU, peak device memory (where the device reports it) and compile
time. Model FLOPs are `flops.flops_per_token` on real tokens with the MLM head on the
predicted positions: the work the model needs, the same for both sides. Hardware FLOPs (HFU)
count what is computed: every position of every row, padding included, and the MLM head on every
position for a model that does not gather the masked positions first; there is no
rematerialization to add. MFU and HFU need a known chip (the hardware table,
`runtime/hardware.py`, by exact device kind; or `peak_tflops`); on CPU they are left out.

The peers run as subprocesses on the same batches; windows alternate between the sides so that
machine noise hits all of them, and the ratio of median tokens per second (ours / peer) is
reported for each. `peer="hf-torch"` is `transformers.BertForPreTraining` with SDPA attention in
this environment (`bench/peer_torch.py`), twice: eager and under `torch.compile`; it starts
from our initial parameters, so the first-step losses compare. A ModernBERT config
(`configs/modernbert.py:SIZE`) is timed beside `transformers.ModernBertForMaskedLM` the same
way. `peer="hf-flax"` is `transformers.FlaxBertForPreTraining` (transformers 4.57.6) in its
own environment (`make bench-peer` makes `.venv-peer`). `spec.peer_differences` lists what
differs between the steps.

The modules, bottom to top (none imports TensorFlow; `spec` reads a ConfigDict by attribute
only, so ml_collections is not needed either):

    settings  what the command line sets (BenchSettings), each setting declared once
    spec      what one benchmark is (BenchSpec), its JSON form, the FLOPs its step takes
    data      the host batches: synthetic full rows or the embedded corpus, optionally packed
    report    timed windows, per-side results (medians, MFU/HFU), the table and the JSON file
    ours      our sharded train step, compiled ahead of time, timed window by window
    peer      Hugging Face's Flax BERT in its own process, and our driver of the peers' processes
    peer_torch  Hugging Face's PyTorch BERT (eager or compiled) in its own process
    timing    `run`: all sides, windows alternating, into a BenchReport
"""
