"""The dtypes a model may compute and keep its parameters in, by name; no JAX import, so
`--help` and the declarations of plan and encode read them too."""

# README: bfloat16 / float32. Other spellings ('bf16', 'fp32') are refused naming these, so that
# config.json and the model directory say each dtype one way.
DTYPES = ("float32", "bfloat16")
