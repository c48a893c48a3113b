# Two commands on a fresh clone: `make demo` and `make test`. Both create .venv if needed.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.hybridflow-installed

.PHONY: venv demo test bench clean-venv

# Installs torch==2.13.0 explicitly first (an unpinned torch pulls GBs of CUDA wheels),
# then the package with its extras. Re-runs only when pyproject.toml changes.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -e ".[all]"
	@touch $(STAMP)

venv: $(STAMP)

demo: venv
	$(VENV)/bin/hybridflow selfcheck

test: venv
	$(PY) -m pytest -q

clean-venv:
	rm -rf $(VENV)
