"""An emulated hierarchical cluster on one machine: network namespaces for nodes, bridges for
switches, tc token-bucket shaping for link bandwidths, and a launcher that runs each
torch.distributed rank inside its node's namespace. It gives the synthesize-simulate-measure
loop real communication without a GPU cluster. Needs root; see docs/emulate.md.
"""

from synth.emulate.host import (EmulationError, bring_up, clusters, emulated_cluster, find_cluster,
                                require_host, tear_down)
from synth.emulate.layout import (DEFAULT_NAME, Cluster, Link, Node, auto_scale, blueprint, format_scale,
                                  parse_scale, shaped_topology)
from synth.emulate.ranks import run_ranks

__all__ = ["DEFAULT_NAME", "Cluster", "EmulationError", "Link", "Node", "auto_scale", "blueprint", "bring_up",
           "clusters", "emulated_cluster", "find_cluster", "format_scale", "parse_scale", "require_host",
           "run_ranks", "shaped_topology", "tear_down"]
