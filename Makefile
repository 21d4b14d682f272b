# Two commands on a fresh machine: `make demo` trains the default experiment
# on synthetic data on the CPU; `make test` runs the test suite (what CI runs).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
MODEL_DIR ?= runs/demo

.PHONY: demo test test-fast bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/recsys train --gin_file experiments/synthetic_dlrm.gin --model_dir $(MODEL_DIR)

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

bench: $(STAMP)
	OMP_NUM_THREADS=2 $(BIN)/python benchmarks/embedding_step.py

clean:
	rm -rf $(VENV) runs
