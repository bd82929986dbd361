"""``sage-unsloth export CHECKPOINT --out DIR``: a stage's LoRA adapter merged into its base model, a plain
transformers folder that vLLM, TGI or ``from_pretrained`` load without PEFT; optionally GGUF files (llama.cpp,
Ollama) and a push to the Hugging Face hub with the stage's manifest as the model card.

CHECKPOINT is a stage-1 or stage-2 output folder (its manifest names the base model). Two ways to merge:

- ``--backend trl`` (the default without a GPU): the base model reloaded unquantised in ``--dtype`` and PEFT's
  ``merge_and_unload``, on CPU or GPU (the merge SFT's ``save_merged`` does too:
  :func:`sage_unsloth.model.loading.merge_lora_into_base`);
- ``--backend unsloth`` (the default on a GPU with Unsloth): Unsloth's ``save_pretrained_merged`` (16-bit), which
  dequantises a 4-bit base first, and ``--gguf QUANT`` its ``save_pretrained_gguf`` (GPU only; not run by the
  kit's CPU tests).

``--push_to_hub ORG/NAME`` uploads the folder. The token is the Hugging Face client's own (``hf auth login`` or
``HF_TOKEN``): the command takes none, and no file it writes holds one (the manifest is scrubbed of credential
keys and values before it becomes the card).

No non-finite weight leaves the kit: the adapter is checked before any model loads and the merged weights before
the folder gets its name, as resume checks a checkpoint (``checkpoint_contents.weights_problem``); either is
one line, and nothing is written. The card and the manifest copy name the base model by its hub id (read from
a Hugging Face cache path, ``.../models--ORG--NAME/snapshots/...``) and hold no absolute local path.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

DTYPES = ("auto", "bfloat16", "float16", "float32")
GGUF_QUANTS = ("q4_k_m", "q5_k_m", "q8_0", "f16")  # Unsloth's common save_pretrained_gguf methods
CARD = "README.md"
MANIFEST_COPY = "sage_manifest.json"


@dataclass(frozen=True)
class ExportPlan:
    checkpoint: str
    base_model: str
    adapter_dir: str
    tokenizer_dir: str
    stage: str
    manifest: dict
    out: Path
    backend: str


def plan_export(checkpoint: str, out: str, backend: str) -> ExportPlan:
    """Resolve and check everything before any model loads: one-line errors."""
    from sage_unsloth.config.input_checks import check_adapter, check_output_folder
    from sage_unsloth.eval.sampling import resolve_checkpoint
    from sage_unsloth.runtime.manifest import read_manifest

    resolved = resolve_checkpoint(checkpoint)
    if resolved.adapter_dir is None:
        raise ValueError(
            f"checkpoint {checkpoint}: not a stage output with a LoRA adapter (nothing to merge): pass "
            "outputs/<model>/sft or outputs/<model>/<method>"
        )
    check_adapter(resolved.adapter_dir, "checkpoint")
    _refuse_non_finite_adapter(checkpoint, Path(resolved.adapter_dir))
    target = Path(out)
    if target.exists() and any(target.iterdir()):
        raise FileExistsError(f"--out {out} is not empty: choose a new folder (nothing is overwritten)")
    check_output_folder(target, "--out")
    manifest = read_manifest(resolved.tokenizer_dir)
    return ExportPlan(
        checkpoint=checkpoint,
        base_model=resolved.base_model,
        adapter_dir=resolved.adapter_dir,
        tokenizer_dir=resolved.tokenizer_dir,
        stage=str(manifest.get("stage")),
        manifest=manifest,
        out=target,
        backend=backend,
    )


def _refuse_non_finite_adapter(checkpoint: str, adapter_dir: Path) -> None:
    from sage_unsloth.runtime.checkpoint_contents import ADAPTER_FILE, stored_weights_problem

    if (adapter_dir / ADAPTER_FILE).is_file() and (
        problem := stored_weights_problem(adapter_dir / ADAPTER_FILE)
    ):
        raise ValueError(
            f"checkpoint {checkpoint}: {problem}; nothing was exported: export an earlier checkpoint of the run "
            "(its checkpoint-N folder) or retrain"
        )


def merged_weights_problem(folder: Path, dtype: str) -> str | None:
    """Why the merged model written in ``folder`` cannot leave the kit (a non-finite weight), or None."""
    from sage_unsloth.runtime.checkpoint_contents import stored_weights_problem

    for shard in sorted(folder.glob("*.safetensors")):
        if problem := stored_weights_problem(shard, f"the merged model ({shard.name})"):
            fix = "export with --dtype float32" if dtype != "float32" else "check the base model's weights"
            return f"{problem}: the base model or the merge overflows in --dtype {dtype}; {fix}"
    return None


def choose_backend(requested: str, gguf: str | None) -> str:
    """``auto``: Unsloth on a GPU where it is installed, else TRL/PEFT. GGUF needs Unsloth, which needs a GPU."""
    from sage_unsloth.runtime.backend import cuda_available

    if requested == "auto":
        import importlib.util

        requested = "unsloth" if cuda_available() and importlib.util.find_spec("unsloth") else "trl"
    if gguf and requested != "unsloth":
        raise ValueError(
            f"--gguf {gguf} writes through Unsloth's save_pretrained_gguf, which needs a GPU (and --backend "
            "unsloth): run it on a GPU machine, or export without --gguf"
        )
    if requested == "unsloth" and not cuda_available():
        raise ValueError("--backend unsloth needs a GPU: pass --backend trl (PEFT's merge, on CPU)")
    return requested


def model_card(plan: ExportPlan, *, repo_id: str | None, gguf: str | None) -> str:
    """The README.md of the export: hub metadata, what it is, and the stage's manifest (credentials scrubbed)."""
    import yaml

    from sage_unsloth import __version__
    from sage_unsloth.runtime.manifest import scrub_secrets

    hub_id = hub_id_of(plan.base_model)
    manifest = portable_manifest(scrub_secrets(plan.manifest), hub_id)
    method = manifest.get("variant") or plan.stage
    meta = {
        "base_model": hub_id,
        "library_name": "transformers",
        "tags": ["sage-unsloth", "trl", "grpo" if plan.stage == "rlvr" else "sft", "lora-merged"],
    }
    front = yaml.safe_dump({k: v for k, v in meta.items() if v is not None}, sort_keys=False).strip()
    what = "RLVR" if plan.stage == "rlvr" else "SFT"
    base = f"`{hub_id}`" if hub_id else f"a local model (`{Path(plan.base_model).name}`)"
    intro = (
        f"The {what} stage `{method}` of sage-unsloth (SAGE, arXiv 2605.18864) on {base}, "
        f"its LoRA adapter merged into the base model (sage-unsloth {__version__}, backend {plan.backend})."
        + (f" GGUF ({gguf}) files are in this repository too." if gguf else "")
    )
    template = (
        "Prompts use the kit's chat template (saved with the tokenizer): the answer comes inside "
        "`<SOLUTION>...</SOLUTION>`."
    )
    manifest_json = json.dumps(manifest, indent=2, sort_keys=True, default=str)
    lines = ["---", front, "---", "", f"# {repo_id or plan.out.name}", "", intro, "", template, ""]
    lines += ["## The stage's manifest", "", "```json", manifest_json, "```", ""]
    return "\n".join(lines)


