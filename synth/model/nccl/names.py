"""NCCL's names, defined once: the link kinds a topology may give, NCCL's transports, GPU
generations (which of NCCL's tables apply), protocols and algorithms, and the NCCL version the
tables of this package are transcribed from. The topology file reader, the NCCL model and the
calibration all read them from here (no imports: the reader stays light)."""

NCCL_VERSION = "2.26.2"  # tag v2.26.2-1, the version the published InfiniBand logs this project is checked against ran

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
