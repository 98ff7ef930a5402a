"""What each fine-tuning task is: the registry, and one module per task family.

- `task`: `Task`, the record every task registers (family, names, metrics, figures, places).
- `registry`: every task by name, found in this package's modules; `register` for others.
- `glue`: `SentenceTask`, GLUE's nine tasks, the local-directory and TFDS readers.
- `glue_metrics`: the official GLUE metrics, Table 1's summary and the official average.
- `squad`: SQuAD v1.1/v2.0: its tasks, the official JSON (or TFDS), sub-token spans, windows.
- `squad_answers`: answers from start/end logits; the official EM/F1.
- `conll`: CoNLL-2003's two tasks, column files (or TFDS), IOB tags, features, conlleval.
- `swag`: SWAG: its task, the official CSV files, four-choice features.
"""
