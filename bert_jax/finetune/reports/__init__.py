"""What runs write for people to read.

- `sweep_report`: a sweep's results.json, .csv, .md (Table 1 layout) and plots.
- `run_report`: one run's results.md beside the paper and its plot (SQuAD, CoNLL-2003, SWAG).
- `curve_report`: the checkpoint curve's curve.md and plot (Figure 5).
"""
