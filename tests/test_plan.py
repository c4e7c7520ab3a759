"""synth plan: formulas against hand-worked cases and the published ones, the degree and placement
counts against direct enumeration, the ranking's invariants, the command line."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import pytest

from synth.cli import main
from synth.placement import count_placements, enumerate_placements_direct
from synth.plan import formulas
from synth.plan.costs import CommunicationCosts
from synth.plan.degrees import DegreeLimits, Degrees, enumerate_degrees, model_problem
from synth.plan.model import PRESETS, Transformer, load_model
from synth.plan.search import PlanRequest, SearchSpace, plan
from synth.plan.step import Settings, compute_of, predict
from synth.topology import Figure, Uplinks
from synth.topology_file import load_topology

TINY = Transformer("tiny", layers=1, hidden=4, heads=1, ffn=16, seq_len=2, vocab=8, micro_batch=1, global_batch=1)


# --- formulas -----------------------------------------------------------------------------------


def test_parameters_of_a_tiny_model_by_hand():
    # attention 4*12 = 48, output 16, FFN 2*4*16 = 128; biases 12 + 16 (column) + 8 (row); norms 2*8
    assert formulas.layer_shape(TINY) == formulas.LayerShape(192, 28, 24)
    # embedding 8*4, positions 2*4, final norm 8
    assert formulas.parameter_count(TINY) == 192 + 28 + 24 + 32 + 8 + 8


@pytest.mark.parametrize("name", [n for n in PRESETS if n.startswith("megatron-")])
def test_parameters_match_narayanan_eq2_and_table1(name):
    model = PRESETS[name]
    final_norm = 2 * model.hidden  # not in eq. 2
    assert formulas.parameter_count(model) - final_norm == pytest.approx(formulas.megatron_parameter_count(model), rel=1e-12)
    published = float(name.removeprefix("megatron-").rstrip("bt").replace("1t", "1008")) if name != "megatron-1t" else 1008.0
    assert formulas.parameter_count(model) / 1e9 == pytest.approx(published, abs=0.05)


def test_llama2_parameter_counts_are_the_released_ones():
    assert formulas.parameter_count(PRESETS["llama2-7b"]) == 6_738_415_616
    assert formulas.parameter_count(PRESETS["llama2-70b"]) == 68_976_648_192


def test_flops_of_a_tiny_model_by_hand():
    # per token forward: 2 * 192 weights + 4 s h = 384 + 32; 2 tokens; output layer 2 h V per token
    assert formulas.model_flops_per_step(TINY) == 3 * (2 * (384 + 32) + 2 * 2 * 4 * 8)
    assert formulas.hardware_flops_per_step(TINY, "full") == 4 * 2 * 416 + 3 * 128
    assert formulas.hardware_flops_per_step(TINY, "selective") == 3 * 2 * 416 + 2 * 32 + 3 * 128


@pytest.mark.parametrize("name", ["megatron-1.7b", "megatron-145.6b", "megatron-1t", "gpt3-175b"])
def test_flops_with_full_recomputation_are_narayanan_eq3(name):
    model = PRESETS[name]
    assert formulas.hardware_flops_per_step(model, "full") == pytest.approx(formulas.megatron_flops_per_step(model), rel=1e-12)


GPT = Transformer("gpt", layers=4, hidden=64, heads=8, ffn=256, seq_len=32, vocab=128, micro_batch=2, global_batch=8)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_activations_are_korthikanti_equations(t):
    s, b, h, a = GPT.seq_len, 2, GPT.hidden, GPT.heads
    sbh = s * b * h
    act = lambda sp, rc: formulas.layer_activation_bytes(GPT, b, t, 1, sp, rc)  # noqa: E731
    assert act(False, "none") == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))  # eq. 2
    assert act(True, "none") == pytest.approx(sbh / t * (34 + 5 * a * s / h))  # eq. 4
    assert act(True, "selective") == pytest.approx(34 * sbh / t)  # section 5
    assert act(False, "full") == pytest.approx(2 * sbh)
    assert act(True, "full") == pytest.approx(2 * sbh / t)
    if t == 1:
        assert act(False, "none") == pytest.approx(sbh * (34 + 5 * a * s / h))  # eq. 1


def test_in_flight_activations_are_L_layers_and_interleaving_factor():
    assert formulas.in_flight_layers(GPT, pp=4, virtual=1, microbatches=16) == GPT.layers
    assert formulas.in_flight_layers(GPT, pp=4, virtual=2, microbatches=16) == pytest.approx(GPT.layers * (1 + 3 / 8))
    assert formulas.in_flight_layers(GPT, pp=4, virtual=1, microbatches=2) == GPT.layers / 2  # fewer micro-batches


@pytest.mark.parametrize("precision, grads, whole, sharded", [
    ("fp16", "fp16", 20, (4, 16)), ("bf16", "fp32", 18, (6, 12)), ("fp32", "fp32", 16, (8, 8))])
def test_state_bytes_are_megatron_distributed_optimizer_table(precision, grads, whole, sharded):
    model = dataclasses.replace(GPT, precision=precision, grad_precision=grads)
    assert formulas.state_bytes_per_parameter(model, 8, False) == whole
    assert formulas.state_bytes_per_parameter(model, 8, True) == sharded[0] + sharded[1] / 8


# --- degrees and placements ----------------------------------------------------------------------


@pytest.mark.parametrize("devices", [1, 12, 64, 96, 128])
def test_degree_enumeration_equals_a_direct_one(devices):
    model = PRESETS["megatron-145.6b"]
    found = set(enumerate_degrees(devices, model, DegreeLimits(max_tp=8)))
    direct = {Degrees(dp, tp, pp) for dp, tp, pp in itertools.product(range(1, devices + 1), repeat=3)
              if dp * tp * pp == devices and tp <= 8 and model_problem(model, Degrees(dp, tp, pp)) is None}
    assert found == direct
    fixed = set(enumerate_degrees(devices, model, DegreeLimits(tp=2)))
    assert fixed == {d for d in direct if d.tp == 2}


@pytest.mark.parametrize("levels, axes", [((4, 8), (2, 4, 4)), ((2, 2, 4), (4, 4)), ((6, 4), (3, 8)), ((8, 8), (64,)),
                                          ((2, 8, 8), (4, 2, 16))])
def test_placement_count_equals_direct_enumeration(levels, axes):
    assert count_placements(levels, axes, {}, 10**6) == len(enumerate_placements_direct(levels, axes))


# --- ranking ----------------------------------------------------------------------------------------

SMALL_SPACE = SearchSpace(sequence_parallel=(False, True), recompute=("none", "full"), sharded_optimizer=(False, True))


def _request(topology, model=None, **overrides):
    model = model or PRESETS["gpt3-1.3b"]
    return PlanRequest(model, topology, compute_of(topology.device, model.precision), space=SMALL_SPACE, **overrides)


def _everything(request):
    """Every candidate predicted, without the search's pruning."""
    costs = CommunicationCosts(request.topology)
    from synth.placement import enumerate_placements

    rows = []
    for degrees in enumerate_degrees(request.topology.device_count, request.model, request.limits):
        for placement in enumerate_placements(request.topology, degrees.axes()):
            for settings in request.space.settings(request.model, degrees):
                rows.append(predict(request.model, request.compute, costs, degrees, placement, settings))
    return rows


