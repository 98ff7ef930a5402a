"""What each fine-tuning task is: one module per task family (its reader, features, metrics and
tasks), and the registry every command looks tasks up in.

- `task`: `Task`, the record every task registers (family, names, metrics, the paper's figures,
  its place in the sweep and the reports).
- `registry`: every task by name; `register` for a task defined elsewhere.
- `glue`: `SentenceTask`, GLUE's nine, the local-directory and TFDS readers.
- `glue_metrics`: the official GLUE metrics, Table 1's summary and the official average.
- `squad`: SQuAD v1.1/v2.0: the official JSON (or TFDS), sub-token spans, windows.
- `squad_answers`: answers from start/end logits; the official EM/F1.
- `conll`: CoNLL-2003: column files (or TFDS), IOB1/IOB2, first-sub-token features, conlleval.
- `swag`: SWAG: the official CSV files, four-choice features.
"""
