"""``sage-unsloth sample CHECKPOINT (--prompts FILE | --benchmark NAME) -n N``: read what a checkpoint writes.

A few completions per prompt, each with what the grader read and its verdict, printed (``--out FILE.jsonl``
also keeps them as stage 3's records). It is stage 3 on a handful of problems with nothing written to the
results: the same checkpoints (a stage output folder, a model folder or a hub id), the same chat template and
per-problem seeds, the same samplers (``--backend auto|hf|vllm``, as stage 3 chooses) and the same grader. The
sampling settings (the user turn's wording included) are stage 3's defaults, a stage-3 config's (``--config
configs/eval/tiny-cpu.yaml``) or flags; a config's ``benchmarks`` are not read (``--benchmark`` or ``--prompts``
says what to sample).

``--prompts FILE``: JSON lines with ``problem`` (or ``prompt`` / ``question``) and, to grade it, ``answer``; or a
text file, one prompt a line (not graded). ``--benchmark NAME --local_benchmarks NAME=FILE`` samples a file of
your own as stage 3 does.

A checkpoint of the demo lab is read with the demo's own wording and lengths (its stage-3 config) on its held-out
problems::

    sage-unsloth sample outputs/demo/demo-tiny/sft --config configs/demo/eval.yaml \
        --prompts outputs/demo/data/demo.jsonl -n 4
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

logger = logging.getLogger(__name__)
PROMPT_KEYS = ("problem", "prompt", "question")
UNGRADED = "not graded"  # the status of a completion of a prompt without an answer


def read_prompts(path: str | Path):
    """The problems of a prompts file (dataset ``prompts``, ids in file order); ValueError names a bad line."""
    from sage_unsloth.config.input_checks import check_data_file
    from sage_unsloth.eval.benchmarks import Problem
    from sage_unsloth.grading import normalise_gold

    path = Path(path)
    problems = []
    if path.suffix.lower() in (".jsonl", ".json"):
        check_data_file(path, "--prompts")  # unreadable, empty, a line that is not a JSON object: one line
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            row = json.loads(line)
            text = next((row[k] for k in PROMPT_KEYS if row.get(k) is not None), None)
            if text is None:
                raise ValueError(
                    f"--prompts {path} line {number} has no {' / '.join(PROMPT_KEYS)} field: add one"
                )
            answer = row.get("answer")
            gold = "" if answer is None else normalise_gold(answer)
            problems.append(Problem("prompts", str(len(problems)), str(text), gold=gold))
    else:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--prompts {path} cannot be read as text ({exc}): fix the path") from None
        problems = [Problem("prompts", str(i), line) for i, line in enumerate(x for x in lines if x.strip())]
    if not problems:
        raise ValueError(f"--prompts {path} holds no prompt")
    return problems


def eval_argv(args) -> list[str]:
    """The stage-3 command line these flags stand for (its parser and its checks build the config)."""
    from sage_unsloth.eval.benchmarks import BENCHMARKS

    argv = [args.config] if args.config else []
    argv += ["--checkpoints", args.checkpoint, "--n", str(args.n)]
    if args.local_benchmarks:
        argv += ["--local_benchmarks", *args.local_benchmarks]
    # The config's benchmarks are never sampled here (the demo's names one only its runner registers): the one
    # to sample, or with --prompts a built-in that is never read.
    argv += ["--benchmarks", args.benchmark or next(iter(BENCHMARKS))]
    for name in ("limit", "max_tokens", "temperature", "top_p", "seed", "backend", "dtype"):
        if getattr(args, name) is not None:
            argv += [f"--{name}", str(getattr(args, name))]
    return argv


def sample(args) -> list[dict]:
    """Sample and grade; returns stage 3's records (one per problem, its completions graded)."""
    from sage_unsloth import grading
    from sage_unsloth.eval.backend_choice import resolve_backend
    from sage_unsloth.eval.config import parse_args as parse_eval_args
    from sage_unsloth.eval.gradepool import GradingPool
    from sage_unsloth.eval.records import build_records
    from sage_unsloth.eval.run import check_backend, grading_pairs, prepare
    from sage_unsloth.eval.sampling import (
        load_tokenizer,
        make_sampler,
        problem_seed,
        prompt_token_limit,
        render_prompts,
    )

    cfg = parse_eval_args(eval_argv(args))
    if args.prompts:
        from sage_unsloth.eval.sampling import resolve_checkpoint

        problems = read_prompts(args.prompts)[: args.limit or None]
        checkpoint = resolve_checkpoint(args.checkpoint)
    else:
        _, (checkpoint,), problem_sets = prepare(cfg)
        (problems,) = problem_sets.values()
    cfg, choice = resolve_backend(cfg, checkpoint, {"sample": problems})
    check_backend(cfg)
    print(choice.line(), file=sys.stderr, flush=True)
    tokenizer = load_tokenizer(checkpoint, cfg.trust_remote_code)
    seeds = [problem_seed(cfg.seed, p.dataset, p.problem_id) for p in problems]
    prompts = render_prompts(
        tokenizer, problems, cfg.user_template, prompt_token_limit(cfg)
    )  # before loading
    samples = make_sampler(checkpoint, cfg).generate(prompts, seeds)
    graded = [i for i, p in enumerate(problems) if p.is_kk or p.gold]
    pool = GradingPool(cfg.grading_workers, timeout_s=cfg.grading_timeout_s)
    try:
        verdicts = iter(
            pool.grade(grading_pairs([problems[i] for i in graded], [samples[i] for i in graded]))
        )
    finally:
        pool.close()
    grades = [  # stage 3's verdicts; a prompt without an answer shows what the grader would read
        next(verdicts) if i in graded else grading.Grade(grading.extract_answer(s.text), UNGRADED)
        for i, group in enumerate(samples)
        for s in group
    ]
    return build_records(problems, seeds, samples, grades, grading.grader_fingerprint())


