"""What NCCL runs on and what it is asked to do: the hardware as NCCL sees it (links, the
network and its transport, the launch mode) and one collective call. Values only; the rest of
the package reads them."""

from __future__ import annotations

import math
from dataclasses import dataclass

from synth.model.nccl.names import DEFAULT_VERSION, COLLECTIVES, GENERATIONS, INTRA_LINK_KINDS, NETWORK_LINK_KINDS, PROTOCOLS, TRANSPORTS
from synth.model.nccl.protocols import BUFFER

INTRA_KINDS = INTRA_LINK_KINDS + ("none",)  # "none": one GPU per node
NET_KINDS = NETWORK_LINK_KINDS


@dataclass(frozen=True)
class Link:
    """A kind of link at its line rate (bytes/s per direction: per GPU inside a node, per NIC
    between nodes) and the fraction of it NCCL moves data at, with where that comes from."""

    kind: str
    bandwidth: float
    efficiency: float
    efficiency_source: str

    @property
    def achieved(self) -> float:
        return self.bandwidth * self.efficiency


@dataclass(frozen=True)
class Network:
    """How nodes reach each other: `nics` per node of `link`, NCCL's transport over them.

    `latency` is what a net plugin reports as its latency (NCCL adds it to every inter-node
    step, twice for Simple: tuning.cc:302-304). For the socket transport, each channel's
    connection is `sockets` TCP streams (NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD, one
    when the proxy thread itself sends) and each stream moves at most `stream_bandwidth`."""

    link: Link
    nics: int
    transport: str = "ib"
    gdr: bool = True
    latency_s: float = 0.0
    sockets: int = 1
    stream_bandwidth: float = math.inf
    stream_source: str = ""
    unpack: bool = False  # a net plugin whose receive side unpacks on the GPU (GPUDirect-TCPX/O)
    stages: float | None = None  # store-and-forward stages per network hop (None: NET_HOP_STAGES for NVLS trees)
    # the least time of a call that crosses this network (transports.call_floor_s: a per-cluster
    # figure, NCCL's tables have none; None: the transport kind's default, transports.CALL_FLOOR)
    floor_s: float | None = None
    message_rate: float | None = None  # messages/s one NIC processes (None: p2p.DEFAULT_MESSAGE_RATE by link kind)
    message_rate_source: str = ""
    fabric_share: float | None = None  # the NICs' share across a fabric's upper tier (fabric_share.py; None: 1)


@dataclass(frozen=True)
class ProtocolFigures:
    """What one protocol (LL, LL128, Simple) achieves on this hardware, relative to the model:
    `bandwidth` multiplies every rate a call of the protocol drains its loads at (links x
    efficiency x payload share, within NCCL's measured per-protocol ceilings), `latency`
    multiplies NCCL's own latency for the (algorithm, protocol) pair (its baseLat plus hops x
    hwLat, so the factor scales with the hops of another node count as NCCL's table does).
    1.0 is NCCL's own figure; `synth calibrate` fits them (synth/calibrate/nccl_fit.py)."""

    protocol: str
    bandwidth: float = 1.0
    latency: float = 1.0

    def __post_init__(self):
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol {self.protocol!r}: one of {', '.join(PROTOCOLS)}")
        if not (self.bandwidth > 0 and self.latency > 0):
            raise ValueError(f"protocol {self.protocol} figures must be positive")


@dataclass(frozen=True)
class Hardware:
    """A group's hardware as NCCL sees it: the GPU generation (which of NCCL's tables apply),
    the GPUs of a node and their intra-node link, the network between nodes (None: one node),
    the CPU vendor (NCCL's LL limits across nodes depend on it), whether NVLink SHARP (NVLS)
    is there, and a per-call overhead NCCL's own latency model does not have (a launcher
    driving several GPUs from one thread, a GPU time-shared by two processes)."""

    generation: str
    gpus_per_node: int
    intra: Link
    network: Network | None = None
    nvls: bool = False
    cpu: str = "intel"
    overhead_s: float = 0.0
    algorithms: tuple[str, ...] = ()  # NCCL_ALGO: the algorithms NCCL may pick (empty: all)
    protocols: tuple[str, ...] = ()  # NCCL_PROTO
    buffsize: int = BUFFER["Simple"]  # NCCL_BUFFSIZE: the Simple protocol's buffer per connection
    protocol_figures: tuple[ProtocolFigures, ...] = ()  # fitted per-protocol factors (none: NCCL's own)
    gpus_per_thread: int = 1  # GPUs one host thread launches each call on (nccl-tests -g N); 1: a process per GPU
    cuda_graphs: bool = False  # calls replayed from CUDA graphs: no per-call host launch
    min_ctas: int | None = None  # NCCL_MIN_CTAS: the fewest channels a communicator runs on (None: NCCL's 1)
    max_ctas: int | None = None  # NCCL_MAX_CTAS: the most (None: NCCL's MAXCHANNELS)
    # The call's node is a multi-node NVLink domain that it spans across hosts (NCCL's MNNVL: the
    # clique's topologies fused into one node, src/graph/topo.cc:1346-1350 in 2.26.2)
    mnnvl: bool = False
    # host time per GPU a thread launches a call on (launch.py; None: launch.LAUNCH_US_PER_GPU)
    launch_s_per_gpu: float | None = None
    # The NCCL release whose behaviour applies (names.NCCL_VERSIONS) and whether the caller
    # registers its buffers as symmetric windows (ncclCommWindowRegister, NCCL_WIN_COLL_SYMMETRIC:
    # 2.27's symmetric kernels, symmetric.py)
    version: str = DEFAULT_VERSION
    symmetric: bool = False
    ib_qps: int = 1  # NCCL_IB_QPS_PER_CONNECTION (fabric_share.py)
    cpu_cores: int | None = None  # cores the launcher binds the process to (proxy.cpu_share); None: not bound

    def protocol(self, protocol: str) -> ProtocolFigures:
        """The figures of one protocol (factors of 1 when none were given)."""
        for figures in self.protocol_figures:
            if figures.protocol == protocol:
                return figures
        return ProtocolFigures(protocol)

    def __post_init__(self):
        if self.generation not in GENERATIONS:
            raise ValueError(f"generation {self.generation!r}: one of {', '.join(GENERATIONS)}")
        if self.intra.kind not in INTRA_KINDS:
            raise ValueError(f"intra-node link kind {self.intra.kind!r}: one of {', '.join(INTRA_KINDS)}")
        if self.network is not None and self.network.transport not in TRANSPORTS:
            raise ValueError(f"transport {self.network.transport!r}: one of {', '.join(TRANSPORTS)}")


@dataclass(frozen=True)
class Call:
    """One collective call: `ranks_per_node` GPUs on each of `nodes` nodes, `nbytes` = B (the
    input of ReduceScatter, the output of AllGather, the buffer otherwise; nccl-tests' size)."""

    collective: str
    nodes: int
    ranks_per_node: int
    nbytes: float

    def __post_init__(self):
        if self.collective not in COLLECTIVES:
            raise ValueError(f"collective {self.collective!r}: one of {', '.join(COLLECTIVES)}")
        if self.nodes < 1 or self.ranks_per_node < 1:
            raise ValueError("a call needs at least one node and one rank per node")

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node
