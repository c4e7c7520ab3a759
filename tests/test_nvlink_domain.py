"""NVLink domains that span hosts (GB200 NVL72): the file key, NCCL's view of the domain as one
node (multi-node NVLink), and the built-in 2026 systems planning end to end."""

from __future__ import annotations

import json

import pytest

from synth.errors import UsageError
from synth.model.nccl.hardware import call_for, estimate_group, nccl_view
from synth.topology_file import load_topology, render_topology, topology_from_text

GB200 = "gb200-nvl72"
B200 = "aws-p6-b200-2x8"


def _domain_file(inner_link: str = "nvswitch", domain_link: str = "nvswitch") -> str:
    figure = 'bandwidth = { value = "900 GB/s", source = "s" }\nlatency = { value = "3 us", source = "s" }'
    return f"""name = "d"
[[levels]]
name = "rack"
size = 2
bandwidth = {{ value = "400 Gb/s", source = "s" }}
latency = {{ value = "10 us", source = "s" }}
link = {{ kind = "infiniband", source = "s" }}
[[levels]]
name = "tray"
size = 3
nvlink_domain = true
{figure}
link = {{ kind = "{domain_link}", source = "s" }}
[[levels]]
name = "gpu"
size = 4
{figure}
link = {{ kind = "{inner_link}", source = "s" }}
"""


def test_a_domain_is_one_nccl_node_across_its_hosts():
    topology = load_topology(GB200)
    view = nccl_view(topology)
    assert topology.levels[1].nvlink_domain and view.domain_level == 1
    assert view.hardware.gpus_per_node == 72  # NCCL fuses the rack's 18 trays into one node
    inside = list(range(8))  # two trays of one rack
    hardware, call = call_for(topology, view, inside, "AllReduce", 1 << 20)
    assert (call.nodes, call.ranks_per_node, hardware.mnnvl) == (1, 8, True)
    hardware, call = call_for(topology, view, list(range(4)), "AllReduce", 1 << 20)  # one tray: one host
    assert (call.nodes, hardware.mnnvl) == (1, False)
    _, call = call_for(topology, view, [0, 72], "AllReduce", 1 << 20)  # across racks: the network
    assert call.nodes == 2


def test_a_call_across_trays_runs_at_nvlink_rates_and_across_racks_on_the_network():
    topology = load_topology(GB200)
    trays = estimate_group(topology, list(range(8)), "AllReduce", 64 << 20)
    tray = estimate_group(topology, list(range(4)), "AllReduce", 64 << 20)
    racks = estimate_group(topology, [0, 4, 72, 76], "AllReduce", 64 << 20)
    assert trays.bottleneck != "net" and "net" not in {load.resource for load in trays.loads}
    assert trays.time_s < 2 * tray.time_s  # NVLink across the trays, not the NICs
    assert racks.time_s > 3 * trays.time_s  # the 400 Gb/s NICs between racks


def test_the_key_is_checked_and_written_back():
    topology = topology_from_text(_domain_file(), "d.toml")
    assert [level.nvlink_domain for level in topology.levels] == [False, True, False]
    again = topology_from_text(render_topology(topology), "again.toml")
    assert again.levels == topology.levels
    with pytest.raises(UsageError, match="nvlink_domain.*nvswitch"):
        topology_from_text(_domain_file(domain_link="pcie"), "d.toml")
    with pytest.raises(UsageError, match="inside the NVLink domain"):
        topology_from_text(_domain_file(inner_link="ethernet"), "d.toml")


@pytest.mark.parametrize("name", [GB200, B200])
def test_the_2026_systems_are_blackwell_with_sourced_devices(name):
    topology = load_topology(name)
    assert topology.nccl.generation == "blackwell" and topology.nccl.nvls
    assert topology.device is not None and topology.device.peak_for("bf16").value >= 2.2e15
    for level in topology.levels:
        for figure in (level.bandwidth, level.latency, level.link):
            assert figure is not None and figure.source.strip()


@pytest.mark.parametrize("name", [GB200, B200])
def test_the_2026_systems_plan(run_cli, name):
    code, out, err = run_cli("plan", "--topology", name, "--model", "llama2-7b", "--top", "1", "--json")
    assert code == 0, err
    assert json.loads(out)


@pytest.mark.parametrize("name", [GB200, B200])
def test_the_device_tables_agree_with_the_datasheets(name):
    from synth.plan.datasheets import datasheet_named

    topology = load_topology(name)
    sheet = datasheet_named(topology.device.name)
    assert sheet is not None
    assert topology.device.memory.value == sheet.memory.value
    assert topology.device.memory_bandwidth.value == sheet.memory_bandwidth.value
    for precision, figure in topology.device.peak:
        assert figure.value == pytest.approx(sheet.peak_for(precision).value)
    assert topology.levels[-1].bandwidth.value == sheet.nvlink.value


def test_every_datasheet_figure_has_a_source_and_a_dense_bf16_peak():
    from synth.plan.datasheets import DATASHEETS

    assert {sheet.key for sheet in DATASHEETS} == {"b200", "b300", "gb200", "gb300", "h200", "h20"}
    for sheet in DATASHEETS:
        figures = [figure for _, figure in sheet.peak] + [sheet.memory, sheet.memory_bandwidth, sheet.nvlink]
        assert all(figure.value > 0 and figure.source.strip() for figure in figures)
        assert sheet.peak_for("bf16").value == sheet.peak_for("fp16").value


def test_the_plan_says_whether_tensor_parallel_groups_leave_the_domain(run_cli):
    code, out, err = run_cli("plan", "--topology", GB200, "--model", "llama2-7b", "--top", "1", "--tp", "4")
    assert code == 0, err
    assert "tensor-parallel groups stay inside one NVLink domain (tray x gpu, 72 GPUs)" in out
    code, out, err = run_cli("plan", "--topology", GB200, "--model", "llama2-7b", "--top", "1", "--tp", "16")
    assert code == 0, err
    assert "tensor-parallel groups span more than one NVLink domain" in " ".join(out.split())
