# One-command set-up on a fresh machine: `make test` and `make demo` create .venv when it is missing,
# install the kit with its CPU stack, then run. Re-running is quick: the install is stamped by the
# hash of pyproject.toml and this Makefile.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.sage-installed-$(shell cat pyproject.toml Makefile | sha1sum | cut -c1-12)
export UNSLOTH_SKIP_TORCHVISION_CHECK := 1
export HF_HUB_OFFLINE := 1
export WANDB_MODE ?= offline
export TOKENIZERS_PARALLELISM := false

# Unsloth's light runtime needs; its heavy GPU ones (xformers, triton, bitsandbytes, torchvision) are
# skipped on CPU because PyPI's builds break against the CPU torch wheel.
UNSLOTH_CPU_DEPS := tyro protobuf sentencepiece hf_transfer typer pydantic json5 nest-asyncio structlog \
	click msgspec pillow regex einops psutil wheel

.PHONY: install test demo lint clean
install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/pip install -q --no-deps unsloth==2026.10.9 unsloth_zoo==2026.10.9
	$(BIN)/pip install -q $(UNSLOTH_CPU_DEPS)
	rm -f $(VENV)/.sage-installed-*
	touch $(STAMP)

test: install
	$(BIN)/python -m pytest -q tests

lint: install
	$(BIN)/ruff check sage_unsloth tests

clean:
	rm -rf $(VENV) outputs .pytest_cache
