# Two commands on a fresh machine: `make demo` trains the default experiment
# on synthetic data on the CPU; `make test` runs the test suite (what CI runs).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
MODEL_DIR ?= runs/demo
SOURCES := recsys backends benchmarks tests

.PHONY: demo test test-fast lint bench kernels clean

# uv installs the same pinned set as pip, 3x faster from an empty cache
# (13 s against 44 s here, docs/testing.md); pip installs it when uv cannot.
# Both write the packages' bytecode (pip by default, uv when told): without
# it a process run where PYTHONDONTWRITEBYTECODE is set compiles
# TensorFlow's Python sources again at every import (6.7 CPU-seconds for
# `import recsys, tensorflow` instead of 2.5; the suite starts ~80 of them).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	( $(BIN)/pip install --quiet uv && \
	  $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python \
	    -e '.[test,lint]' ) || \
	( $(BIN)/pip install --quiet --upgrade pip && \
	  $(BIN)/pip install --quiet -e '.[test,lint]' )
	$(BIN)/python -m backends.tensorcore.kernels || echo "make: fused CPU kernels not built; the TF ops will be used"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/recsys train --gin_file experiments/synthetic_dlrm.gin --model_dir $(MODEL_DIR)

# Two workers, whole test files each (module fixtures are built once): the
# suite took 11 minutes instead of 17.5 on 2 cores. Files go out largest
# first (tests/conftest.py orders them; xdist's own reorder, by test count,
# would hand the few-test cluster and benchmark files out last).
#
# The project's own modules are byte-compiled first (the editable install
# leaves them as sources): every TF process the tests start imports them.
test: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 $(SOURCES) >/dev/null
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15

# Style and types (configured in pyproject.toml): formatting everywhere, lint
# and mypy on the package. CI runs this before the tests.
lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check backends recsys
	$(BIN)/mypy

test-fast: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 $(SOURCES) >/dev/null
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not slow"

# The comparison implementations come from the `bench` extra; torchrec is
# installed without its dependencies (it declares the CUDA fbgemm-gpu, the
# extra brings fbgemm-gpu-cpu). The script skips whatever is missing.
bench: $(STAMP)
	$(BIN)/pip install -q -e '.[bench]' && $(BIN)/pip install -q --no-deps torchrec==1.8.0
	OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE $(BIN)/python benchmarks/embedding_step.py --repeats 3
	OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE $(BIN)/python benchmarks/dlrm_vs_torchrec.py --config default,heavy --repeats 3

# The fused CPU kernels (backends/tensorcore/kernels/*.cc, one library), rebuilt.
kernels: $(STAMP)
	$(BIN)/python -m backends.tensorcore.kernels --force

clean:
	rm -rf $(VENV) runs
