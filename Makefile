# Two entry points (see README): `make serve` and `make test`. Both install what they need.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install serve test lint bench

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	bash tools/install_perf_analyzer.sh $(VENV)
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/reposerve --model-repository model_repository

test: $(STAMP)
	$(BIN)/ruff check reposerve tests tools
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check reposerve tests tools
	$(BIN)/ruff format --check reposerve tests tools
