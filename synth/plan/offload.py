"""Activation offload to host memory: what it saves on the device and what its copies expose.

Megatron-core's layer-level CPU offloading (`TransformerConfig.cpu_offloading`,
`cpu_offloading_num_layers`, `cpu_offloading_activations`; Transformer Engine's
`get_cpu_offload_context`) copies the activations a layer keeps for backward to pinned host
memory on a side stream while the next layer's forward runs, and copies them back one layer
ahead of the backward that needs them. megatron-core 0.16.1 allows it for fewer layers than the
model has (one layer's activations stay), without pipeline parallelism and without
recomputation (TransformerConfig.__post_init__); the planner offers the most it allows, L - 1
layers, and the same rules.

Per offloaded layer and micro-batch the step pays what the copies do not hide:

    exposed = max(0, A / B - forward) + max(0, A / B - backward)

`A` the layer's activation bytes (synth/plan/formulas.py), `B` the device's host link per
direction (below), `forward`/`backward` the next layer's compute the copy runs behind. The
device keeps `A` for one layer instead of all L.

Host link per device, one direction (HOST_LINKS): the GPU's PCIe x16 link, as the vendor
states it (A100 SXM: PCIe Gen4, 64 GB/s both directions; H100 and H200 SXM: PCIe Gen5,
128 GB/s both directions: NVIDIA's A100, H100 and H200 datasheets), shared by the two GPUs
behind each PCIe switch of a DGX/HGX board (NVIDIA DGX A100 System Architecture whitepaper:
four PCIe switches, each joining two GPUs, two NICs and a CPU root port; DGX H100 likewise),
so half the link per GPU when every GPU offloads at once. Line rates: a pinned copy reaches
80-90% of them (cudaMemcpyAsync between pinned host memory and the device), not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

from synth.devices import device_named


@dataclass(frozen=True)
class HostLink:
    bytes_per_s: float  # per device, one direction
    source: str


_GEN4 = ("PCIe Gen4 x16, 64 GB/s both directions (NVIDIA A100 datasheet), 32 GB/s each way, shared by the two "
         "GPUs behind each PCIe switch (NVIDIA DGX A100 System Architecture whitepaper): 16 GB/s per GPU")
_GEN5 = ("PCIe Gen5 x16, 128 GB/s both directions (NVIDIA H100 / H200 datasheets), 64 GB/s each way, shared by "
         "the two GPUs behind each PCIe switch of an HGX board (as in the DGX A100 whitepaper's layout): 32 GB/s per GPU")
HOST_LINKS: dict[str, HostLink] = {
    "a100-sxm4-80gb": HostLink(16e9, _GEN4),
    "a100-sxm4-40gb": HostLink(16e9, _GEN4),
    "h100-sxm5-80gb": HostLink(32e9, _GEN5),
    "h200-sxm-141gb": HostLink(32e9, _GEN5),
}


def host_link(device_name: str | None) -> HostLink | None:
    """The device's host link (None for a device without a built-in description or figure)."""
    described = device_named(device_name) if device_name else None
    return HOST_LINKS.get(described.key) if described is not None else None


def offload_problem(layers: int, offloaded: int, pp: int, recompute: str) -> str | None:
    """Why this offload is not runnable (megatron-core 0.16.1's TransformerConfig checks), or None."""
    if offloaded <= 0:
        return None
    if offloaded >= layers:
        return "activation offload of every layer (megatron-core keeps at least one)"
    if pp > 1:
        return "activation offload with pipeline parallelism (megatron-core: not supported)"
    if recompute != "none":
        return "activation offload with recomputation (megatron-core: not supported)"
    return None


def exposed_seconds(layer_bytes: float, bandwidth: float, forward_s: float, backward_s: float) -> float:
    """Per offloaded layer and micro-batch: the copy out behind the next forward and the copy back
    behind the next backward, each exposed where it outlasts that compute."""
    copy = layer_bytes / bandwidth
    return max(0.0, copy - forward_s) + max(0.0, copy - backward_s)
