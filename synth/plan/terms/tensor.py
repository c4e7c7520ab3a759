"""The tensor-parallel term (Megatron-LM, Shoeybi et al. 2019, section 3): two all-reduces of the
layer's `b s h` activations in forward and two in backward (two more in a fully recomputed
forward), on the critical path; with sequence parallelism (Korthikanti et al. 2022, section
4.2.2) each a reduce-scatter and an all-gather of the same size; one more for the
vocabulary-parallel output layer. With `tp_overlap` each runs inside its GEMM and only what
the GEMM cannot hide counts (`tp_overlap_exposed`)."""

from __future__ import annotations

from dataclasses import dataclass

from synth.plan import attention as attention_forms


@dataclass(frozen=True)
class TensorParallel:
    """Seconds per micro-batch on one device: one layer's exposed collectives (all, and those of
    its backward) and the output layer's; the call they are made of, for the step's route."""

    layer: float = 0.0
    backward: float = 0.0
    head: float = 0.0
    per_call: float = 0.0  # one all-reduce, or one reduce-scatter and all-gather pair
    calls: int = 0  # per layer per micro-batch
    program: str = ""
    levels: str = ""
    gather_s: float = 0.0  # one all-gather (sequence parallelism), for the pipeline's scatter/gather
    scatter_s: float = 0.0


def tensor_parallel(model, compute, costs, placement, settings, tp: int, cp: int, activation: int) -> TensorParallel:
    """The tensor-parallel collectives of one layer over the `tp` groups, `activation` bytes per
    call (`compute`: step.Compute, `settings`: step.Settings, `costs`: plan.costs.CommunicationCosts)."""
    if tp <= 1:
        return TensorParallel()
    full = settings.recompute == "full"
    calls = 4 + (2 if full else 0)
    gather_s = scatter_s = 0.0
    if settings.sequence_parallel:
        scatter = costs.reduce_scatter(placement, ("tp",), activation)
        gather = costs.all_gather(placement, ("tp",), activation)
        per_call = scatter.time_s + gather.time_s
        program, levels = f"{scatter.program}; {gather.program}", scatter.levels
        gather_s, scatter_s = gather.time_s, scatter.time_s
    else:
        reduce = costs.all_reduce(placement, ("tp",), activation)
        per_call, program, levels = reduce.time_s, reduce.program, reduce.levels
    layer, head = calls * per_call, per_call  # + the output layer's all-reduce
    backward = (2 + (2 if full else 0)) * per_call
    if settings.tp_overlap:
        forward_s, backward_s = tp_overlap_exposed(model, compute, settings.micro_batch * model.seq_len // cp, tp,
                                                   gather_s, scatter_s)
        backward = backward_s
        layer = forward_s * (2 if full else 1) + backward_s
    return TensorParallel(layer, backward, head, per_call, calls, program, levels, gather_s, scatter_s)


# Transformer Engine's userbuffers defaults (transformer_engine/pytorch/module/base.py, initialize_ub):
# all-gathers by "ring_exchange" on 1 SM in tp steps, reduce-scatters by "pipeline" on 16 SMs in 4 splits.
RING_EXCHANGE_SMS, PIPELINE_SMS, PIPELINE_SPLITS = 1, 16, 4


def _overlapped(comm: float, gemm: float, sms: int, total_sms: int, tail: float) -> float:
    """Exposed seconds of one collective run inside one GEMM: the GEMM loses `sms` of its SMs while
    they overlap (the contention), the collective shows where it outlasts the slowed GEMM, and
    `tail` of it (the last split of a pipelined reduce-scatter) runs after the GEMM."""
    slowdown = total_sms / (total_sms - sms)
    hidden = comm * (1 - tail)
    inside = hidden - gemm if hidden >= gemm * slowdown else hidden * (1 - 1 / slowdown)
    return comm * tail + inside


def tp_overlap_exposed(model: Transformer, compute: Compute, tokens: int, tp: int, gather_s: float,
                       scatter_s: float) -> tuple[float, float]:
    """(forward, backward) exposed seconds per layer of the sequence-parallel all-gathers and
    reduce-scatters overlapped with their GEMMs (Megatron's --tp-comm-overlap): forward, the
    gathers inside the QKV and FC1 GEMMs and the scatters inside the projection and FC2 GEMMs;
    backward, the gathers inside the projection's and FC2's input-gradient GEMMs and the
    scatters inside QKV's and FC1's weight-gradient GEMMs (TE's "bulk" overlap, no tail)."""
    gemms = attention_forms.layer_gemms(model, tokens, tp)
    if compute.kernels is not None:
        sms = int(compute.kernels.device.sms.value)
        seconds = lambda g: compute.kernels.gemm_seconds(g, model.bytes_per_value)  # noqa: E731
        # the weight-gradient GEMM as it runs: with gradient-accumulation fusion its epilogue reads
        # and writes the fp32 main gradient (kernels.py), a longer window for the scatter it hides
        wgrad_seconds = lambda g: compute.kernels.gemm_seconds(  # noqa: E731
            g, model.bytes_per_value, compute.kernels.wgrad_output_bytes(model.bytes_per_value))
    else:
        sms = 132  # no device description: an H100's SM count for the contention share
        seconds = wgrad_seconds = lambda g: g.flops / compute.rate  # noqa: E731
    qkv, proj, fc1, fc2 = gemms[0], gemms[-3], gemms[-2], gemms[-1]  # MLA: its first down projection as QKV
    forward = (_overlapped(gather_s, seconds(qkv), RING_EXCHANGE_SMS, sms, 0.0)
               + _overlapped(scatter_s, seconds(proj), PIPELINE_SMS, sms, 1 / PIPELINE_SPLITS)
               + _overlapped(gather_s, seconds(fc1), RING_EXCHANGE_SMS, sms, 0.0)
               + _overlapped(scatter_s, seconds(fc2), PIPELINE_SMS, sms, 1 / PIPELINE_SPLITS))
    backward = (_overlapped(gather_s, seconds(proj.backward()[0]), RING_EXCHANGE_SMS, sms, 0.0)
                + _overlapped(gather_s, seconds(fc2.backward()[0]), RING_EXCHANGE_SMS, sms, 0.0)
                + _overlapped(scatter_s, wgrad_seconds(qkv.backward()[1]), PIPELINE_SMS, sms, 0.0)
                + _overlapped(scatter_s, wgrad_seconds(fc1.backward()[1]), PIPELINE_SMS, sms, 0.0))
    return forward, backward
