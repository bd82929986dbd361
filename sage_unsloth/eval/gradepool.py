"""Grading many completions: answers extracted once, identical (answer, gold) pairs judged once, the
math-verify work spread over worker processes (each worker's main thread owns the CPU deadline).

A verdict depends on (gold, completion) alone: the same in-process, in a pool of any size, warm or cold,
on an idle or a saturated machine (``tests/test_grading_determinism.py``). What could make it depend on
more is handled at its cause: every worker warms up all parser paths before its first pair; the budget is
CPU time of the grading thread, not wall time; a pair that runs out of budget is ``timeout``, never
``wrong``, and ``retry_timeouts`` grades it again, one at a time, with ``RETRY_TIMEOUT_S``.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
from collections.abc import Sequence

from sage_unsloth import grading
from sage_unsloth.grading import Grade

INLINE_THRESHOLD = 48  # fewer unique pairs than this: not worth a round trip to the pool
# Workers run this much nicer than the process that starts them: on a CPU machine the engine's threads sample on
# the same cores, and a grading worker that takes a core from them stalls all of them at their next barrier
# (benchmarks/bench_eval_pipeline.py). Verdicts do not move: the budget is the worker's own CPU time.
WORKER_NICE = 10


def _start_worker(nice: int) -> None:
    if nice:
        os.nice(nice)
    grading.warm_up()


def _judge_many(pairs: list[tuple[str, str]], timeout_s: float) -> list[str]:
    return [grading.judge(a, g, timeout_s=timeout_s) for a, g in pairs]


class GradingPool:
    """A lazily started process pool; ``submit`` returns a future of one ``Grade`` per completion."""

    def __init__(
        self,
        workers: int | None = None,
        timeout_s: float = grading.DEFAULT_TIMEOUT_S,
        chunk: int = 64,
        inline_threshold: int = INLINE_THRESHOLD,
        nice: int | None = None,
    ):
        self.workers = max(1, workers or (os.cpu_count() or 1))
        self.nice = WORKER_NICE if nice is None else nice
        self.timeout_s = timeout_s
        self.chunk = chunk
        self.inline_threshold = inline_threshold
        self._pool: cf.ProcessPoolExecutor | None = None
        self.stats = {"completions": 0, "unique_pairs": 0, "verified": 0, "timeouts": 0}

    def _executor(self) -> cf.ProcessPoolExecutor:
        if self._pool is None:
            # forkserver: workers never inherit a vLLM engine's threads or sockets.
            self._pool = cf.ProcessPoolExecutor(
                self.workers,
                mp_context=mp.get_context("forkserver"),
                initializer=_start_worker,
                initargs=(self.nice,),
            )
        return self._pool

    def grade(self, items: Sequence[tuple[str, object]]) -> list[Grade]:
        return self.submit(items).result()

    def submit(self, items: Sequence[tuple[str, object]]) -> cf.Future:
        """``items``: (completion, gold), gold a math answer or a (solution_booleans, names) K&K pair."""
        slots: list[Grade | tuple[str, str]] = []
        pending: dict[tuple[str, str], None] = {}
        known: dict[tuple[str, str], str] = {}
        for completion, gold in items:
            if grading.is_kk_gold(gold):  # Knights-and-Knaves: a bounded regex reading, done here
                slots.append(grading.grade(completion, gold))
                continue
            answer, gold_text = grading.extract_answer(completion), grading.normalise_gold(gold)
            key = (answer, gold_text)
            slots.append(key)
            if key in known or key in pending:
                continue
            if answer is None or not answer.strip():
                known[key] = grading.NO_ANSWER
            else:
                pending[key] = None
        self.stats["completions"] += len(items)
        self.stats["unique_pairs"] += len(known) + len(pending)
        self.stats["verified"] += len(pending)
        todo = list(pending)

        def resolve(statuses: list[str]) -> list[Grade]:
            known.update(zip(todo, statuses))
            self.stats["timeouts"] += sum(s == grading.TIMEOUT for s in statuses)
            return [s if isinstance(s, Grade) else Grade(s[0], known[s]) for s in slots]

        if len(todo) < self.inline_threshold:
            done: cf.Future = cf.Future()
            done.set_result(resolve(_judge_many(todo, self.timeout_s)))
            return done
        chunks = [todo[i : i + self.chunk] for i in range(0, len(todo), self.chunk)]
        parts = [self._executor().submit(_judge_many, c, self.timeout_s) for c in chunks]
        result: cf.Future = cf.Future()

        def gather(_):
            if all(p.done() for p in parts) and not result.done():
                try:
                    result.set_result(resolve([v for p in parts for v in p.result()]))
                except Exception as exc:  # noqa: BLE001 - surfaces in .result()
                    result.set_exception(exc)

        for part in parts:
            part.add_done_callback(gather)
        return result

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def retry_timeouts(
    items: Sequence[tuple[str, object]], grades: Sequence[Grade], timeout_s: float = grading.RETRY_TIMEOUT_S
) -> tuple[list[Grade], int]:
    """Grades with every ``timeout`` graded again, one at a time in this process, under ``timeout_s``.
    Returns (grades, how many were retried); what is still ``timeout`` is unresolved."""
    out, cache, retried = list(grades), {}, 0
    for i, g in enumerate(grades):
        if g.status != grading.TIMEOUT:
            continue
        gold = items[i][1]
        key = (g.answer, grading.normalise_gold(gold))
        if key not in cache:
            cache[key] = grading.judge(g.answer, gold, timeout_s=timeout_s)
            retried += 1
        out[i] = Grade(g.answer, cache[key])
    return out, retried
