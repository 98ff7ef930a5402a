"""Fine-tuning heads, GLUE tasks and metrics, the fine-tuning loop and the GLUE sweep.

- `tasks`: GLUE task specs; readers for a local GLUE directory (standard layout) and TFDS `glue/*`.
- `metrics`: the official GLUE metrics, the paper's Table 1 summary and the official averaging.
- `heads`: `BertForSequenceClassification` (BertModel + dropout + dense on the pooled [CLS]).
- `features`: a task's splits as fixed-length arrays; the fixed-shape batches of a run.
- `loop`: `finetune(encoder, data, settings)` on the device mesh (the sweep's unit), on
  `train.py`'s state and update step with the classifier's loss.
- `sweep`: `run_sweep(...)` (`bert-jax glue`) and `run_single(...)` (`bert-jax finetune`).
- `report`: results.json / .csv / .md (Table 1 layout) and per-task plots.
- `workdir`: the workdir as an output: its marker, and the check before writing into it.
"""
