"""Where the points run: in this process, a local process pool (concurrent.futures), Ray or Dask.

Every executor takes the same tasks (chunks of consecutive points, run by run.run_chunk) and
yields each chunk's rows as it finishes, in any order; at most a window of chunks is in flight,
so a grid of millions of points is never submitted at once. Ray and Dask are optional extras
(pyproject: codesign-ray, codesign-dask), imported only when asked for. The rows do not depend on
the executor or on the worker count: each point is planned by itself, and the memo a worker
keeps returns what a fresh computation would (synth/codesign/run.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

from synth.codesign.errors import MissingExtraError, UnreachableClusterError
from synth.codesign.run import RunOptions, run_chunk

EXECUTORS = ("serial", "local", "ray", "dask")
WINDOW = 4  # chunks in flight per worker


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def run_tasks(executor: str, tasks: Iterable[tuple], options: RunOptions, workers: int,
              address: str | None = None) -> Iterator[list[dict]]:
    """The rows of every chunk of `tasks`, chunk by chunk as they finish."""
    if executor == "serial":
        return (run_chunk(chunk, options) for chunk in tasks)
    if executor == "local":
        return _local(tasks, options, workers)
    if executor == "ray":
        return _ray(tasks, options, workers, address)
    if executor == "dask":
        return _dask(tasks, options, workers, address)
    raise ValueError(f"unknown executor {executor!r}: choose from {', '.join(EXECUTORS)}")


def _local(tasks, options, workers) -> Iterator[list[dict]]:
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    # spawn: the parent may hold threads (a progress bar), which fork would copy mid-state
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        pending = set()
        iterator = iter(tasks)
        for chunk in iterator:
            pending.add(pool.submit(run_chunk, chunk, options))
            if len(pending) >= WINDOW * workers:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    yield future.result()
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                yield future.result()


def _ray(tasks, options, workers, address) -> Iterator[list[dict]]:
    try:
        import ray
    except ImportError:
        raise MissingExtraError("the ray executor needs ray, which is not installed: install the codesign-ray "
                                "extra (pip install 'hierarchical-collectives-synth[codesign-ray]')",
                                extra="codesign-ray") from None
    started = not ray.is_initialized()
    if started:
        # attach to a running cluster by address, or start a local instance of `workers` CPUs
        try:
            ray.init(address=address, **({} if address else {"num_cpus": workers}), include_dashboard=False,
                     log_to_driver=False)
        except (ConnectionError, RuntimeError, OSError, ValueError) as error:
            raise UnreachableClusterError(f"Ray at {address or 'a local instance'} cannot be reached or started: "
                                          f"{' '.join(str(error).split())[:200]}") from None
    remote = ray.remote(num_cpus=1)(run_chunk)
    try:
        options_ref = ray.put(options)
        pending = []
        for chunk in tasks:
            pending.append(remote.remote(chunk, options_ref))
            if len(pending) >= WINDOW * workers:
                done, pending = ray.wait(pending, num_returns=1)
                yield ray.get(done[0])
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            yield ray.get(done[0])
    finally:
        if started:
            ray.shutdown()


def _dask(tasks, options, workers, address) -> Iterator[list[dict]]:
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise MissingExtraError("the dask executor needs dask.distributed, which is not installed: install the "
                                "codesign-dask extra (pip install 'hierarchical-collectives-synth[codesign-dask]')",
                                extra="codesign-dask") from None
    cluster = None if address else LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                                dashboard_address=None)
    try:
        client = Client(address or cluster, timeout=30)
    except (OSError, TimeoutError, ValueError) as error:
        if cluster is not None:
            cluster.close()
        raise UnreachableClusterError(f"the Dask scheduler at {address} cannot be reached: "
                                      f"{' '.join(str(error).split())[:200]}") from None
    try:
        window = as_completed()
        in_flight = 0
        for chunk in tasks:
            window.add(client.submit(run_chunk, chunk, options, pure=False))
            in_flight += 1
            if in_flight >= WINDOW * workers:
                yield next(window).result()
                in_flight -= 1
        for future in window:
            yield future.result()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
