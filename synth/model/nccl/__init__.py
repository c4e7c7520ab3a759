"""NCCL as it decides and performs: per call, the algorithm, protocol and channels NCCL picks,
and the time the call takes on the hardware, with the links it loads.

One module per concern of NCCL's source:

* `names`: NCCL's names (link kinds, transports, generations, protocols, algorithms), once;
* `system`: what NCCL runs on and is asked to do (Hardware, Network, Link, Call);
* `graph`: what NCCL's topology sees and its topology search (src/graph/topo.cc, search.cc,
  connect.cc): channels and per-channel speeds;
* `tables`: NCCL's tuning tables and its choice (src/graph/tuning.cc, src/enqueue.cc);
* `protocols`: payload shares, buffers, steps and threads;
* `chunking`: the chunk a channel moves per step (calcCollChunking) and pipeline stages;
* `transports`: what a network transport does to a call (sockets' streams, net plugins);
* `launch`: the host's share of a call (launch mode, per-call floor);
* `proxy`: the proxy thread that posts every network step of the channels crossing at a GPU;
* `versions`: what each NCCL release (2.26-2.32) changes in what the model prices;
* `symmetric`, `gin`: 2.27's symmetric-memory kernels and 2.29's hierarchical ones across NVLink domains;
* `p2p`: point-to-point as NCCL schedules it (channels per peer, LL below the per-peer
  threshold, batches and kernels, proxy posts, the NIC's message rate): the all-to-all's time;
* `timing`: the time of NCCL's choice on the hardware (`estimate`);
* `hardware`: a synth topology read as NCCL sees it (`nccl_view`, `estimate_group`);
* `backend`: the model as the costing engine's `nccl` backend.

The numeric core (system to timing) is pure: numbers in, numbers out (no topology files, no
cost engine); `hardware` builds its input from a topology, and a cost engine plugs the result
in (see `estimate`).

Two halves, kept apart on purpose because NCCL's choice is made on its own model, not on what
the hardware then does:

1. The choice, as NCCL 2.26 makes it (the tables name every constant):
   * the topology search (src/graph/search.cc ncclTopoCompute) gives each pattern (ring, tree,
     NVLS) a channel count and a per-channel speed from NCCL's speed ladder; `search` below
     replays its passes in closed form over what NCCL's topology sees (links at NCCL's own
     per-link figures, src/graph/topo.h);
   * src/graph/tuning.cc ncclTopoTuneModel turns them into a latency and a bandwidth per
     (collective, algorithm, protocol) (`tuning`), with the LL/LL128 caps, the tree and NVLS
     refinements and the enable rules (LL128 only on NVLink-class paths, NVLS with more than
     two local GPUs, NVLS tree only across nodes, PAT only with one GPU per node);
   * src/enqueue.cc topoGetAlgoInfo picks the (algorithm, protocol) of least estimated time
     (ncclTopoGetAlgoTime: latency + bytes / bandwidth, the tree correction factors, the ring
     plateau) and lowers the channel count for small calls (`choose`).
2. The time on the hardware (`estimate`): NCCL's latency for the chosen pair (NCCL measured
   those per hardware kind), plus the bytes over the bandwidth the algorithm reaches on the
   busiest resource (a GPU's intra-node links, a node's NICs), each at its line rate times the
   efficiency NCCL achieves on it (`Link.efficiency`, with its source), times the protocol's
   payload share (LL carries 4 data bytes in 8, LL128 120 in 128) and within NCCL's measured
   per-channel protocol caps (LL, LL128, and NCCL 2.28's NVLS and NVLS-tree figures; a tree
   AllReduce's at NCCL's own measured share for its size, treeCorrectionFactor:
   `tables.tree_correction`); plus, for NVLS pipelines and
   LL128 trees, the time the first chunk needs to fill them (`pipeline_stages`,
   `ll128_tree_stages`, chunks sized as src/enqueue.cc calcCollChunking sizes them). Over TCP sockets a call
   moves at most `sockets per connection x stream bandwidth` per crossing channel, whatever
   the NIC (src/transport/net_socket.cc).

The figures NCCL's source does not have (how fast links really run under NCCL, a per-call
overhead, pipeline stages of a net plugin, and per protocol the share of the modelled rate and
of NCCL's latency a call reaches: `ProtocolFigures`) are the ones `synth calibrate` fits
(synth/calibrate/nccl_fit.py). None of them moves NCCL's choice (`as_nccl_sees`): NCCL picks
from its own tables whatever its calls then achieve, so the switch points between protocols
and algorithms stay NCCL's predictions.

Units: seconds and bytes/s at the interface; NCCL's GB/s and microseconds inside the tuning.
"""

from synth._lazy import lazy_exports

# resolved on first use (synth/_lazy.py): the topology reader imports `names` alone, without the model
_EXPORTS = {
    'NCCL_VERSION': 'synth.model.nccl.names',
    'INTRA_LINK_KINDS': 'synth.model.nccl.names',
    'NETWORK_LINK_KINDS': 'synth.model.nccl.names',
    'LINK_KINDS': 'synth.model.nccl.names',
    'TRANSPORTS': 'synth.model.nccl.names',
    'GENERATIONS': 'synth.model.nccl.names',
    'PROTOCOLS': 'synth.model.nccl.names',
    'ALGORITHMS': 'synth.model.nccl.names',
    'SELECTABLE_ALGORITHMS': 'synth.model.nccl.names',
    'COLLECTIVES': 'synth.model.nccl.names',
    'Link': 'synth.model.nccl.system',
    'Network': 'synth.model.nccl.system',
    'ProtocolFigures': 'synth.model.nccl.system',
    'Hardware': 'synth.model.nccl.system',
    'Call': 'synth.model.nccl.system',
    'INTRA_KINDS': 'synth.model.nccl.system',
    'NET_KINDS': 'synth.model.nccl.system',
    'Graph': 'synth.model.nccl.graph',
    'search': 'synth.model.nccl.graph',
    'nccl_link_ratio': 'synth.model.nccl.graph',
    'nics_used': 'synth.model.nccl.graph',
    'communicator_channels': 'synth.model.nccl.graph',
    'PCI_VIEW': 'synth.model.nccl.graph',
    'Tuning': 'synth.model.nccl.tables',
    'Choice': 'synth.model.nccl.tables',
    'tuning': 'synth.model.nccl.tables',
    'as_nccl_sees': 'synth.model.nccl.tables',
    'nccl_time_us': 'synth.model.nccl.tables',
    'choose': 'synth.model.nccl.tables',
    'channels_used': 'synth.model.nccl.tables',
    'PAYLOAD': 'synth.model.nccl.protocols',
    'NET_HOP_STAGES': 'synth.model.nccl.protocols',
    'chunk_bytes': 'synth.model.nccl.chunking',
    'pipeline_stages': 'synth.model.nccl.chunking',
    'socket_streams': 'synth.model.nccl.transports',
    'host_stream_share': 'synth.model.nccl.transports',
    'socket_capacity': 'synth.model.nccl.transports',
    'launch_floor_s': 'synth.model.nccl.launch',
    'proxy_floor_s': 'synth.model.nccl.proxy',
    'Load': 'synth.model.nccl.timing',
    'Estimate': 'synth.model.nccl.timing',
    'bus_factor': 'synth.model.nccl.timing',
    'estimate': 'synth.model.nccl.timing',
    'estimate_for': 'synth.model.nccl.timing',
    'timed': 'synth.model.nccl.timing',
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

__all__ = sorted(_EXPORTS)
