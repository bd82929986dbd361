"""Grading many completions: answers extracted once, identical (answer, gold) pairs verified once, the
math-verify calls spread over worker processes (each worker's main thread owns the SIGALRM deadline)."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
from collections.abc import Sequence

from sage_unsloth.grading import (
    DEFAULT_TIMEOUT_S,
    _warm_up,
    extract_answer,
    grade_kk,
    normalise_gold,
    verify_answer,
)

INLINE_THRESHOLD = 48  # fewer unique pairs than this: not worth a round trip to the pool


def _verify_many(pairs: list[tuple[str, str]], timeout_s: float) -> list[bool]:
    return [verify_answer(a, g, timeout_s=timeout_s) for a, g in pairs]


class GradingPool:
    """A lazily started process pool; ``submit`` returns a future of per-completion booleans."""

    def __init__(self, workers: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, chunk: int = 64):
        self.workers = max(1, workers or (os.cpu_count() or 1))
        self.timeout_s = timeout_s
        self.chunk = chunk
        self._pool: cf.ProcessPoolExecutor | None = None
        self.stats = {"completions": 0, "unique_pairs": 0, "verified": 0}

    def _executor(self) -> cf.ProcessPoolExecutor:
        if self._pool is None:
            # forkserver: workers never inherit a vLLM engine's threads or sockets.
            self._pool = cf.ProcessPoolExecutor(self.workers, mp_context=mp.get_context("forkserver"),
                                                initializer=_warm_up)
        return self._pool

    def grade(self, items: Sequence[tuple[str, object]]) -> list[bool]:
        return self.submit(items).result()

    def submit(self, items: Sequence[tuple[str, object]]) -> cf.Future:
        """``items``: (completion, gold) with gold a math answer, or a (solution_booleans, names) K&K pair."""
        keys: list[object] = []
        pending: dict[tuple[str, str], None] = {}
        known: dict[object, bool] = {}
        for completion, gold in items:
            if isinstance(gold, tuple):  # Knights-and-Knaves: a cheap regex check, done here
                keys.append(grade_kk(completion, gold[0], gold[1]))
                continue
            answer, gold_text = extract_answer(completion), normalise_gold(gold)
            key = (answer, gold_text)
            keys.append(key)
            if key in known or key in pending:
                continue
            if answer is None or not answer.strip():
                known[key] = False
            elif answer == gold_text:
                known[key] = True
            else:
                pending[key] = None
        self.stats["completions"] += len(items)
        self.stats["unique_pairs"] += len(known) + len(pending)
        self.stats["verified"] += len(pending)
        todo = list(pending)

        def resolve(verdicts: list[bool]) -> list[bool]:
            known.update(zip(todo, verdicts))
            return [k if isinstance(k, bool) else known[k] for k in keys]

        if len(todo) < INLINE_THRESHOLD:
            done: cf.Future = cf.Future()
            done.set_result(resolve(_verify_many(todo, self.timeout_s)))
            return done
        chunks = [todo[i:i + self.chunk] for i in range(0, len(todo), self.chunk)]
        parts = [self._executor().submit(_verify_many, c, self.timeout_s) for c in chunks]
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
