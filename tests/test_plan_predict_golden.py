"""The step model's figures, kept bit for bit: every field of `predict`'s answer (step, breakdown,
memory, routes) over dense and MoE models, three systems, both compute paths (kernels timed by
shape and a stated matmul efficiency) and every setting the search tries (ZeRO-3 and HSDP too),
against the figures recorded in tests/data/predict_golden.json.

A change to the step model that moves a figure is either a named bug fix (rewrite the record
with `python -m tests.test_plan_predict_golden` and say so in the commit) or a regression.
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from pathlib import Path

import pytest

from synth.commands.plan import resize as resized
from synth.plan.costs import CommunicationCosts
from synth.plan.degrees import Degrees
from synth.plan.launch import published_placement
from synth.plan.model import PRESETS
from synth.plan.search import SearchSpace
from synth.plan.step import compute_of, predict
from synth.topology_file import load_topology

RECORD = Path(__file__).parent / "data" / "predict_golden.json"
SPACE = SearchSpace(zero_stages=(1, 2, 3), hsdp=(False, True))

# (model, topology, resize, global batch, efficiency or None (kernels), degrees dp, tp, pp, cp, ep)
CASES = (
    ("gpt3-175b", "selene", "node=64", 512, None, (8, 8, 8, 1, 1)),
    ("gpt3-175b", "selene", "node=64", 512, 0.5, (16, 4, 8, 1, 1)),
    ("llama2-70b", "dgx-h100-2x8x8", "", 64, None, (16, 8, 1, 1, 1)),
    ("llama2-70b", "dgx-h100-2x8x8", "", 64, None, (4, 4, 4, 2, 1)),
    ("llama2-7b", "dgx-h100-2x8x8", "", 128, None, (128, 1, 1, 1, 1)),
    ("mixtral-8x7b", "dgx-h100-2x8x8", "", 64, None, (32, 2, 2, 1, 8)),
    ("mixtral-8x7b", "dgx-h100-2x8x8", "", 64, None, (16, 8, 1, 1, 4)),
    ("mixtral-8x7b", "dgx-h100-2x8x8", "", 64, 0.45, (64, 1, 2, 1, 8)),
    ("qwen3-30b-a3b", "dgx-h100-2x8x8", "", 128, None, (64, 1, 2, 1, 16)),
    ("deepseek-v3", "dgx-h100-2x8x8", "", 64, None, (16, 2, 4, 1, 16)),
    ("gpt-oss-120b", "gb200-nvl72", "", 72, None, (36, 2, 2, 1, 4)),
)


@cache
def _system(name: str, resize: str):
    topology = load_topology(name)
    if resize:
        topology = resized(topology, resize)
    return topology, CommunicationCosts(topology)


def _predictions(case):
    model_name, topology_name, resize, batch, efficiency, (dp, tp, pp, cp, ep) = case
    topology, costs = _system(topology_name, resize)
    model = dataclasses.replace(PRESETS[model_name], global_batch=batch)
    compute = compute_of(topology.device, model.precision, efficiency)
    degrees = Degrees(dp, tp, pp, cp, ep)
    placement = published_placement(degrees, topology)
    for settings in SPACE.settings(model, degrees, compute.host_bandwidth is not None):
        for data_parallel in (True, False):
            yield settings, data_parallel, predict(model, compute, costs, degrees, placement, settings, data_parallel)


def _figures(settings, data_parallel, prediction) -> dict:
    return {"settings": settings.text, "data_parallel": data_parallel, "step_s": prediction.step_s,
            "microbatches": prediction.microbatches, "breakdown": prediction.breakdown.to_json(),
            "memory": prediction.memory.to_json(),
            "routes": [[r.name, r.program, r.levels, r.time_s, r.calls, r.bytes, list(r.axes)]
                       for r in prediction.routes],
            "flops": [prediction.model_flops, prediction.hardware_flops]}


def _case_id(case) -> str:
    model_name, topology_name, resize, batch, efficiency, degrees = case
    return f"{model_name}@{topology_name}{resize and ':' + resize}/b{batch}/{'eff' if efficiency else 'kernels'}/" \
           + "x".join(map(str, degrees))


def observed(case) -> list[dict]:
    return [_figures(*answer) for answer in _predictions(case)]


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_predict_is_unchanged_bit_for_bit(case):
    recorded = json.loads(RECORD.read_text())[_case_id(case)]
    now = observed(case)
    assert len(now) == len(recorded) > 0
    for got, want in zip(now, recorded):
        assert got == want, (got["settings"], got["data_parallel"])


if __name__ == "__main__":
    RECORD.write_text(json.dumps({_case_id(case): observed(case) for case in CASES}, separators=(",", ":")) + "\n")
