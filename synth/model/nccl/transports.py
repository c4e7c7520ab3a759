"""NCCL's network transports as they bound a call (src/transport/net_socket.cc, net_ib.cc, net
plugins): TCP streams per connection and their share of a multi-GPU host."""

from __future__ import annotations

from synth.model.nccl.system import Call, Hardware

# src/transport/net_socket.cc:124-130, 279-330: socket transport defaults.
SOCKET_MAX_SOCKETS = 64
SOCKET_MAX_THREADS = 16
SOCKET_AUTO = {"aws": (2, 8), "gcp": (4, 1), "other": (0, 1)}  # (threads, sockets per thread) by NIC vendor
SOCKET_MIN_TASK = 64 * 1024  # MIN_CHUNKSIZE: a request is split over the sockets in tasks of at least this
SOCKET_DEFAULT_SPEED_GBPS = 10.0  # net_socket.cc:96-98: no /sys/class/net/<dev>/speed (loopback): 10 Gbps


def socket_capacity(hardware: Hardware, call: Call, channels: int) -> float:
    """Bytes/s a node's traffic can leave it over TCP: every channel crossing the node boundary
    is one connection of `sockets` streams (net_socket.cc:279-330, 557), each at most
    `stream_bandwidth` when one GPU of the host is in the call, and that shared by the host's
    GPUs in the call otherwise (`host_stream_share`)."""
    network = hardware.network
    return channels * max(1, network.sockets) * network.stream_bandwidth * host_stream_share(call)


def host_stream_share(call: Call) -> float:
    """The share of a TCP stream's rate one connection gets when `ranks_per_node` GPUs of a host
    are in the call. Sockets move host memory (no GPUDirect): every GPU of the call has a proxy
    thread on the host that polls its connections and, on the channels that cross, copies each
    step between the GPU's FIFO and the socket through the host's one TCP stack (and, in a
    VM, its one virtual NIC's queues). The host's per-flow work is shared by all of them, so a
    stream moves 1/ranks_per_node of what it moves with one GPU per host. NVIDIA/nccl#209
    (GCP N1, 8 V100 per VM, 32 Gb/s): one GPU per VM reaches the line (2 x 1, 8 streams per
    connection: 31 Gb/s busbw; 4 x 1, 16 streams: 30.8), 8 GPUs per VM do not (2 x 8, 4
    streams: 14.7 Gb/s; 4 x 8, 12 streams: 22.5), which no per-stream rate alone gives."""
    return 1.0 / max(1, call.ranks_per_node)


def socket_streams(vendor: str, threads: int | None = None, sockets_per_thread: int | None = None) -> int:
    """Streams per connection NCCL's socket transport opens (ncclNetSocketGetNsockNthread):
    NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD, auto-detected by NIC vendor (AWS ENA 2 x 8,
    GCP gVNIC 4 x 1, else none: the proxy thread sends on its one control socket), at most 64."""
    auto_threads, auto_sockets = SOCKET_AUTO.get(vendor, SOCKET_AUTO["other"])
    threads = auto_threads if threads is None else min(threads, SOCKET_MAX_THREADS)
    sockets_per_thread = auto_sockets if sockets_per_thread is None else sockets_per_thread
    if threads * sockets_per_thread > SOCKET_MAX_SOCKETS:
        sockets_per_thread = SOCKET_MAX_SOCKETS // threads
    return max(1, threads * sockets_per_thread)


# The least time of a call that crosses a network, per NCCL transport kind, where the cluster's
# topology gives none (Network.floor_s, fitted by synth calibrate). NCCL's own transports have no
# such floor: their costs are in NCCL's tables (src/graph/tuning.cc baseLat, hwLat[NET] and the
# per-step net overhead), and net_ib reports no latency of its own (net_ib.cc getProperties:
# "props->latency = 0; // Not set"). A net plugin's per-call costs (its request posting, its own
# progress thread, the receive-side unpack of GPUDirect-TCPX/O) are not in NCCL's tables, and no
# plugin documents a figure for them: aws-ofi-nccl reports only a per-message latency, which NCCL
# adds to every network step (src/platform-aws.cpp platform_data_map: 75 us on p4d/p5/p5e, 35 us on
# p5en and P6; the transport's `latency`); gIB and the TCPX plugins report none. So the default is
# NCCL's own (none), and the floor of a plugin cluster is a figure to measure: `synth calibrate`
# fits it from a run's smallest calls.
CALL_FLOOR = {
    "ib": (0.0, "NCCL's net_ib: its costs are in NCCL's tables (tuning.cc), it reports no latency (net_ib.cc)"),
    "socket": (0.0, "NCCL's net_socket: its costs are in NCCL's tables and the TCP streams' rate (net_socket.cc; it "
                    "reports no latency of its own): NCCL's own (none) until synth calibrate fits a host's"),
    "plugin": (0.0, "no net plugin documents a per-call cost (aws-ofi-nccl reports a per-step latency only, "
                    "platform-aws.cpp; gIB and TCPX none): NCCL's own (none) until synth calibrate fits one"),
}


def call_floor_s(hardware: Hardware, call: Call) -> float:
    """The least time of a call that crosses the network: the cluster's figure, else the
    transport kind's default (CALL_FLOOR); 0 for a call inside one node."""
    network = hardware.network
    if network is None or call.nodes < 2:
        return 0.0
    if network.floor_s is not None:
        return network.floor_s
    return CALL_FLOOR[network.transport][0]
