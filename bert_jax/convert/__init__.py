"""Checkpoint interop: Google TF1 BERT and Hugging Face BERT, in and out.

- `mapping`: the one table of every weight's bert-jax path, Hugging Face key and TF1 name.
- `strict`: the strict import every reader uses (each tensor used once, each parameter filled
  with the right shape), `ConversionError` and `ConversionReport`.
- `tf1`: Google's checkpoints (read with TensorFlow, imported lazily).
- `hf`: Hugging Face directories (safetensors / pytorch_model.bin in; safetensors out).
- `safetensors`: the safetensors file format, read and written with NumPy.
- `model_dir`: bert-jax's own format, the model directory (config.json, params/, tokenizer/):
  save, read, load onto a mesh.
- `between_formats`: `convert()`, what `bert-jax convert` runs: any source format read,
  checked and written as any target, with a report.

Nothing is imported here, so `from bert_jax.convert import mapping` stays light. These modules
import nothing above the model and the data layer. Reading a pretraining workdir's checkpoint as
a model needs training/ and stands there (`bert_jax.training.load_model`); the command hands that
loader to `convert()`.
"""
