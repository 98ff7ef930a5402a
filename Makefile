# The single place where commands are spelled out.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_DIR ?= demo_workdir
# Tests run on 2 workers by default; override with `make test PYTEST_WORKERS=auto`.
PYTEST_WORKERS ?= 2

.PHONY: venv test demo lint format clean

venv: $(STAMP)

# Recreated only when pyproject.toml changes; `make test` and `make demo` depend on it.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) -q

# A fresh run each time (a kept workdir would resume at its final step and do nothing).
demo: $(STAMP)
	rm -rf $(DEMO_DIR)
	$(BIN)/bert-jax pretrain --config configs/demo.py --workdir $(DEMO_DIR)

lint: $(STAMP)
	$(BIN)/ruff check bert_jax configs tests launch
	$(BIN)/ruff format --check bert_jax configs tests launch

format: $(STAMP)
	$(BIN)/ruff format bert_jax configs tests launch
	$(BIN)/ruff check --fix bert_jax configs tests launch

clean:
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache .ruff_cache
