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

SQuAD v1.1/v2.0 and CoNLL-2003 NER (`bert-jax finetune --task squad/v1.1|squad/v2.0|conll2003`):
- `squad`: the official JSON (or TFDS), sub-token character spans, windows (max-context rule).
- `squad_eval`: answers from start/end logits (n-best, max length, v2.0 null odds); official EM/F1.
- `ner`: CoNLL column files (or TFDS), IOB1/IOB2, conlleval's span scores, first-sub-token features.
- `token_heads`: a dense head at every token (`BertForTokenOutputs`); span and tagging losses.
- `token_loop`: their fine-tuning loop on `train.py`'s update (the GLUE loop's recipe).
- `token_tasks`: `run_token_task(...)`: read, fine-tune, write predictions, result.json, results.md.

The paper's other evaluations (docs/paper.md lists every table with its commands):
- `swag`, `swag_task`: SWAG's official CSV files, four choices scored on the pooled [CLS]
  (`heads.BertForMultipleChoice`), `run_swag(...)` (Table 4).
- `feature_tagger`, `feature_ner`: frozen BERT layers (six variants) into a two-layer BiLSTM
  tagger, `run_feature_ner(...)` (`--features`, Table 7).
- `run`: one run of any task by name (`bert-jax finetune`); `curve`: a task from each retained
  checkpoint of a pretraining workdir, the score against the step (`--each-checkpoint`, Figure 5).
"""