def render(records: list[dict]) -> str:
    """Each problem, its gold and how many completions are correct, then every completion with its verdict."""
    lines = []
    for record in records:
        gold = record["gold"]
        head = f"== {record['dataset']}/{record['problem_id']}"
        if gold not in ("", None):
            head += f"  gold: {gold}  correct: {record['c']}/{record['n']}"
        lines.append(head)
        for index, completion in enumerate(record["completions"]):
            verdict = f"{completion['status']}, answer {completion['answer']!r}"
            lines.append(f"-- sample {index} ({completion['tokens']} tokens; {verdict})")
            lines.append(completion["text"].rstrip())
        lines.append("")
    return "\n".join(lines)


def parse_args(argv: list[str] | None):
    from sage_unsloth.config.args import KitArgumentParser

    parser = KitArgumentParser(prog="sage-unsloth sample", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a stage output folder, a model folder or a hub id")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompts", help="JSON lines with problem [, answer], or a text file (one a line)")
    source.add_argument("--benchmark", help="a stage-3 benchmark (aime24, math500, kk, ...)")
    parser.add_argument("-n", "--n", type=int, default=4, help="completions per prompt (default 4)")
    parser.add_argument("--limit", type=int, default=3, help="prompts to sample (default 3; 0 = all)")
    parser.add_argument("--config", help="a stage-3 config whose sampling settings to use")
    parser.add_argument(
        "--local_benchmarks",
        "--local-benchmarks",
        nargs="+",
        metavar="NAME=FILE",
        help="benchmarks of your own, as stage 3's (name=path.jsonl), to sample with --benchmark NAME",
    )
    parser.add_argument("--max_tokens", "--max-tokens", type=int, help="new tokens per completion")
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--top_p", "--top-p", type=float)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--backend", choices=("auto", "hf", "vllm"))
    parser.add_argument("--dtype", choices=("auto", "bfloat16", "float16", "float32"))
    parser.add_argument("--out", help="also write the graded records here (JSON lines)")
    args = parser.parse_args(argv)
    if args.limit == 0:
        args.limit = None
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    from sage_unsloth.config.schema import check_stage_input

    problems = check_stage_input("eval", eval_argv(args))  # the sampling settings' values, before the imports
    if problems:
        for line in problems:
            print(f"error: {line}", file=sys.stderr)
        return 2
    try:
        records = sample(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(render(records))
    if args.out:
        from sage_unsloth.runtime.manifest import atomic_write_text

        atomic_write_text(args.out, "".join(json.dumps(r) + "\n" for r in records))
        print(f"records written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
