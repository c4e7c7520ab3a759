"""A topology's [device] naming a built-in accelerator takes what it leaves out from the built-in
description, and says which figures it took; another device's missing figure is named with the fix."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from synth.errors import UsageError
from synth.devices import device_named
from synth.plan.step import compute_of
from synth.topology_file import load_topology

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_topology() -> str:
    """The README's topology-file example, as a reader copies it (the indented block of its section)."""
    section = README.read_text().split("## Topology files", 1)[1]
    block = re.search(r"\n\n((?:    .*\n|\n)+)", section)[1]
    return textwrap.dedent(block)


@pytest.mark.parametrize("name", ["NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb", "A100 SXM4 40GB", "nvidia_a100_sxm4_40gb"])
def test_device_names_match_whatever_their_case_and_spelling(name):
    assert device_named(name).key == "a100-sxm4-40gb"


def test_the_readme_topology_plans_as_written(run_cli, tmp_path):
    path = tmp_path / "cluster.toml"
    path.write_text(readme_topology())
    device = load_topology(str(path)).device
    assert device.described == "a100-sxm4-40gb"
    assert device.memory.source == "datasheet"  # a stated figure stays the file's
    assert "memory_bandwidth" in device.taken and "peak.bf16" not in device.taken
    assert device.memory_bandwidth.value == 1555e9 and "built-in description a100-sxm4-40gb" in device.memory_bandwidth.source
    code, out, err = run_cli("plan", "--topology", str(path), "--model", "gpt3-1.3b", "--top", "1", "--json")
    assert code == 0, err
    assert "took memory_bandwidth" in err and "a100-sxm4-40gb" in err and len(err.strip().splitlines()) == 1
    assert "kernels timed by shape on a100-sxm4-40gb" in json.dumps(json.loads(out))


def test_a_built_in_device_may_state_only_its_name(tmp_path):
    path = tmp_path / "bare.toml"
    path.write_text('name = "bare"\n[[levels]]\nname = "gpu"\nsize = 8\n[device]\nname = "NVIDIA H100 80GB HBM3"\n')
    device = load_topology(str(path)).device
    assert device.taken[:2] == ("memory", "memory_bandwidth") and "peak.fp8" in device.taken
    assert device.memory.value == 80 * 2**30
    compute = compute_of(device, "bf16", matmul_precision="fp8")
    assert compute.kernels.device.key == "h100-sxm5-80gb"


def test_a_built_in_name_in_the_builtin_topologies_takes_nothing():
    assert load_topology("selene").device.taken == ()


def test_another_device_names_its_missing_figure_and_the_fix(tmp_path):
    path = tmp_path / "other.toml"
    path.write_text('name = "other"\n[[levels]]\nname = "gpu"\nsize = 8\n[device]\nname = "Acme X1"\n'
                    '[device.peak]\nbf16 = { value = "100 TFLOP/s", source = "s" }\n')
    with pytest.raises(UsageError, match=r"device.memory: missing; add e.g. memory = "):
        load_topology(str(path))
    path.write_text(path.read_text().replace('name = "Acme X1"\n', 'name = "Acme X1"\nmemory = { value = "8 GiB", source = "s" }\n'))
    with pytest.raises(UsageError, match=r"'Acme X1' is none of the built-in descriptions .*matmul_efficiency is missing: "
                                         r"add matmul_efficiency = "):
        compute_of(load_topology(str(path)).device, "bf16")


def test_a_device_reserve_reads_back_from_a_written_copy(tmp_path):
    from synth.topology_file import render_topology, topology_from_text

    text = readme_topology() + ('\n[device.reserve]\ncuda_context = { value = "1 GiB", source = "measured" }\n'
                                'fragmentation = { value = "5%", source = "expandable segments" }\n')
    topology = topology_from_text(text, "test")
    assert dict(topology.device.reserve)["fragmentation"].value == 0.05
    again = topology_from_text(render_topology(topology), "written")
    assert again.device.reserve == topology.device.reserve and again.device.memory == topology.device.memory
    with pytest.raises(UsageError, match=r"device.reserve.nccl_buffers: unknown key; allowed keys are cuda_context, cublas_workspace, nccl_communicator"):
        topology_from_text(text + 'nccl_buffers = { value = "1 GiB", source = "s" }\n', "test")
