"""Sweep rows measured by Ray workers: one replica of the student per worker, rows streamed to the driver.

    fp8probe sweep ... --workers N [--ray-address ADDR]        (pip install 'fp8probe[ray]')

The driver does what a single-process sweep does up to the rows: it loads the student, samples (or reads)
the rollouts and runs the reference pass (and, for --method fisher|auto, the estimate). Then:

- one Ray actor per worker loads its own replica of the student (the same path, dtype and device kind: its
  own GPU, `num_gpus=1`, or `threads` CPU threads) and receives the reference (recorded block inputs,
  reference log-probs, calibration) once, through Ray's object store (`ray.put` once, passed to every
  actor's constructor; the rollouts travel inside it);
- rows are handed out in small shards, at most two in flight per worker; each finished shard's rows stream
  back to the driver, which alone appends them to sensitivity.partial.csv (sweep.py), so resume and the
  final table are the single-process sweep's;
- a worker that dies (killed, out of memory, its node lost) has its in-flight shards put back in the queue
  and re-run by the others; Ray restarts it once (`max_restarts=1`), after which it is dropped. Rows are
  keyed by unit: none is lost, none written twice. With no worker left the sweep stops with its finished
  rows kept (--resume).

Every metric of a row is computed by the same code on the same inputs; the only quantity whose rounding
could depend on the thread count, the SQNR's energy sums, is computed thread-count-independently
(fp8.energy), so the distributed table is byte-identical to the single-process one (tested).

Without --ray-address a local Ray instance is started and stopped by fp8probe; with one, fp8probe joins
that cluster and leaves it running.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import os
import socket
import time
from dataclasses import dataclass

from ..core.errors import FP8ProbeError, one_line

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'fp8probe[ray]'"
MAX_SHARD = 8  # rows per task at most: small enough that a lost worker costs little, large enough to amortise
IN_FLIGHT = 2  # shards queued per worker, so that it never waits for the driver


def require_ray():
    try:
        import ray
    except ImportError as e:
        raise FP8ProbeError(f"`workers` needs Ray, which is not installed: {INSTALL_HINT}") from e
    return ray


@dataclass(frozen=True)
class Cluster:
    """Where the workers run: `workers` actors, each with `threads` CPU threads or one GPU."""

    workers: int
    address: str | None = None
    threads: int | None = None  # CPU threads per worker; default: this machine's cores / workers
    gpus: bool = False

    def threads_per_worker(self) -> int:
        return self.threads or max(1, (os.cpu_count() or 1) // self.workers)


def check_address(address: str | None, timeout: float = 5.0) -> None:
    """A HOST:PORT (or ray://HOST:PORT) address must accept a connection: Ray itself retries a wrong one for
    minutes. `auto` (the cluster this machine belongs to, found by Ray) is left to Ray."""
    if not address or address == "auto":
        return
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise FP8ProbeError(
            f"`ray_address` {address}: give HOST:PORT of the Ray head (e.g. 10.0.0.1:6379), ray://HOST:PORT, or auto"
        )
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise FP8ProbeError(
            f"`ray_address` {address}: nothing answers there ({e.strerror or e}); start the cluster "
            "(`ray start --head`) or check the address (`ray status` on the head node)"
        ) from e


@contextlib.contextmanager
def ray_session(cluster: Cluster):
    """Ray, initialised: a local instance started (and stopped on exit) without an address; with one, the
    existing cluster joined and left running."""
    ray = require_ray()
    started = False
    if not ray.is_initialized():
        kwargs = dict(
            include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING, configure_logging=True
        )
        try:
            if cluster.address:
                ray.init(address=cluster.address, **kwargs)
            else:
                cpus = max(os.cpu_count() or 1, cluster.workers * cluster.threads_per_worker())
                ray.init(num_cpus=cpus, **kwargs)
                started = True
        except (ConnectionError, RuntimeError, ValueError) as e:
            where = f"the Ray cluster at {cluster.address}" if cluster.address else "a local Ray instance"
            raise FP8ProbeError(
                f"could not start or join {where}: {str(e).splitlines()[0]}; check `ray_address` "
                "(`ray status` on the head node shows it)"
            ) from e
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


class SweepWorker:
    """One replica of the student and the reference; measures shards of rows (a Ray actor)."""

    def __init__(self, load: dict, reference, threads: int | None):
        import torch

        from ..model.student import load_student

        if threads:
            torch.set_num_threads(threads)
        self.student = load_student(**load)
        self.reference = reference.bind(self.student)

    def pid(self) -> int:
        return os.getpid()

    def measure(self, rows) -> list[dict]:
        from .sweep import measure_row

        return [measure_row(self.reference, self.student, r) for r in rows]


def shards(rows: list, workers: int) -> list[list]:
    """Rows in plan order, cut into shards of at most MAX_SHARD, about four per worker."""
    size = max(1, min(MAX_SHARD, math.ceil(len(rows) / (4 * workers))))
    return [rows[i : i + size] for i in range(0, len(rows), size)]


class RayRows:
    """A sweep's row executor: called with the reference and the rows to measure, yields (row, metrics) as
    shards finish. A dead worker's shards go back to the queue and a fresh worker replaces it (at most
    `workers` replacements in all)."""

    def __init__(self, cluster: Cluster, load: dict, on_start=None):
        self.cluster, self.load, self.on_start = cluster, load, on_start
        self.actors: list = []
        self.stats = {"workers": cluster.workers, "shards": 0, "retried_shards": 0, "worker_deaths": 0}

    def _spawn(self, ray, ref):
        opts = {"num_gpus": 1, "num_cpus": 1} if self.cluster.gpus else {"num_cpus": self.cluster.threads_per_worker()}
        threads = None if self.cluster.gpus else self.cluster.threads_per_worker()
        self.actors.append(ray.remote(max_restarts=0, **opts)(SweepWorker).remote(self.load, ref, threads))
        return len(self.actors) - 1

    def __call__(self, reference, rows):
        ray = require_ray()
        from ray.exceptions import RayActorError

        t0 = time.perf_counter()
        ref = ray.put(reference)  # once: every actor's constructor receives it from the object store
        self.stats["transfer_bytes"] = reference.nbytes()
        alive = {self._spawn(ray, ref) for _ in range(self.cluster.workers)}
        if self.on_start is not None:
            self.on_start(self)
        queue = collections.deque(shards(rows, self.cluster.workers))
        self.stats["shards"] = len(queue)
        replacements = self.cluster.workers
        pending: dict = {}  # ObjectRef -> (actor index, shard)
        load = collections.Counter()
        last_error = ""
        while queue or pending:
            for i in sorted(alive):
                while queue and load[i] < IN_FLIGHT:
                    shard = queue.popleft()
                    pending[self.actors[i].measure.remote(shard)] = (i, shard)
                    load[i] += 1
            if not pending:
                raise FP8ProbeError(
                    f"every sweep worker died (last: {last_error}); the finished rows are kept: "
                    "rerun with `resume` (and fewer `workers`, or more memory per worker)"
                )
            done, _ = ray.wait(list(pending), num_returns=1)
            i, shard = pending.pop(done[0])
            load[i] -= 1
            try:
                results = ray.get(done[0])
            except RayActorError as e:
                queue.appendleft(shard)  # re-run elsewhere; its rows were never written
                self.stats["retried_shards"] += 1
                if i in alive:  # the first of its in-flight shards to fail: the worker is gone
                    alive.discard(i)
                    self.stats["worker_deaths"] += 1
                    last_error = one_line(e)
                    log.warning("sweep worker %d died (%s); its rows are re-run by the others", i, last_error)
                    if replacements > 0:
                        replacements -= 1
                        alive.add(self._spawn(ray, ref))
                continue
            self.stats.setdefault("first_rows_seconds", round(time.perf_counter() - t0, 3))
            yield from zip(shard, results)

    def close(self):
        ray = require_ray()
        for a in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(a)
        self.actors = []


# ---------------------------------------------------------------------------------------------------
# cost model


@dataclass(frozen=True)
class CostModel:
    """Wall time of a sweep's exact rows on N workers:

        T(N) = start + transfer + max(Σ_rows cost(row) / N, cost of the slowest shard)
        cost(row) = (L - start_block) · t_block + t_head

    A row re-runs the decoder blocks from the first one it perturbs to the last (reference.py's prefix reuse),
    then the final norm, the lm_head on the response positions and the statistics (t_head). `start` is the
    time until every worker holds its replica (Ray start, the load of one replica; workers load in parallel),
    `transfer` the reference's bytes over the object store's bandwidth (each worker receives it once).
    t_block and t_head are per worker, at its thread count (CPU) or on its GPU.
    """

    t_block: float
    t_head: float
    start: float = 0.0
    transfer_bytes: int = 0
    bandwidth: float = 5e9  # bytes/s into a worker

    def row_seconds(self, start_block: int, num_layers: int) -> float:
        return (num_layers - max(start_block, 0)) * self.t_block + self.t_head

    def seconds(self, start_blocks: list[int], num_layers: int, workers: int) -> float:
        costs = [self.row_seconds(b, num_layers) for b in start_blocks]
        work = sum(costs) / workers
        slowest = max((sum(costs[i : i + len(s)]) for i, s in _shard_spans(len(costs), workers)), default=0.0)
        transfer = self.transfer_bytes / self.bandwidth if workers > 0 and self.transfer_bytes else 0.0
        return self.start + transfer + max(work, slowest)


def _shard_spans(n: int, workers: int):
    i = 0
    for s in shards(list(range(n)), workers):
        yield i, s
        i += len(s)


def block_costs(reference, repeats: int = 3) -> tuple[float, float]:
    """(t_block, t_head) measured on this process's student: the best of `repeats` candidate passes from the
    first and from the last block."""
    from ..measurement.mismatch import summarize

    n = len(reference.layers)

    def best(start):
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            summarize(reference.candidate_stats(start))
            times.append(time.perf_counter() - t)
        return min(times)

    full, last = best(0), best(n - 1)
    t_block = max((full - last) / max(n - 1, 1), 0.0)
    return t_block, max(last - t_block, 0.0)


def cluster_for(model, workers: int, ray_address: str | None, threads_per_worker: int | None):
    """The Ray workers a sweep of `model` (a ModelSource) asked for (None: this process alone), checked before any
    output exists."""
    if workers == 1 and not ray_address:
        return None
    require_ray()
    check_address(ray_address)
    if model.device == "auto":
        raise FP8ProbeError(
            "`workers` with `device` auto: each worker holds its own replica; use `device` cuda (one GPU per worker)"
        )
    return Cluster(workers, ray_address, threads_per_worker, gpus=model.device.startswith("cuda"))


@contextlib.contextmanager
def row_workers(model, cluster):
    """The rows executor of `cluster` (None: rows measured in this process), its workers loading `model` (a
    ModelSource) and closed on exit."""
    if cluster is None:
        yield None
        return

    load_kw = {
        "name_or_path": model.model,
        "device": "cuda" if cluster.gpus else model.device,
        "dtype": model.dtype,
        "trust_remote_code": model.trust_remote_code,
        "allow_pickle": model.allow_pickle,
    }
    log.info(
        "rows measured by %d Ray worker(s)%s",
        cluster.workers,
        f" on the cluster at {cluster.address}"
        if cluster.address
        else f" ({cluster.threads_per_worker()} CPU threads each)"
        if not cluster.gpus
        else " (one GPU each)",
    )
    with ray_session(cluster):
        executor = RayRows(cluster, load_kw)
        try:
            yield executor
        finally:
            executor.close()
