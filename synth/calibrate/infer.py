"""A base topology from nccl-tests rank lines alone, for `synth calibrate` without --topology:
hosts and ranks per host give the levels, the GPU name the generation and the intra-node link,
and every figure the output cannot tell is assumed and said (`Inferred.assumptions`).

GPU facts (line rates per GPU and direction), by the name nccl-tests prints:
H100/H200 SXM: 18 NVLink4 links, 450 GB/s (H100 datasheet), NVSwitch, NVLS;
A100 SXM: 12 NVLink3 links, 300 GB/s (A100 datasheet), NVSwitch;
V100 SXM2: 6 NVLink2 links, 150 GB/s (V100 datasheet), hybrid cube mesh;
anything else: PCIe (Gen5 x16 63 GB/s for Blackwell and Hopper PCIe cards, Gen4 x16 31.5 GB/s
before). Between hosts, when nothing says otherwise: one InfiniBand NIC per GPU at the rate
the GPU's reference systems ship with (DGX H100: 400 Gb/s NDR; DGX A100: 200 Gb/s HDR;
DGX-1 V100: 100 Gb/s EDR).
"""

from __future__ import annotations

from dataclasses import dataclass

from synth.calibrate.measurements import Measurement
from synth.errors import UsageError
from synth.topology import Figure, Level, LinkKind, NcclSystem, Topology, Transport, Uplinks, check_levels

GB = 1e9


@dataclass(frozen=True)
class Gpu:
    generation: str
    intra: str  # nvswitch, nvlink or pcie
    intra_bandwidth: float  # bytes/s per GPU and direction
    nic_bandwidth: float  # bytes/s, the reference system's NIC per GPU
    source: str


def gpu_from_name(name: str) -> tuple[Gpu, list[str]]:
    """The GPU facts for an nccl-tests device name, and what was assumed."""
    text = name.upper()
    if any(key in text for key in ("H100", "H200", "H800", "GH200")) and ("PCIE" not in text and " NVL" not in text):
        return Gpu("hopper", "nvswitch", 450 * GB, 50 * GB,
                   "NVIDIA H100 datasheet (SXM5): 18 NVLink4 links, 900 GB/s per GPU, 450 GB/s each direction, through "
                   "NVSwitch; DGX H100: one 400 Gb/s ConnectX-7 per GPU"), []
    if "A100" in text and "PCIE" not in text:
        return Gpu("ampere", "nvswitch", 300 * GB, 25 * GB,
                   "NVIDIA A100 datasheet (SXM4): 12 NVLink3 links, 600 GB/s per GPU, 300 GB/s each direction, through "
                   "NVSwitch; DGX A100: one 200 Gb/s ConnectX-6 per GPU"), []
    if "V100" in text and "PCIE" not in text:
        return Gpu("volta", "nvlink", 150 * GB, 12.5 * GB,
                   "NVIDIA V100 datasheet (SXM2): 6 NVLink2 links, 300 GB/s per GPU, 150 GB/s each direction, hybrid cube "
                   "mesh; DGX-1: 100 Gb/s EDR InfiniBand"), []
    notes = []
    if any(key in text for key in ("B200", "B100", "GB200", "RTX 50", "RTX PRO", "BLACKWELL")):
        generation, pcie = "blackwell", 63 * GB
    elif any(key in text for key in ("H100", "H200", "H20", "H800", "GH")):
        generation, pcie = "hopper", 63 * GB
    elif "V100" in text or "TITAN V" in text:
        generation, pcie = "volta", 15.75 * GB
    else:
        generation, pcie = "ampere", 31.5 * GB
        if not any(key in text for key in ("A100", "A10", "A30", "A40", "A6000", "RTX 30", "RTX A")):
            notes.append(f"GPU {name!r} not recognised: NCCL's Ampere tables assumed")
    return Gpu(generation, "pcie", pcie, 12.5 * GB,
               f"PCIe {'Gen5' if pcie > 40 * GB else 'Gen4' if pcie > 20 * GB else 'Gen3'} x16 line rate "
               f"({pcie / GB:g} GB/s each direction) for a {name} without NVLink"), notes


@dataclass(frozen=True)
class Inferred:
    topology: Topology
    assumptions: tuple[str, ...]


