# Two entry points (see README): `make serve` and `make test`. Each installs what it needs:
# serving needs reposerve with its backends; the test toolchain (perf_analyzer, Model
# Analyzer's environment, the deployment checks' tools) comes with `make test` only.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SERVING := $(VENV)/.serving
STAMP := $(VENV)/.installed

.PHONY: install serve test lint bench image

$(SERVING): pyproject.toml
	@echo "installing reposerve with onnxruntime and torch into $(VENV): the first start only, about 2 minutes (exporting the ResNet-50 examples included)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[onnx,torch,gpu]'
	touch $(SERVING)

$(STAMP): $(SERVING) pyproject.toml tools/install_perf_analyzer.sh tools/install_model_analyzer.sh tools/install_deploy_tools.sh tools/install_azurite.sh
	$(BIN)/python -m pip install -q -e '.[test,onnx,torch,gpu,tune,ray]'
	bash tools/install_perf_analyzer.sh $(VENV)
	bash tools/install_model_analyzer.sh $(PYTHON) .venv-analyzer
	bash tools/install_deploy_tools.sh .tools/deploy
	bash tools/install_azurite.sh .tools/azurite
	touch $(STAMP)

install: $(STAMP)

serve: $(SERVING)
	$(BIN)/python tools/export_examples.py --repository model_repository
	$(BIN)/reposerve --model-repository model_repository

test: $(STAMP)
	$(BIN)/ruff check reposerve tests tools
	$(BIN)/mypy
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check reposerve tests tools
	$(BIN)/mypy
	$(BIN)/ruff format --check reposerve tests tools

# Benchmarks with their baselines in the same run; results in bench-out/.
bench: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	mkdir -p bench-out
	$(BIN)/python -m tools.bench all --plot bench-out/bench.png --json bench-out/bench.json | tee bench-out/bench.txt

# The container image (docs/image.md): docker, podman or buildah, whichever is found (or
# ENGINE=...); BASE=... for another base (a CUDA one); a rerun with unchanged inputs keeps
# the image. EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu: CPU torch, 3 GB smaller.
image:
	$(PYTHON) -m tools.image $(if $(ENGINE),--engine $(ENGINE)) $(if $(BASE),--base $(BASE)) \
		$(if $(EXTRA_INDEX_URL),--extra-index-url $(EXTRA_INDEX_URL))
