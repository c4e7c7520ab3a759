"""`synth export --format mesh --collective ...`: where a goal's blocks go on the framework
meshes. The JAX axis order it names is checked for real: on 8 forced host CPU devices laid out
by the export's own `jax_mesh`, psum_scatter over that order (and over no other) leaves block r
of each reduction group's sum on its member r; where it names none, no order does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PLACEMENTS = {  # name: (levels, axes, reduce, placement, the JAX order the export must name)
    "one-axis": ("node=2,gpu=4", "dp=2,tp=4", "dp", "[[2,1],[1,4]]", ["dp"]),
    "two-axes": ("node=2,gpu=4", "a=4,c=2", "a,c", "[[1,4],[2,1]]", ["c", "a"]),
    "split-axis": ("node=2,gpu=4", "c=2,a=4", "a,c", "[[1,2],[2,2]]", None),
}


def export(run_cli, tmp_path, name, goal) -> dict:
    levels, axes, reduce, placement, _ = PLACEMENTS[name]
    target = tmp_path / f"{name}-{goal}.json"
    code, _, err = run_cli("export", "--levels", levels, "--axes", axes, "--reduce", reduce, "--placement", placement,
                           "--collective", goal, "--format", "mesh", "-o", str(target))
    assert code == 0, err
    return json.loads(target.read_text())


@pytest.mark.parametrize("name", sorted(PLACEMENTS))
def test_the_mesh_names_the_block_order_of_each_goal(run_cli, tmp_path, name):
    expected = PLACEMENTS[name][4]
    for goal, call in (("reducescatter", "psum_scatter"), ("allgather", "all_gather"), ("alltoall", "all_to_all")):
        layout = export(run_cli, tmp_path, name, goal)["collective"]
        assert layout["name"] == goal and layout["torch"]["in_rank_order"]
        assert layout["jax"]["axis_name"] == expected
        assert (call in layout["jax"]["statement"]) == (expected is not None)
    for goal in ("broadcast", "reduce"):
        layout = export(run_cli, tmp_path, name, goal)["collective"]
        assert "lowest global rank" in layout["root"] and layout["jax"]["axis_name"] is None
        assert "no JAX counterpart" in layout["jax"]["statement"]
    assert "collective" not in export(run_cli, tmp_path, name, "allreduce")  # unchanged for the default


def test_a_goal_without_reduce_axes_is_refused(run_cli, tmp_path):
    code, _, err = run_cli("export", "--levels", "node=2,gpu=4", "--axes", "dp=2,tp=4", "--placement", "[[2,1],[1,4]]",
                           "--collective", "alltoall", "--format", "mesh", "-o", str(tmp_path / "m.json"))
    assert code == 2 and "give the axes it runs over with --reduce" in err


CHECK = r"""
import itertools, json, sys
import numpy as np
import jax, jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

document = json.loads(sys.argv[1])
spec = document["jax_mesh"]
perm, names = spec["device_permutation"], tuple(spec["axis_names"])
mesh = Mesh(np.array(jax.devices())[perm].reshape(spec["shape"]), names)
groups = document["reduction_groups"]
n, chunk = len(groups[0]), 2
data = np.stack([(np.arange(n * chunk) * 7 + rank * 13) % 19 - 9 for rank in range(8)]).astype(np.float32)
x = jnp.asarray(data[perm].reshape(-1))  # mesh position i holds rank perm[i]'s buffer
want = {}
for group in groups:
    total = sum(data[rank] for rank in group)
    for member, rank in enumerate(group):
        want[rank] = total[member * chunk:(member + 1) * chunk]
reduced = [axis for axis in document["reduce"] if spec["shape"][names.index(axis)] > 1]
matching = []
for order in itertools.permutations(reduced):
    body = lambda v, order=order: jax.lax.psum_scatter(v, tuple(order), scatter_dimension=0, tiled=True)
    got = np.asarray(jax.shard_map(body, mesh=mesh, in_specs=P(names), out_specs=P(names))(x)).reshape(8, chunk)
    if all(np.array_equal(got[position], want[rank]) for position, rank in enumerate(perm)):
        matching.append(list(order))
print(json.dumps(matching))
"""


def test_jax_lays_blocks_out_in_member_order_exactly_over_the_named_axis_order(run_cli, tmp_path):
    pytest.importorskip("jax", reason="jax is not installed (pip install jax; it is in the test extra)")
    environment = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    for name in PLACEMENTS:
        document = export(run_cli, tmp_path, name, "reducescatter")
        result = subprocess.run([sys.executable, "-c", CHECK, json.dumps(document)], capture_output=True, text=True,
                                env=environment, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        matching = json.loads(result.stdout.strip().splitlines()[-1])
        named = document["collective"]["jax"]["axis_name"]
        assert matching == ([] if named is None else [named]), name
