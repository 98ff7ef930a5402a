"""What runs write for people to read.

- `sweep_report`: a sweep's results.json, .csv, .md (Table 1 layout) and plots.
"""
