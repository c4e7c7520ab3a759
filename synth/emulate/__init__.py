"""An emulated hierarchical cluster on one machine: network namespaces for nodes, bridges for
switches, tc token-bucket shaping for link bandwidths, and a launcher that runs each
torch.distributed rank inside its node's namespace. It gives the synthesize-simulate-measure
loop real communication without a GPU cluster. Needs root; see docs/emulate.md.

The library face is a context manager and a launcher:

    from synth.emulate import cluster_launcher, emulated_cluster

    with emulated_cluster("emu-2x4", scale=1/64) as cluster:      # up, and down on the way out
        result = cluster_launcher(cluster)(script, cluster.device_count, ["--backend", "gloo"])

`use_cluster` does the same but reuses a cluster that is already up; `bring_up`/`tear_down`
are the two halves for a cluster that outlives the program (what `synth emulate` does).
"""

from synth.emulate.host import (ClusterInUse, EmulationError, UnreadableState, bring_up, clusters, emulated_cluster,
                                find_cluster, recorded, require_host, tear_down, use_cluster)
from synth.emulate.layout import (DEFAULT_NAME, Cluster, Link, Node, auto_scale, blueprint, format_scale,
                                  parse_scale, shaped_topology)
from synth.emulate.ranks import Launcher, cluster_launcher, run_ranks

__all__ = ["DEFAULT_NAME", "Cluster", "ClusterInUse", "EmulationError", "Launcher", "Link", "Node", "UnreadableState",
           "auto_scale", "blueprint", "bring_up", "cluster_launcher", "clusters", "emulated_cluster", "find_cluster",
           "format_scale", "parse_scale", "recorded", "require_host", "run_ranks", "shaped_topology", "tear_down",
           "use_cluster"]
