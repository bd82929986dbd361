"""Grading many completions: answers extracted once, identical (answer, gold) pairs judged once, the
math-verify work spread over worker processes (each worker's main thread owns the CPU deadline).

A verdict depends on (gold, completion) alone: the same in-process, in a pool of any size, warm or cold,
on an idle or a saturated machine (``tests/grading/test_grading_determinism.py``). What could make it depend on
more is handled at its cause: every worker warms up all parser paths before its first pair; the budget is
CPU time of the grading thread, not wall time; a pair that runs out of budget is ``timeout``, never
``wrong``, and ``retry_timeouts`` grades it again, one at a time, with ``RETRY_TIMEOUT_S``.

Nothing is awaited forever. A worker reports each verdict as it is reached; a worker that reports nothing
for longer than a pair's wall limit (``deadline.wall_limit_s`` of the budget, plus ``STUCK_SLACK_S``) is
stuck in code no signal reaches: it is killed, the pair it was on is ``timeout``, a fresh worker takes its
place and the rest of its chunk. Extraction runs here, under the same per-pair budget as in ``grade``,
once per distinct completion text.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing as mp
import os
import queue
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import wait

from sage_unsloth import grading
from sage_unsloth.grading import Grade, deadline

logger = logging.getLogger(__name__)

INLINE_THRESHOLD = 48  # fewer unique pairs than this: not worth a round trip to the pool
STUCK_SLACK_S = 30.0  # beyond a pair's own wall limit, before its worker counts as stuck
READY_TIMEOUT_S = 1800.0  # a worker's warm-up (imports, parser tables): minutes on a loaded machine
# Workers run this much nicer than the process that starts them: on a CPU machine the engine's threads sample on
# the same cores, and a grading worker that takes a core from them stalls all of them at their next barrier
# (benchmarks/bench_eval_pipeline.py). Verdicts do not move: the budget is the worker's own CPU time.
WORKER_NICE = 10


def _judge_many(pairs, timeout_s: float) -> list[str]:
    """Serial judgement of (answer, gold, spent) triples, the timers armed once for all of them."""
    with deadline.armed(timeout_s):
        return [grading.judge_rest(a, g, timeout_s, None, spent) for a, g, spent in pairs]


def _worker_main(conn, timeout_s: float, judge, warm: bool, nice: int = 0) -> None:
    """A worker: lower its priority, warm up, then judge each chunk it is sent, one message per verdict."""
    if nice:
        os.nice(nice)
    if warm:
        grading.warm_up()
    conn.send(("ready", None))
    with deadline.armed(timeout_s):
        while True:
            try:
                chunk = conn.recv()
            except EOFError:
                return
            if chunk is None:
                return
            for index, (answer, gold, spent) in chunk:
                conn.send((index, judge(answer, gold, timeout_s, None, spent)))


class _Worker:
    def __init__(self, ctx, timeout_s: float, judge, warm: bool, nice: int = 0):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=_worker_main, args=(child, timeout_s, judge, warm, nice), daemon=True
        )
        self.process.start()
        child.close()
        self.started = time.monotonic()
        self.ready = False
        self.chunk: list = []  # (index, pair) not yet answered, in order
        self.last = self.started  # when it last reported

    def kill(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.conn.close()


class GradingPool:
    """Lazily started worker processes; ``submit`` returns a future of one ``Grade`` per completion."""

    def __init__(
        self,
        workers: int | None = None,
        timeout_s: float = grading.DEFAULT_TIMEOUT_S,
        chunk: int = 64,
        inline_threshold: int = INLINE_THRESHOLD,
        stuck_after_s: float | None = None,
        judge=None,
        warm_up: bool = True,
        nice: int | None = None,
    ):
        self.workers = max(1, workers or (os.cpu_count() or 1))
        self.nice = WORKER_NICE if nice is None else nice
        self.timeout_s = timeout_s
        self.chunk = chunk
        self.inline_threshold = inline_threshold
        # How long a busy worker may stay silent: a pair's wall limit and some slack.
        self.stuck_after_s = stuck_after_s or deadline.wall_limit_s(timeout_s) + STUCK_SLACK_S
        self._judge = judge or grading.judge_rest  # a picklable function: tests put a stuck one here
        self._warm = warm_up
        self._workers: list[_Worker] = []
        self._jobs: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._ctx = mp.get_context("forkserver")  # workers never inherit a vLLM engine's threads or sockets
        self.stats = {"completions": 0, "unique_pairs": 0, "verified": 0, "timeouts": 0, "workers_killed": 0}

    def grade(self, items: Sequence[tuple[str, object]]) -> list[Grade]:
        return self.submit(items).result()

    def submit(self, items: Sequence[tuple[str, object]]) -> cf.Future:
        """``items``: (completion, gold), gold a math answer or a (solution_booleans, names) K&K pair."""
        slots: list[Grade | tuple[str, str]] = []
        pending: dict[tuple[str, str], tuple[float, float]] = {}
        known: dict[tuple[str, str], str] = {}
        extracted: dict[str, tuple] = {}  # identical completions (sampling repeats itself) are read once
        with deadline.armed(self.timeout_s):
            for completion, gold in items:
                if grading.is_kk_gold(gold):  # Knights-and-Knaves: a bounded regex reading, done here
                    slots.append(grading.grade(completion, gold, timeout_s=self.timeout_s))
                    continue
                if not isinstance(completion, str):
                    answer, cpu, wall = grading.extract_within(
                        completion, timeout_s=self.timeout_s, extract=grading.extract_answer
                    )
                else:
                    if completion not in extracted:
                        extracted[completion] = grading.extract_within(
                            completion, timeout_s=self.timeout_s, extract=grading.extract_answer
                        )
                    answer, cpu, wall = extracted[completion]
                gold_text = grading.normalise_gold(gold)
                if answer == grading.TIMEOUT_ANSWER:
                    slots.append(Grade(None, grading.TIMEOUT))
                    continue
                key = (answer, gold_text)
                slots.append(key)
                if key in known or key in pending:
                    continue
                if answer is None or not answer.strip():
                    known[key] = grading.NO_ANSWER
                else:
                    pending[key] = (cpu, wall)
        self.stats["completions"] += len(items)
        self.stats["unique_pairs"] += len(known) + len(pending)
        self.stats["verified"] += len(pending)
        todo = [(a, g, spent) for (a, g), spent in pending.items()]

        def resolve(statuses: list[str]) -> list[Grade]:
            known.update(zip(pending, statuses))
            self.stats["timeouts"] += sum(s == grading.TIMEOUT for s in statuses)
            self.stats["timeouts"] += sum(isinstance(s, Grade) and s.status == grading.TIMEOUT for s in slots)
            return [s if isinstance(s, Grade) else Grade(s[0], known[s]) for s in slots]

        result: cf.Future = cf.Future()
        if len(todo) < self.inline_threshold:
            result.set_result(resolve(_judge_many(todo, self.timeout_s)))
            return result
        self._jobs.put((todo, resolve, result))
        if self._thread is None:
            self._thread = threading.Thread(target=self._dispatch, name="grading-pool", daemon=True)
            self._thread.start()
        return result

    # --------------------------------------------------------------------------------------- workers
    def _dispatch(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            todo, resolve, result = job
            try:
                result.set_result(resolve(self._run(todo)))
            except Exception as exc:  # noqa: BLE001 - surfaces in .result()
                result.set_exception(exc)

    def _replace(self, worker: _Worker | None) -> _Worker:
        if worker is not None:
            worker.kill()
            self._workers.remove(worker)
        fresh = _Worker(self._ctx, self.timeout_s, self._judge, self._warm, self.nice)
        self._workers.append(fresh)
        return fresh

    def _run(self, todo: list) -> list[str]:
        """The statuses of ``todo`` from the workers, a stuck or lost worker's pair ``timeout``."""
        statuses: list[str | None] = [None] * len(todo)
        queued = list(enumerate(todo))
        while len(self._workers) < self.workers:
            self._replace(None)
        left, deaths = len(todo), 0
        while left:
            if deaths > 3 * self.workers:
                raise RuntimeError(f"grading workers died {deaths} times before reporting a verdict")
            for w in self._workers:
                if w.ready and not w.chunk and queued:
                    w.chunk, queued = queued[: self.chunk], queued[self.chunk :]
                    w.conn.send(w.chunk)
                    w.last = time.monotonic()
            busy = [w for w in self._workers if w.chunk or not w.ready]
            for conn in wait([w.conn for w in busy], timeout=1.0):
                w = next(w for w in busy if w.conn is conn)
                try:
                    index, status = conn.recv()
                except (EOFError, OSError):  # the worker died: its pair is not a verdict
                    lost = self._lose(w, statuses, queued, "died")
                    left -= lost
                    deaths = 0 if lost else deaths + 1
                    continue
                w.last = time.monotonic()
                if index == "ready":
                    w.ready = True
                    continue
                statuses[index] = status
                w.chunk = [item for item in w.chunk if item[0] != index]
                left -= 1
            now = time.monotonic()
            for w in list(self._workers):
                if w.ready and w.chunk and now - w.last > self.stuck_after_s:
                    left -= self._lose(w, statuses, queued, f"silent for {now - w.last:.0f} s")
                elif not w.ready and now - w.started > READY_TIMEOUT_S:
                    raise RuntimeError(f"a grading worker did not warm up in {READY_TIMEOUT_S:.0f} s")
        return statuses

    def _lose(self, worker: _Worker, statuses: list, queued: list, why: str) -> int:
        """Kill ``worker``; the pair it was on is ``timeout``, the rest of its chunk goes back to the queue."""
        self.stats["workers_killed"] += 1
        lost = 0
        if worker.chunk:
            index, (answer, gold, _) = worker.chunk[0]
            statuses[index] = grading.TIMEOUT
            lost = 1
            queued[:0] = worker.chunk[1:]
            logger.warning(
                "grading worker %s on %r (gold %r): killed, pair graded timeout", why, answer[:80], gold
            )
        worker.chunk = []
        self._replace(worker)
        return lost

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None
        for w in self._workers:
            try:
                w.conn.send(None)
            except OSError:
                pass
        for w in self._workers:
            w.process.join(10)
            if w.process.is_alive():
                w.process.kill()
                w.process.join(5)
            w.conn.close()
        self._workers = []

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
        completion, gold = items[i]
        if g.answer is None or grading.is_kk_gold(gold):
            # the budget ran out before an answer was read (or a K&K reading): read the completion again, or the
            # retry would judge "no answer" and count a right completion wrong
            out[i] = grading.grade(completion, gold, timeout_s=timeout_s)
            retried += 1
            continue
        key = (g.answer, grading.normalise_gold(gold))
        if key not in cache:
            cache[key] = grading.judge(g.answer, gold, timeout_s=timeout_s)
            retried += 1
        out[i] = Grade(g.answer, cache[key])
    return out, retried
