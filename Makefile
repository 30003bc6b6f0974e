# Set-up and the two README commands. Everything is created from nothing in .venv.
# TORCH_SPEC: on the project's CPU machines `torch==2.13.0` resolves to a local CPU wheel; elsewhere pass
# e.g. TORCH_SPEC='torch==2.9.1' or TORCH_SPEC=torch (an already-installed torch in range is kept).
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: venv test lint demo clean-outputs

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

lint: venv
	$(BIN)/ruff check src tests tools
	$(BIN)/ruff format --check src tests tools

test: lint
	$(BIN)/python -m pytest -q -ra

demo: venv
	PATH="$(abspath $(BIN)):$$PATH" bash tools/demo.sh

clean-outputs:
	rm -rf engines/demo triton_repo/demo
