"""NCCL_MIN_CTAS / NCCL_MAX_CTAS bound the channels of every communicator (src/graph/connect.cc
:480-484: keep the first maxCTAs channels, then duplicate them up to minCTAs; src/transport/
nvls.cc:178 bounds the NVLS channels alike). Cases worked out by hand from NCCL 2.26.2."""

from __future__ import annotations

from dataclasses import replace

import pytest

from synth.model.nccl import Call, Hardware, Link, Network, estimate, tuning
from synth.topology_file import _parse_topology, load_topology, render_topology

GB = 1e9
NVLINK4 = Link("nvswitch", 450 * GB, 0.824, "topo.h SM90_NVLINK_BW")
IB400 = Network(Link("infiniband", 50 * GB, 0.96, "search.cc ladder"), 8)
HGX = Hardware("hopper", 8, NVLINK4, IB400, nvls=True)


def test_min_ctas_duplicates_channels_and_the_proxy_drives_them_all():
    """2 x 8 H100: 16 channels by default (8 ring channels at 48 GB/s doubled); NCCL_MIN_CTAS=24
    makes 24, NVLS 24 (16 by default). Ring/LL128 AllReduce of 1 MiB on 24 channels: the busiest
    proxy posts ceil(2 x 24 / 8) = 6 operations per step over 30 steps, 1 us each: floor
    14 + 180 = 194 us (the 24-CTA run of NVIDIA/nccl-tests#309 measured 154 us)."""
    call = Call("AllReduce", 2, 8, 1 << 20)
    assert (tuning(HGX, call).channels, tuning(HGX, call).nvls_channels) == (16, 16)
    wide = replace(HGX, min_ctas=24)
    assert (tuning(wide, call).channels, tuning(wide, call).nvls_channels) == (24, 24)
    ring = replace(wide, algorithms=("ring",), protocols=("LL128",))
    e = estimate(ring, call)
    assert e.choice.channels == 24 and e.time_s == pytest.approx(194e-6)


def test_max_ctas_keeps_the_first_channels():
    call = Call("AllReduce", 2, 8, 1 << 20)
    narrow = replace(HGX, max_ctas=8)
    assert (tuning(narrow, call).channels, tuning(narrow, call).nvls_channels) == (8, 8)
    assert tuning(replace(HGX, min_ctas=100), call).channels == 64  # MAXCHANNELS


def test_the_topology_file_states_them_and_reads_them_back():
    topology = load_topology("hgx-h100-ib-4x8")
    stated = replace(topology, nccl=replace(topology.nccl, min_ctas=24, max_ctas=32))
    again = _parse_topology(render_topology(stated), "copy", None)
    assert (again.nccl.min_ctas, again.nccl.max_ctas) == (24, 32)
    assert (load_topology("hgx-h100-ib-4x8").nccl.min_ctas, topology.nccl.max_ctas) == (None, None)
