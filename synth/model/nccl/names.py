"""NCCL's names, defined once: the link kinds a topology may give, NCCL's transports, GPU
generations (which of NCCL's tables apply), protocols and algorithms, and the NCCL version the
tables of this package are transcribed from. The topology file reader, the NCCL model and the
calibration all read them from here (no imports: the reader stays light)."""

NCCL_VERSION = "2.26.2"  # tag v2.26.2-1, the version the published InfiniBand logs this project is checked against ran

# The NCCL releases whose behaviour a topology's `[nccl] version` selects (what each changes,
# with its source: versions.py); the default is the newest documented. 2.26 is the model's
# tables as transcribed (NCCL_VERSION).
NCCL_VERSIONS = ("2.26", "2.27", "2.28", "2.29", "2.30", "2.31", "2.32")
DEFAULT_VERSION = "2.32"  # the newest documented here

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

# NCCL_ALGO's spellings (NCCL user guide, NCCL_ALGO: not case sensitive) of the algorithms above
ALGORITHM_SETTING_NAMES = {"tree": "tree", "ring": "ring", "collnetdirect": "collnet_direct",
                           "collnetchain": "collnet_chain", "nvls": "nvls", "nvlstree": "nvls_tree", "pat": "pat"}


def algorithms_of_setting(text: str, collective: str) -> tuple[str, ...] | None:
    """The selectable algorithms an NCCL_ALGO value leaves `collective` (NCCL user guide:
    a comma-separated list, `^` in front to exclude instead; from 2.24 per collective,
    `allreduce:tree,ring;broadcast:ring`). None: a name NCCL does not know, so the value
    cannot be read; an empty tuple: the value leaves only algorithms the model has not
    (CollNet) or none at all."""
    chosen = text.strip().strip("'\"")
    if ":" in chosen:
        wanted = [item.split(":", 1)[1] for item in chosen.split(";")
                  if ":" in item and item.split(":", 1)[0].strip().lower() == collective.lower()]
        if not wanted:
            return SELECTABLE_ALGORITHMS  # the setting leaves this collective NCCL's default
        chosen = wanted[-1]
    exclude = chosen.startswith("^")
    names = [name.strip().lower() for name in chosen.lstrip("^").split(",") if name.strip()]
    if any(name not in ALGORITHM_SETTING_NAMES for name in names):
        return None
    named = {ALGORITHM_SETTING_NAMES[name] for name in names}
    if exclude:
        return tuple(a for a in SELECTABLE_ALGORITHMS if a not in named)
    return tuple(a for a in SELECTABLE_ALGORITHMS if a in named)
