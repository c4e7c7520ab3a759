"""One mechanism at a time: how the uncalibrated fidelity of the published logs moves when one
part of the NCCL model is priced another way (benchmarks/fidelity.py writes it into its report).

The proxy floor (synth/model/nccl/proxy.py) is the one studied here: the model's floor (the
proxy thread posts every step of every loop, ceil(2 x channels / NICs) operations a step, for
rings and classic trees across nodes) against NCCL's own price (proxy.nccl_priced_floor_s: one
nsteps x overhead per call inside the ring's latency, none for the tree), and the model's floor
without each of its parts. Each variant swaps the floor the timing reads, for this study only."""

from __future__ import annotations

import statistics
from unittest import mock

from synth.model.nccl import proxy, timing
from synth.model.nccl.names import PROTOCOLS
from synth.model.nccl.tables import BASE_LATENCY


def _floor(loops: bool = True, operations: bool = True, tree: bool = True):
    """The model's floor with some of its parts left out."""
    def floor(table, hardware, call, algorithm, protocol, channels):
        if call.nodes < 2 or hardware.network is None or channels < 1:
            return 0.0
        if algorithm == "ring" and call.collective in proxy.RING_COLLECTIVES:
            count = proxy.ring_steps(call) * (proxy.ring_loops(table, hardware, call, protocol, channels) if loops else 1)
            count *= proxy.operations_per_step(hardware, call, channels) if operations else 1
        elif algorithm == "tree" and call.collective == "AllReduce" and tree:
            count = proxy.tree_loops(table, hardware, call, protocol, channels) if loops else 1
            count *= proxy.tree_operations_per_loop(hardware, call, channels) if operations else \
                (2 if call.nodes == 2 else 6)
        else:
            return 0.0
        busy = count * proxy.step_overhead_us(hardware, protocol)
        return (BASE_LATENCY[algorithm][PROTOCOLS.index(protocol)] + busy) * 1e-6
    return floor


def _nccl_priced(table, hardware, call, algorithm, protocol, channels):
    return proxy.nccl_priced_floor_s(hardware, call, algorithm, protocol)


PROXY_VARIANTS = (
    ("the model's floor (every step of every loop, ceil(2 x channels / NICs) operations a step, rings and trees)",
     None),
    ("NCCL's price: one nsteps x overhead per call, rings only (tuning.cc:316-322)", _nccl_priced),
    ("the model's floor without the loops", _floor(loops=False)),
    ("the model's floor without the operations per step", _floor(operations=False)),
    ("the model's floor without the classic tree's", _floor(tree=False)),
)


def proxy_ablation(logs, predict, bands, error) -> list[dict]:
    """Per variant: the pooled median |error| per band of the uncalibrated predictions, and the
    logs whose band medians move by more than half a point against the model's."""
    rows, reference = [], None
    for name, floor in PROXY_VARIANTS:
        patch = mock.patch.object(timing, "proxy_floor_s", floor) if floor is not None else mock.patch.object(
            timing, "proxy_floor_s", timing.proxy_floor_s)
        with patch:
            per_log = {}
            for log in logs:
                measurements = list(log.measurements)
                times = predict(log.base, measurements)
                per_log[log.name] = {band: [abs(error(t, m.time_s)) for t, m in zip(times, measurements)
                                            if low <= m.bytes < high] for band, low, high in bands}
        pooled = {band: statistics.median([e for cells in per_log.values() for e in cells[band]] or [0.0])
                  for band, _, _ in bands}
        medians = {log: {band: statistics.median(e) for band, e in cells.items() if e} for log, cells in per_log.items()}
        moved = []
        if reference is not None:
            for log, cells in medians.items():
                for band, value in cells.items():
                    old = reference[log][band]
                    if abs(value - old) > 0.005:
                        moved.append(f"{log} {band} {old:.0%} -> {value:.0%}")
        else:
            reference = medians
        rows.append({"variant": name, "pooled": pooled, "moved": moved})
    return rows
