"""Fine-tuning's training: the settings, the step loop and the tuners (state and compiled steps).

- `settings`: `FinetuneSettings` (a task's recipe over them), `PretrainedEncoder`.
- `steps`: the optimizers and schedules, the step loop every family trains with.
- `head_tuner`: `HeadTuner`, BERT and a head on the mesh, compiled once.
- `batches`: a sentence task's splits as fixed-length arrays; fixed-shape batches.
- `sentence_tuning`: `finetune(...)`: a classifier on the pooled [CLS] for a sentence task.
- `token_tuning`: the token-level tuner and its train-and-evaluate loop (SQuAD, CoNLL-2003).
"""
