"""What runs write for people to read.

- `references`: what scores are read against: the paper's Table 1 rows, the majority-class
  baseline, the warning for a model that predicts one class.
- `trial_groups`: a sweep's trials grouped by task and learning rate, read by the reports below.
- `sweep_plot`: a sweep's plot of one task.
- `sweep_report`: a sweep's results.json, .csv, .md (Table 1 layout) and plots.
- `run_report`: one run's results.md beside the paper and its plot (SQuAD, CoNLL-2003, SWAG).
- `curve_report`: the checkpoint curve's curve.md and plot (Figure 5).
"""
