"""The runs: one task by name, the GLUE sweep, the checkpoint curve, each family's run.

- `workdir`: the workdir as an output: its marker, the check before writing, one writer.
- `sweep`: `bert-jax glue` (tasks x learning rates x seeds, resumable) and one sentence task.
- `squad_and_conll`: a SQuAD or fine-tuned CoNLL-2003 run: read, fine-tune, write its files.
- `conll_features`: CoNLL-2003 from frozen BERT features (`--features`, Table 7).
- `swag`: a SWAG run (Table 4).
- `one_task`: one run of any registered task by name (`bert-jax finetune`).
- `curve`: a task from each retained checkpoint of a pretraining workdir (Figure 5).
"""