def test_search_ranks_exactly_what_predicting_everything_ranks():
    topology = load_topology("dgx-a100-x4")
    request = _request(topology, top=15)
    result = plan(request)
    rows = _everything(request)
    fitting = sorted((row for row in rows if row.memory.peak <= request.memory_limit),
                     key=lambda r: (r.step_s, r.memory.peak, r.degrees.text, r.placement.to_text(), r.settings.text))
    assert [(r.step_s, r.placement.to_text(), r.settings) for r in result.ranked] == \
           [(r.step_s, r.placement.to_text(), r.settings) for r in fitting[:15]]
    assert result.evaluated == len(rows) == result.size.candidates
    assert result.dropped_memory == sum(row.memory.peak > request.memory_limit for row in rows)
    # the Pareto set: nothing fitting is both at least as fast and as small and strictly better in one
    for point in result.pareto:
        assert not any(r.step_s <= point.step_s and r.memory.peak <= point.memory.peak
                       and (r.step_s < point.step_s or r.memory.peak < point.memory.peak) for r in fitting)
    smallest = min(fitting, key=lambda r: (r.memory.peak, r.step_s))
    assert any(p.memory.peak == smallest.memory.peak for p in result.pareto)


def _scaled(topology, factor):
    levels = []
    for level in topology.levels:
        uplinks = level.uplinks and Uplinks(level.uplinks.count, Figure(level.uplinks.bandwidth.value * factor, "x"))
        levels.append(dataclasses.replace(level, bandwidth=Figure(level.bandwidth.value * factor, "x"), uplinks=uplinks))
    return dataclasses.replace(topology, levels=tuple(levels))