_CACHE_FOLDER = re.compile(r"^models--([^/]+?)--(.+)$")
# An absolute local path in a manifest's strings (a URL's "//" and a relative path are left alone).
_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/~-])(?:~|[A-Za-z]:)?[/\\](?:[^\s\"'/\\]+[/\\])*([^\s\"'/\\,;]+)")


def hub_id_of(base_model: str) -> str | None:
    """The hub id of a base model: itself when it is one, the repository of a Hugging Face cache path
    (``.../models--Qwen--Qwen2.5-1.5B/snapshots/<sha>``), else None (a model only on this machine)."""
    from sage_unsloth.config.args import HUB_ID

    path = Path(base_model).expanduser()
    if not path.exists():
        return base_model if HUB_ID.match(base_model) else None
    for part in reversed(path.resolve().parts):
        if match := _CACHE_FOLDER.match(part):
            repo_id = f"{match.group(1)}/{match.group(2)}"
            return repo_id if HUB_ID.match(repo_id) else None
    return None


def portable_manifest(value, hub_id: str | None):
    """``value`` (a manifest) without absolute local paths: the base model by its hub id where known, any other
    path as ``<local>/<its last name>``."""
    if isinstance(value, dict):
        portable = {k: portable_manifest(v, hub_id) for k, v in value.items()}
        if hub_id and "base_model" in portable:
            portable["base_model"] = hub_id
        return portable
    if isinstance(value, list | tuple):
        return [portable_manifest(v, hub_id) for v in value]
    if isinstance(value, str):
        return _ABSOLUTE_PATH.sub(lambda m: f"<local>/{m.group(1)}", value)
    return value


def export(
    plan: ExportPlan, *, dtype: str, gguf: str | None, trust_remote_code: bool, repo_id: str | None = None
) -> Path:
    """Merge (and GGUF) into a temporary folder beside ``plan.out``, add the card and the manifest, then rename: a
    crash leaves no half export under the name."""
    from sage_unsloth.runtime.manifest import atomic_write_text, scrub_secrets

    work = plan.out.with_name(f".{plan.out.name}.exporting")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if plan.backend == "unsloth":
        _export_with_unsloth(plan, work, dtype=dtype, gguf=gguf)
    else:
        from transformers import AutoTokenizer

        from sage_unsloth.model.loading import merge_lora_into_base

        tokenizer = AutoTokenizer.from_pretrained(plan.tokenizer_dir, trust_remote_code=trust_remote_code)
        merge_lora_into_base(
            plan.base_model,
            plan.adapter_dir,
            work,
            tokenizer=tokenizer,
            dtype=dtype,
            trust_remote_code=trust_remote_code,
        )
    if problem := merged_weights_problem(work, dtype):
        shutil.rmtree(work, ignore_errors=True)
        raise ValueError(f"{problem}; nothing was written to {plan.out}")
    manifest = portable_manifest(scrub_secrets(plan.manifest), hub_id_of(plan.base_model))
    atomic_write_text(work / MANIFEST_COPY, json.dumps(manifest, indent=2, default=str) + "\n")
    atomic_write_text(work / CARD, model_card(plan, repo_id=repo_id, gguf=gguf))
    if plan.out.exists():
        plan.out.rmdir()  # empty (plan_export refused a non-empty one)
    work.rename(plan.out)
    return plan.out


def _export_with_unsloth(plan: ExportPlan, work: Path, *, dtype: str, gguf: str | None) -> None:
    """Unsloth's merged 16-bit save and GGUF (GPU only: not run by the CPU tests)."""
    from sage_unsloth.runtime.backend import import_unsloth

    import_unsloth()
    from unsloth import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=str(plan.tokenizer_dir),  # the stage folder: its adapter and the kit's tokenizer
        dtype=None if dtype == "auto" else dtype,
        load_in_4bit=False,
    )
    model.save_pretrained_merged(str(work), tokenizer, save_method="merged_16bit")
    if gguf:
        model.save_pretrained_gguf(str(work), tokenizer, quantization_method=gguf)


