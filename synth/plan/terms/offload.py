"""The offload term (synth/plan/offload.py): the activation copies of the offloaded layers to
host memory and back that the compute they run behind cannot hide, per micro-batch."""

from __future__ import annotations

from synth.devices import device_keys
from synth.errors import UsageError
from synth.plan import formulas, offload


def offload_seconds(model, compute, settings, tp: int, cp: int, forward_s: float, backward_s: float,
                    etp: int = 0) -> float:
    """Exposed copy seconds per micro-batch (`compute`: step.Compute, `settings`: step.Settings)."""
    if not settings.offload_layers:
        return 0.0
    if compute.host_bandwidth is None:
        raise UsageError("activation offload needs the device's host link (PCIe) bandwidth: a built-in device "
                         f"({', '.join(device_keys())}); leave offload out")
    offloaded_bytes = formulas.layer_activation_bytes(model, settings.micro_batch, tp, cp,
                                                      settings.sequence_parallel, settings.recompute, etp)
    return settings.offload_layers * offload.exposed_seconds(offloaded_bytes, compute.host_bandwidth,
                                                             forward_s, backward_s)