def infer_nccl_base(measurements: list[Measurement]) -> Inferred:
    """The system of nccl-tests groups: hosts x ranks, the GPU from the rank lines."""
    if any(m.span.level is not None for m in measurements):
        raise UsageError("the files (or the level given) name levels; give a base topology for their order and sizes",
                         inputs=("topology",))
    names = sorted({name for m in measurements if m.run is not None for name in m.run.devices})
    if not names:
        raise UsageError("the files do not name their GPUs (no nccl-tests rank lines); give a base topology",
                         inputs=("topology",))
    gpu, assumptions = gpu_from_name(names[0])
    assumptions = list(assumptions)
    if len(names) > 1:
        assumptions.append(f"GPUs {', '.join(names)} differ: figures of {names[0]} used for all")
    hosts = max(m.span.hosts for m in measurements)
    ranks = max(m.span.per_unit if m.span.hosts > 1 else m.span.units for m in measurements)
    shared = any(m.run is not None and m.run.shared_device for m in measurements)
    assumed = "assumed by synth calibrate from the nccl-tests rank lines"
    if shared:
        # Ranks sharing one GPU: NCCL refuses that inside one host, so they ran as separate NCCL
        # hosts (NCCL_HOSTID) and reached each other over the network, here loopback TCP.
        ranks_total = max(m.span.size for m in measurements)
        level = Level("host", ranks_total, Figure(40e9 / 8, f"estimate ({assumed}): loopback TCP, tens of Gb/s"),
                      Figure(20e-6, f"estimate ({assumed})"), Uplinks(1, Figure(40e9 / 8, f"estimate ({assumed})")),
                      link=LinkKind("loopback", f"{assumed}: ranks share one GPU, so NCCL saw them as separate hosts "
                                                f"(NCCL_HOSTID) joined by loopback TCP"),
                      transport=Transport("socket", f"{assumed}: NCCL's socket transport over loopback", gdr=False))
        assumptions.append("ranks share one GPU: taken as separate NCCL hosts on loopback TCP (socket transport)")
        levels = (level,)
    else:
        gpu_level = Level("gpu", ranks, Figure(gpu.intra_bandwidth, gpu.source), Figure(3.4e-6, f"estimate ({assumed})"),
                          link=LinkKind(gpu.intra, gpu.source))
        levels = (gpu_level,)
        if hosts > 1:
            nic = Figure(gpu.nic_bandwidth, f"assumed by synth calibrate: one {gpu.nic_bandwidth * 8 / GB:g} Gb/s "
                                            f"InfiniBand NIC per GPU, as {gpu.generation} reference systems ship")
            node = Level("node", hosts, nic, Figure(9.6e-6, f"estimate ({assumed})"), Uplinks(ranks, nic),
                         link=LinkKind("infiniband", nic.source),
                         transport=Transport("ib", "assumed by synth calibrate: NCCL net_ib with GPUDirect RDMA"))
            levels = (node, gpu_level)
            assumptions.append(f"between hosts: one {gpu.nic_bandwidth * 8 / GB:g} Gb/s InfiniBand NIC per GPU with "
                               f"GPUDirect RDMA (the output does not say; give a base topology to set them)")
    check_levels(levels, "the measured groups")
    nvls = gpu.generation in ("hopper", "blackwell") and gpu.intra == "nvswitch"
    if shared:
        assumptions.append(f"GPU {names[0]}: NCCL's {gpu.generation} tables")
    else:
        assumptions.append(f"GPU {names[0]}: {gpu.generation}, {gpu.intra}"
                           f"{' with NVLS' if nvls else ''}, {gpu.intra_bandwidth / GB:g} GB/s per GPU")
    gpp = max((m.run.gpus_per_process for m in measurements if m.run is not None), default=1)
    if gpp > 1:
        assumptions.append(f"one process drove {gpp} GPUs (nccl-tests -g {gpp}): its launches are serial, which the "
                           f"fitted overhead absorbs")
    nccl = NcclSystem(gpu.generation, f"{assumed}: {names[0]}", nvls=nvls)
    topology = Topology("nccl-tests", "System inferred from nccl-tests rank lines (hosts x ranks) and GPU names.",
                        levels, nccl=nccl)
    return Inferred(topology, tuple(assumptions))