def test_more_bandwidth_is_never_slower():
    topology = load_topology("gcp-n1-v100-4x8")
    model = dataclasses.replace(PRESETS["gpt3-1.3b"], precision="fp16")
    slow, fast = plan(_request(topology, model, top=5)), plan(_request(_scaled(topology, 4.0), model, top=5))
    assert fast.ranked[0].step_s <= slow.ranked[0].step_s
    costs_slow, costs_fast = CommunicationCosts(topology), CommunicationCosts(_scaled(topology, 4.0))
    for row in slow.ranked:
        again = predict(model, slow.request.compute, costs_fast, row.degrees,
                        dataclasses.replace(row.placement), row.settings)
        assert again.step_s <= row.step_s * (1 + 1e-12)
        assert predict(model, slow.request.compute, costs_slow, row.degrees, row.placement, row.settings).step_s == row.step_s


def test_a_model_that_does_not_fit_is_never_ranked():
    topology = load_topology("dgx-a100")  # 8 x 40 GiB
    result = plan(_request(topology, PRESETS["gpt3-6.7b"], top=50))
    assert result.dropped_memory > 0
    assert all(row.memory.peak <= result.request.memory_limit for row in result.ranked + result.pareto)
    with pytest.raises(Exception, match="fits"):
        from synth.commands.plan import _nothing_fits

        huge = plan(_request(topology, PRESETS["llama2-70b"]))
        assert not huge.ranked
        raise _nothing_fits(huge)


def test_step_terms_add_up_and_dp_overlap_helps():
    topology = load_topology("dgx-a100-x4")
    model = PRESETS["gpt3-1.3b"]
    compute = compute_of(topology.device, model.precision)
    costs = CommunicationCosts(topology)
    from synth.plan.launch import published_placement

    degrees = Degrees(8, 2, 2)
    placement = published_placement(degrees, topology)
    overlapped = predict(model, compute, costs, degrees, placement, Settings(1, 2, True, "selective", False, True))
    after = predict(model, compute, costs, degrees, placement, Settings(1, 2, True, "selective", False, False))
    assert overlapped.step_s == pytest.approx(overlapped.breakdown.total)
    assert overlapped.breakdown.data_parallel <= after.breakdown.data_parallel
    assert overlapped.breakdown.pipeline_bubble == pytest.approx(
        (2 - 1) / 2 * overlapped.breakdown.compute / overlapped.microbatches / 1, rel=0.2)


# --- command line ------------------------------------------------------------------------------------


