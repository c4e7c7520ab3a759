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
