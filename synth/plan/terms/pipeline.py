"""The pipeline terms (Narayanan et al. 2021, sections 2.2 and 4.1): each micro-batch sends its
`b s h` activations forward and their gradient back, v times with the interleaved schedule (with
tensor parallelism the scatter/gather optimization sends `1/t` and all-gathers it inside the
stage; sequence parallelism already holds `1/t`); and the bubble of the 1F1B and interleaved
schedules (`pipeline_bubble`)."""

from __future__ import annotations

import math

from dataclasses import dataclass


@dataclass(frozen=True)
class PipelineTransfer:
    """One micro-batch's transfer to the next stage: seconds (send and, without sequence
    parallelism, the stage's all-gather), bytes sent, the link it crosses; `blocking`: 2 v of
    them per micro-batch, not overlapped."""

    seconds: float = 0.0
    sent: int = 0
    link: str = ""
    blocking: float = 0.0


def pipeline_transfer(costs, placement, settings, tp: int, pp: int, activation: int) -> PipelineTransfer:
    """The point-to-point transfer between stages (`settings`: step.Settings)."""
    if pp <= 1:
        return PipelineTransfer()
    shard = tp if tp > 1 else 1  # scatter/gather optimization, or sequence parallelism's own shards
    sent = activation // shard
    seconds, link = costs.point_to_point(placement, "pp", sent)
    gather_s = 0.0
    if tp > 1 and not settings.sequence_parallel:
        gather_s = costs.all_gather(placement, ("tp",), activation).time_s
    per_transfer = seconds + gather_s
    return PipelineTransfer(per_transfer, sent, link, 2 * settings.virtual * per_transfer)


def pipeline_bubble(stage_seconds, microbatches: int, virtual: int = 1, chain_transfer_s: float = 0.0,
                    forward_share: float = 1 / 3) -> float:
    """Seconds a 1F1B or interleaved pipeline step takes beyond `m x` its slowest stage's time per
    micro-batch, given every stage's time per micro-batch (forward and backward), first to last,
    and the forward's share of it.

    1F1B (Narayanan et al. 2021, section 2.2; Megatron's forward_backward_pipelining_without_
    interleaving: stage i runs p-i-1 warm-up forwards, then one forward and one backward
    alternately, then the rest of its backwards). Through each stage k runs a chain: the first
    micro-batch's forward reaches it after the forwards of the stages before it, it runs its m
    micro-batches, the last backward then passes the stages before it; and its first backward
    waits for the first micro-batch to pass the stages after it and come back, less the p-k-1
    warm-up forwards it runs meanwhile:

        m t_k + sum_{i<k} t_i + max(0, sum_{i>k} t_i - (p-k-1) f_k)

    The step is the longest chain; the bubble is that less m max(t). Even stages give (p-1) t;
    stages whose last one also runs the output layer give (p-1) times the OTHER stages' time,
    not (p-1) times the slowest. With v interleaved chunks each pass is through chunks of 1/v of a
    stage's work: the bubble / v (Narayanan et al.'s (p-1)/v t with even stages).

    `chain_transfer_s`: with the transfers overlapped with compute (interleaved schedule's
    overlap_p2p_comm) the steady state hides them, but the warm-up's first micro-batch crosses
    all p v chunks one after another (p v - 1 transfers: the first device idles p transfers at
    each of the v - 1 returns from the last device) and the cool-down's last backward crosses
    them again: 2 (p v - 1) transfers on the critical path. Without the overlap each stage's
    time already holds its blocking transfers (pass 0)."""
    times = list(stage_seconds)
    pp = len(times)
    if pp <= 1:
        return 0.0
    slowest = max(times)
    longest, before = -math.inf, 0  # before: sum(times[:k]), added in the same order as sum() would
    for k, t in enumerate(times):
        longest = max(longest, microbatches * t + before
                      + max(0.0, sum(times[k + 1:]) - (pp - k - 1) * forward_share * t))
        before += t
    return (longest - microbatches * slowest) / virtual + 2 * (pp * virtual - 1) * chain_transfer_s