def test_plan_json_runs_and_ranks(capsys):
    assert main(["plan", "--topology", "dgx-a100-x4", "--model", "gpt3-1.3b", "--top", "3", "--recompute", "none",
                 "--zero1", "off", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    ranked = document["ranked"]
    assert len(ranked) == 3 and ranked[0]["step_s"] <= ranked[1]["step_s"] <= ranked[2]["step_s"]
    assert all(row["memory"]["peak_bytes"] <= document["memory_limit_bytes"] for row in ranked)
    first = ranked[0]
    assert math.isclose(sum(term["seconds"] for term in first["where"]), first["step_s"], rel_tol=1e-9)


def test_plan_export_writes_launch_settings(tmp_path, capsys):
    out = tmp_path / "launch.json"
    assert main(["plan", "-t", "dgx-a100-x4", "-m", "gpt3-1.3b", "--tp", "2", "--pp", "2", "--top", "1",
                 "--export", str(out)]) == 0
    document = json.loads(out.read_text())
    arguments = document["megatron"]["arguments"]
    at = arguments.index("--tensor-model-parallel-size")
    assert arguments[at:at + 4] == ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]
    assert document["megatron"]["environment"] == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert "megatron" in document and "torch_device_mesh" in document and "jax" in document


@pytest.mark.parametrize("argv, code, words", [
    (["plan", "-t", "emu-2x4", "-m", "gpt3-1.3b"], 2, "no [device] table"),
    (["plan", "-t", "selene", "-m", "gpt9"], 2, "unknown model"),
    (["plan", "-t", "selene", "-m", "gpt3-1.3b", "--budget", "0.0001"], 2, "budget"),
    (["plan", "-t", "selene", "-m", "gpt3-1.3b", "--tp", "3"], 1, "no degree choice"),
    (["plan", "-t", "dgx-a100", "-m", "llama2-70b"], 1, "fits"),
    (["plan", "-t", "selene", "-m", "gpt3-1.3b", "--inside", "model=gpu"], 2, "axes are pp, dp, ep, cp and tp"),
    (["plan", "-t", "selene", "-m", "gpt3-1.3b", "--recompute", "some"], 2, "--recompute"),
    (["plan", "-t", "selene", "-m", "gpt3-1.3b", "--resize", "rack=2"], 2, "unknown level"),
])
def test_plan_bad_input_is_one_line(argv, code, words, capsys):
    assert main(argv) == code
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err and "Traceback" not in err


def test_model_files_and_their_errors(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text('name = "m"\nlayers = 2\nhidden = 64\nheads = 4\nffn = 256\nseq_len = 128\nvocab = 1000\n'
                    'micro_batch = 1\nglobal_batch = 8\nkv_heads = 2\n')
    assert load_model(str(path)).query_groups == 2
    (tmp_path / "m.json").write_text(json.dumps(PRESETS["llama2-7b"].to_json()))
    assert load_model(str(tmp_path / "m.json")) == PRESETS["llama2-7b"]
    path.write_text('name = "m"\nlayers = 2\n')
    with pytest.raises(Exception, match="missing field 'hidden'"):
        load_model(str(path))
    path.write_text('name = "m"\nlayers = 2\nhidden = 64\nheads = 5\nffn = 256\nseq_len = 128\nvocab = 1000\n'
                    'micro_batch = 1\nglobal_batch = 8\n')
    with pytest.raises(Exception, match="not a multiple of heads"):
        load_model(str(path))


# --- workload and explore say what they leave out ------------------------------------------------------


def test_workload_separates_exposed_from_overlapped(capsys):
    from synth.analysis.workload import evaluate_workload, parse_reduction
    from synth.placement import parse_axes

    topology = load_topology("dgx-h100-2x8x8")
    axes = parse_axes("data=16,model=8")
    grads = parse_reduction("data:1GiB@overlap", ("data", "model"))
    assert grads.overlapped and grads.text == "data:1GiB@overlap"
    result = evaluate_workload(topology, axes, [grads, parse_reduction("model:64MiBx96", ("data", "model"))])
    for row in result.rows:
        assert row.exposed_s == row.terms[1].total_s and row.overlapped_s == row.terms[0].total_s
    assert [row.exposed_s for row in result.rows] == sorted(row.exposed_s for row in result.rows)
    assert main(["workload", "-t", "dgx-h100-2x8x8", "-a", "data=16,model=8", "-R", "data:1GiB@overlap",
                 "-R", "model:64MiBx96", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["exposed_s"] <= rows[-1]["exposed_s"] and "compute" in rows[0]["ignores"]
    assert main(["explore", "-t", "dgx-a100-x4", "-a", "data=8,model=4", "-r", "data", "-B", "64MiB", "--json"]) == 0
    assert "the model axis's own collectives" in json.loads(capsys.readouterr().out)[0]["ignores"]


# --- the [device] table -------------------------------------------------------------------------------

_BASE = ('name = "x"\n[[levels]]\nname = "gpu"\nsize = 2\nbandwidth = { value = "1 GB/s", source = "s" }\n'
         'latency = { value = "1 us", source = "s" }\n')


@pytest.mark.parametrize("device, words", [
    ('[device]\nname = "d"\nmemory = { value = "8 GiB", source = "s" }\n', "device.peak: missing"),
    ('[device]\nname = "d"\nmemory = { value = "8 GiB", source = "s" }\nspeed = 1\n[device.peak]\n'
     'bf16 = { value = "1 TFLOP/s", source = "s" }\n', "device.speed: unknown key"),
    ('[device]\nname = "d"\nmemory = { value = "8 GiB" }\n[device.peak]\nbf16 = { value = "1 TFLOP/s", source = "s" }\n',
     "device.memory.source: missing"),
    ('[device]\nname = "d"\nmemory = { value = "8 GiB", source = "s" }\n[device.peak]\n'
     'bf16 = { value = "1 TB/s", source = "s" }\n', "not a compute rate"),
    ('[device]\nname = "d"\nmemory = { value = "8 GiB", source = "s" }\nmatmul_efficiency = { value = "140%", source = "s" }\n'
     '[device.peak]\nbf16 = { value = "1 TFLOP/s", source = "s" }\n', "not a fraction"),
    ('[device]\nname = "d"\nmemory = { value = "8 GiB", source = "s" }\n[device.peak]\n'
     'fp4 = { value = "1 TFLOP/s", source = "s" }\n', "device.peak.fp4: unknown key"),
])
def test_device_table_errors_name_the_field(tmp_path, device, words):
    from synth.errors import UsageError

    path = tmp_path / "t.toml"
    path.write_text(_BASE + device)
    with pytest.raises(UsageError, match=words.replace(".", r"\.")):
        load_topology(str(path))


def test_device_tables_of_builtins_read_back_exactly():
    from synth.topology_file import _parse_topology, builtin_topology_names, render_topology

    with_device = 0
    for name in builtin_topology_names():
        topology = load_topology(name)
        again = _parse_topology(render_topology(topology), "copy", None)
        assert again.device == topology.device
        with_device += topology.device is not None
        if topology.device is not None:
            assert all(figure.source for _, figure in topology.device.peak)
            # a built-in device description (kernel model) or a stated matmul efficiency with its source
            from synth.devices import device_named

            assert device_named(topology.device.name) is not None or topology.device.matmul_efficiency.source
    assert with_device >= 6
