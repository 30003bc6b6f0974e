# Set-up and the two README commands. Everything is created from nothing in .venv and .venv-latest.
# TORCH_SPEC: on the project's CPU machines `torch==2.13.0` resolves to a local CPU wheel; elsewhere pass
# e.g. TORCH_SPEC='torch==2.9.1' or TORCH_SPEC=torch (an already-installed torch in range is kept).
# Two stacks are tested: .venv is the pinned one (constraints.txt, with the `convert` extra: nvidia-modelopt 0.37
# and transformers 4, as TensorRT-LLM 1.2.1 ships them), .venv-latest the newest releases (transformers 5.x;
# no conversion extra, so the conversion tests skip there). Remove .venv-latest to pick up newer releases.
PYTHON ?= python3
VENV ?= .venv
VENV_LATEST ?= .venv-latest
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: venv venv-latest test test-fast test-pinned test-latest lint demo clean-outputs

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,convert]'
	touch $@

$(VENV_LATEST)/.installed: pyproject.toml constraints-latest.txt
	$(PYTHON) -m venv $(VENV_LATEST)
	$(VENV_LATEST)/bin/python -m pip install -q --upgrade pip
	$(VENV_LATEST)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(VENV_LATEST)/bin/python -m pip install -q -c constraints-latest.txt -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

venv-latest: $(VENV_LATEST)/.installed

lint: venv
	$(BIN)/ruff check src tests tools
	$(BIN)/ruff format --check src tests tools
	$(BIN)/lint-imports

test-pinned: venv
	@echo "== tests on the pinned stack ($(VENV), constraints.txt)"
	$(BIN)/python -m pytest -q -ra

test-latest: venv-latest
	@echo "== tests on the newest releases ($(VENV_LATEST), constraints-latest.txt)"
	$(VENV_LATEST)/bin/python -m pytest -q -ra -p no:cacheprovider

test: lint test-pinned test-latest

# The edit-and-rerun loop: the pinned stack without the tests that start a tritonserver or take long (`server`,
# `slow` markers); `make test` still runs everything on both stacks.
test-fast: venv
	@echo "== fast tests on the pinned stack ($(VENV)): no tritonserver, nothing marked slow"
	$(BIN)/python -m pytest -q -ra -m "not server and not slow"

demo: venv
	PATH="$(abspath $(BIN)):$$PATH" bash tools/demo.sh

clean-outputs:
	rm -rf engines/demo triton_repo/demo
