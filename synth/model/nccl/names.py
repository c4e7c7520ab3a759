"""NCCL's names, defined once: the link kinds a topology may give, NCCL's transports, GPU
generations (which of NCCL's tables apply), protocols and algorithms, and the NCCL version the
tables of this package are transcribed from. The topology file reader, the NCCL model and the
calibration all read them from here (no imports: the reader stays light)."""

NCCL_VERSION = "2.26.2"  # tag v2.26.2-1, the version the published InfiniBand logs this project is checked against ran

# The NCCL releases whose behaviour a topology's `[nccl] version` selects: 2.26 is the model's
# tables as transcribed (NCCL_VERSION); 2.27 adds the symmetric-memory kernels for registered
# windows (symmetric.py) and 24 NVLS channels inside one Blackwell node or NVLink domain
# (graph.nvls_channels); 2.28 prices a symmetric call's bytes in whole 1 KiB cells (symmetric.py)
# and otherwise changes nothing the model prices (the NVLS figures of its tables.NVLS_EFFICIENCY
# are read for every version: what the hardware reaches).
# PAT's enable rule (src/graph/tuning.cc ncclPatEnable: one GPU per node, no net device offload,
# sm60+) reads the same from v2.26.2 to v2.29.2, so no version moves it.
NCCL_VERSIONS = ("2.26", "2.27", "2.28")
DEFAULT_VERSION = "2.28"  # the newest documented here

INTRA_LINK_KINDS = ("nvswitch", "nvlink", "pcie")  # inside a node
NETWORK_LINK_KINDS = ("infiniband", "roce", "ethernet", "loopback")  # between nodes
LINK_KINDS = INTRA_LINK_KINDS + NETWORK_LINK_KINDS
TRANSPORTS = ("ib", "socket", "plugin")  # net_ib (verbs: InfiniBand, RoCE), net_socket (TCP), an external net plugin
GENERATIONS = ("volta", "ampere", "hopper", "blackwell")  # tuning.cc compCapIndex: <80, <90, <100, >=100
PROTOCOLS = ("LL", "LL128", "Simple")  # src/include/device.h NCCL_PROTO_*
ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")  # src/include/device.h
SELECTABLE_ALGORITHMS = ("ring", "tree", "nvls", "nvls_tree", "pat")  # what a topology's NCCL_ALGO may name (no CollNet)
COLLECTIVES = ("AllReduce", "ReduceScatter", "AllGather", "Broadcast", "Reduce")  # what the model prices


def generation_index(generation: str) -> int:
    return GENERATIONS.index(generation)
