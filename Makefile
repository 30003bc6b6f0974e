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
LATEST_PYTEST = $(VENV_LATEST)/bin/python -m pytest -q -ra -p no:cacheprovider -m "not one_stack"
ONE_STACK_PYTEST = $(BIN)/python -m pytest -q -ra -p no:cacheprovider
LATEST_BANNER = tests on the newest releases ($(VENV_LATEST), constraints-latest.txt), one_stack tests left to the pinned stack

.PHONY: venv venv-latest real-model test test-fast test-pinned test-pinned-both test-one-stack test-latest test-latest-logged test-one-stack-first test-one-stack-rest test-timed lint demo clean-outputs

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
	$(VENV_LATEST)/bin/python -m pip install -q -c constraints-latest.txt -e '.[dev,real-model]'
	touch $@

venv: $(VENV)/.installed

venv-latest: $(VENV_LATEST)/.installed

lint: venv
	$(BIN)/ruff check src tests tools
	$(BIN)/ruff format --check src tests tools
	$(BIN)/lint-imports

# SmolLM2-135M-Instruct, a published chat model, and a draft cut from it, as Hugging Face folders in .cache/real-model/
# (tools/fetch_real_model.py; a second run does nothing). Converting its GGUF needs transformers 5, hence
# .venv-latest; the folders then load on both stacks, and the tests of both use them (tests/test_real_model.py).
real-model: venv-latest
	$(VENV_LATEST)/bin/python tools/fetch_real_model.py

test-pinned: venv real-model
	@echo "== tests on the pinned stack ($(VENV), constraints.txt)"
	$(BIN)/python -m pytest -q -ra

# The newest releases run every test whose subject can change with them; `one_stack` tests (serving's process
# handling, packaging, manifests, the bench tools, served paths that tests on both stacks cover) run on the
# pinned stack only, which keeps `make test` inside CI's 30 minutes.
test-latest: venv-latest real-model
	@echo "== $(LATEST_BANNER)"
	$(LATEST_PYTEST)

# `make test` keeps CI inside 30 minutes on 2 cores: the two stacks install side by side; then four test runs
# share the cores (one torch thread each: most of a test's time is one process at a time, a tritonserver starting
# or a model loading): each stack's tests, and the pinned stack's `one_stack` tests in two halves; last, alone,
# the `timed` ones (the soak, whose speed check compares its two halves).
test:
	$(MAKE) -j2 venv real-model
	$(MAKE) lint
	OMP_NUM_THREADS=1 $(MAKE) -j4 test-pinned-both test-latest-logged test-one-stack-first test-one-stack-rest
	$(MAKE) test-timed

# $(call held,LOG,TITLE,COMMAND): COMMAND's output held in LOG until it ends, then printed under TITLE, so that
# the pinned stack's progress beside it reads whole.
held = @echo "== $(2): its output follows when it ends ($(1))"; \
	$(3) > $(1) 2>&1; status=$$?; echo "== $(2)"; cat $(1); exit $$status

test-latest-logged: venv-latest real-model
	$(call held,$(VENV_LATEST)/pytest.log,$(LATEST_BANNER),$(LATEST_PYTEST))

# The one_stack tests that time nothing, in two runs of about equal length: ONE_STACK_FIRST's files, then the rest.
ONE_STACK_FIRST = tests/test_faults_serving.py tests/test_serve_cli.py tests/test_triton_harness.py \
	tests/test_real_model.py tests/test_outputs.py
ONE_STACK_TITLE = one_stack tests that time nothing, on the pinned stack ($(VENV), constraints.txt)

test-one-stack-first: venv real-model
	$(call held,$(VENV)/pytest-one-stack-first.log,$(ONE_STACK_TITLE): first half,\
	  $(ONE_STACK_PYTEST) -m "one_stack and not timed" $(ONE_STACK_FIRST))

test-one-stack-rest: venv real-model
	$(call held,$(VENV)/pytest-one-stack-rest.log,$(ONE_STACK_TITLE): second half,\
	  $(ONE_STACK_PYTEST) -m "one_stack and not timed" $(addprefix --ignore=,$(ONE_STACK_FIRST)))

test-pinned-both: venv real-model
	@echo "== tests on the pinned stack ($(VENV), constraints.txt) that the newest releases run too"
	$(BIN)/python -m pytest -q -ra -m "not one_stack"

test-one-stack: venv real-model
	@echo "== one_stack tests on the pinned stack ($(VENV), constraints.txt)"
	$(ONE_STACK_PYTEST) -m one_stack

test-timed: venv real-model
	@echo "== timed one_stack tests, alone, on the pinned stack ($(VENV), constraints.txt)"
	$(ONE_STACK_PYTEST) -m "one_stack and timed"

# The edit-and-rerun loop: the pinned stack without the tests that start a tritonserver or take long (`server`,
# `slow` markers); `make test` still runs everything (the one_stack tests on the pinned stack only).
test-fast: venv
	@echo "== fast tests on the pinned stack ($(VENV)): no tritonserver, nothing marked slow"
	$(BIN)/python -m pytest -q -ra -m "not server and not slow"

demo: venv
	PATH="$(abspath $(BIN)):$$PATH" bash tools/demo.sh

clean-outputs:
	rm -rf engines/demo triton_repo/demo
