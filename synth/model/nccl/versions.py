"""NCCL by release: from which version each behaviour the model prices applies, with where
NCCL documents it, so a topology's `[nccl] version` (2.26 to 2.32) selects the behaviour and
the flat call a program is compared with is the flat call of that release.

What each release changes in what the model prices (source: the release's tag in
NVIDIA/nccl and its release notes; nothing priced without one):

* 2.26: the transcribed tables (tables.py, v2.26.2);
* 2.27: symmetric-memory kernels for registered windows inside one node or NVLink domain
  (symmetric.py, v2.27.3 src/symmetric.cc); 24 NVLS channels for a Blackwell communicator in
  one node or domain (graph.nvls_channels, v2.27.3 src/transport/nvls.cc);
* 2.28: Blackwell's per-channel caps retuned (tables.per_channel_caps: v2.28.9 tuning.cc tree
  70/42.8/24, tree LL128 55.6/31.67/20, ring LL128 73.4/34.6/73.4, NVLS tree beyond two nodes
  43.8 GB/s; 2.29.7 ring LL128 40; 2.30.7 NVLS tree 80 again);
  symmetric calls counted in whole 1 KiB cells (v2.28.3 src/include/sym_kernels.h);
  copy-engine AllToAll/Gather/Scatter, only with NCCL_CTA_POLICY_ZERO (not priced: NCCL has no
  time model for them, see below);
* 2.29: the hierarchical symmetric kernels for a communicator that spans NVLink domains
  (gin.py: ReduceScatter_RailA2A_LsaLD/LDMC, a rail all-to-all over GPU-initiated networking
  then a reduction inside the domain, and AllGather_RailRing_LsaSTMC; v2.29.7
  src/sym_kernels.cc queryModel_gin), with registered buffers and a GIN-capable network
  (2.29 is priced as its last patch, 2.29.7; 2.29.2 had only a hierarchical AllGather,
  AllGather_GinHier_MCRing, and no hierarchical ReduceScatter);
* 2.30: the same kernels retuned (v2.30.7 src/sym_kernels.cc: per-SM rates and a 128 KiB
  chunk for the reduce-scatter); hierarchical copy-engine AllGather/AllToAll across nodes,
  only with NCCL_CTA_POLICY_ZERO (v2.30.7 src/ce_coll.cc ncclHierCeAvailable; not priced);
* 2.31: per-call `ncclCollConfig_t` (algorithm selection, min/max CTAs): nothing NCCL picks
  by itself changes (release notes 2.31.2); `synth tune` writes these values;
* 2.32: a pipeline-based cost model with tuning data for Vera Rubin only (release notes
  2.32.6); the model has no Rubin generation, so Hopper and Blackwell are priced as 2.31.
  The 2.31 and 2.32 sources are not in the public snapshot read here: their Hopper and
  Blackwell behaviour is assumed that of v2.30.7, as their release notes name no change to it.

Read but not priced (no figure in NCCL's source to price them with, or outside the model):
the copy-engine paths (2.28-2.30: taken on request, NCCL_CTA_POLICY_ZERO, or for a registered
AllGather above NCCL_SYM_CE_THRESHOLD = 8M elements on Blackwell, enqueue.cc, timed by no model
of NCCL's); the TMA symmetric kernels of 2.30. Before 2.28 NCCL had no NVLS-tree cap; the
model keeps 2.30's there (as it did), so 2.26 stays reproducible.
PAT's enable rule (tuning.cc ncclPatEnable: one GPU per node, no net device offload, sm60+)
and its latency read the same from v2.26.2 to v2.30.7, and NVLS still needs CollNet for
ReduceScatter/AllGather across nodes (v2.30.7 tuning.cc), so no version moves them. NVLS
inside a multi-node NVLink domain is NVLS inside one node as NCCL sees it (topo.cc fuses the
domain's hosts since 2.26).
"""

from __future__ import annotations

from synth.model.nccl.names import DEFAULT_VERSION, NCCL_VERSIONS

SYMMETRIC_SINCE = (2, 27)
CELLS_SINCE = (2, 28)
HIERARCHICAL_SINCE = (2, 29)  # v2.29.7 sym_kernels.cc: ReduceScatter_RailA2A_*, AllGather_RailRing_LsaSTMC
HIERARCHICAL_RETUNED_SINCE = (2, 30)  # v2.30.7 sym_kernels.cc getSmBw_ReduceScatter_RailA2A, RS chunk
COLL_CONFIG_SINCE = (2, 31)  # release notes 2.31.2: ncclCollConfig_t and nccl*Config


def version_tuple(version: str) -> tuple[int, int]:
    """(major, minor) of a version such as "2.29" or "2.29.7"."""
    parts = tuple(int(part) for part in version.split("."))
    return parts[0], parts[1]


def at_least(version: str, since: tuple[int, int]) -> bool:
    return version_tuple(version) >= since


__all__ = ["NCCL_VERSIONS", "DEFAULT_VERSION", "SYMMETRIC_SINCE", "CELLS_SINCE", "HIERARCHICAL_SINCE",
           "HIERARCHICAL_RETUNED_SINCE", "COLL_CONFIG_SINCE", "version_tuple", "at_least"]