def check_hub_access(repo_id: str) -> None:
    """Before anything heavy: the hub is reachable from here and the client has a token (never one of ours)."""
    from sage_unsloth.config.args import HUB_ID

    if not HUB_ID.match(repo_id):
        raise ValueError(f"--push_to_hub {repo_id!r}: give a hub repository id, org/name")
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        raise ValueError("--push_to_hub: HF_HUB_OFFLINE is set: unset it to push (or export without pushing)")
    from huggingface_hub import get_token

    if not get_token():
        raise ValueError(
            "--push_to_hub needs a Hugging Face token: run `hf auth login` or set HF_TOKEN (the command takes "
            "no token, so none can land in a file)"
        )


def push(folder: Path, repo_id: str, *, private: bool) -> str:
    """Create (or reuse) the model repository and upload ``folder``; returns its address."""
    from huggingface_hub import HfApi

    api = HfApi()  # the client's own token: HF_TOKEN or `hf auth login`
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    api.upload_folder(
        folder_path=str(folder), repo_id=repo_id, repo_type="model", commit_message="sage-unsloth export"
    )
    return f"https://huggingface.co/{repo_id}"


def parse_args(argv: list[str] | None):
    from sage_unsloth.config.args import KitArgumentParser

    parser = KitArgumentParser(prog="sage-unsloth export", description=__doc__.splitlines()[0])
    parser.add_argument(
        "checkpoint", help="a stage output folder: outputs/<model>/sft or outputs/<model>/<method>"
    )
    parser.add_argument("--out", required=True, help="a new folder for the merged model")
    parser.add_argument("--backend", choices=("auto", "trl", "unsloth"), default="auto")
    parser.add_argument("--dtype", choices=DTYPES, default="auto", help="dtype of the merged weights")
    parser.add_argument("--gguf", choices=GGUF_QUANTS, help="also write GGUF files (Unsloth, GPU only)")
    parser.add_argument("--push_to_hub", "--push-to-hub", metavar="ORG/NAME", help="upload the folder there")
    parser.add_argument("--private", action="store_true", help="make a new hub repository private")
    parser.add_argument("--trust_remote_code", "--trust-remote-code", action="store_true")
    parser.add_argument("--dry-run", "--dry_run", action="store_true", help="print the plan, load nothing")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        backend = choose_backend(args.backend, args.gguf)
        plan = plan_export(args.checkpoint, args.out, backend)
        if args.push_to_hub:
            check_hub_access(args.push_to_hub)
        if args.dry_run:
            from sage_unsloth.config import dry_run

            would = {k: v for k, v in vars(plan).items() if k not in ("manifest", "checkpoint")}
            dry_run.show("export", vars(args), {**would, "dtype": args.dtype, "gguf": args.gguf})
            return 0
        out = export(
            plan,
            dtype=args.dtype,
            gguf=args.gguf,
            trust_remote_code=args.trust_remote_code,
            repo_id=args.push_to_hub,
        )
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"merged model written to {out}")
    if args.push_to_hub:
        print(f"pushed to {push(out, args.push_to_hub, private=args.private)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
