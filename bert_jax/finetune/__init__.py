"""Fine-tuning and evaluation: GLUE, SQuAD v1.1/v2.0, CoNLL-2003 (fine-tuned and feature-based),
SWAG, and the score against pretraining step; by kind of thing, from the bottom up:

- `tasks/`: what each task is: the registry (one record per task) and one module per family
  (reader, features, metrics).
- `heads/`: the models on top of BERT (pooled [CLS], per token, the BiLSTM tagger) and losses.
- `tuning/`: a run's settings, the step loop and the tuners every family trains with.
- `reports/`: what runs write for people: a sweep's tables and plots, one run's table beside
  the paper.
- `runs/`: one task by name (`bert-jax finetune`), the GLUE sweep (`bert-jax glue`), the
  checkpoint curve, each family's run, the workdir.
"""
