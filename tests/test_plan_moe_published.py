"""Every built-in MoE model plans at its published training layout (issue: `synth plan` plans
DeepSeek-V3 and every built-in MoE model at their published degrees). Each case pins the
published degrees and asks for one plan: it must exist, with a finite step time and a peak
memory within the device's. Layouts whose expert groups span tensor or context-parallel ranks
(Megatron's expert_tensor_parallel_size, expert parallelism wider than data parallelism, or
with context parallelism) are planned with MoE parallel folding (synth/plan/folding.py)."""

from __future__ import annotations

import json
import math

import pytest

from synth.cli import main

H100 = "dgx-h100-2x8x8"  # 2 racks x 8 nodes x 8 H100; --resize scales it

# (model, resize, flags, source of the degrees)
PUBLISHED = [
    ("deepseek-v3", "rack=32",
     ["--dp", "128", "--tp", "1", "--pp", "16", "--ep", "64", "--recompute", "full", "--zero1", "on",
      "--virtual-stages", "1", "--sequence-parallel", "off"],
     "DeepSeek-V3 Technical Report (arXiv:2412.19437) section 3.2: 2048 H800, PP16, EP64 over 8 nodes, "
     "ZeRO-1 data parallelism, no tensor parallelism (here on H100 nodes)"),
    ("mixtral-8x7b", "rack=1",
     ["--dp", "16", "--tp", "1", "--pp", "4", "--ep", "8", "--virtual-stages", "8", "--sequence-parallel", "off"],
     "NVIDIA/NeMo-Framework-Launcher examples/training/mixtral/h100/mixtral_8x7b_bf16.sh: TP1 PP4 VP8 EP8, "
     "sequence parallelism off (the node count is not in the script: 8 nodes, 64 H100, taken)"),
    ("mixtral-8x22b", "rack=2",
     ["--dp", "8", "--tp", "2", "--pp", "4", "--cp", "2", "--ep", "8", "--etp", "2", "--virtual-stages", "14",
      "--sequence-parallel", "on"],
     "NeMo 2.0 recipe nemo/collections/llm/recipes/mixtral_8x22b.py: 16 nodes x 8 H100, TP2 PP4 VP14 CP2 EP8, "
     "sequence parallelism; expert TP not set there, so Megatron's default, the TP degree (EP8 x ETP2 folded over "
     "cp 2 x dp 8)"),
    ("qwen3-30b-a3b", "node=1",
     ["--dp", "16", "--tp", "1", "--pp", "1", "--ep", "16"],
     "Megatron-Bridge recipes/qwen/h100/qwen3_moe.py, qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config: "
     "16 H100, TP1 PP1 EP16, global batch 1024, micro-batch 1, no recomputation"),
    ("qwen3-235b-a22b", "rack=4",
     ["--dp", "2", "--tp", "4", "--pp", "16", "--cp", "2", "--ep", "8", "--etp", "1", "--sequence-parallel", "on"],
     "Megatron-Bridge recipes/qwen/h100/qwen3_moe.py, qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config: "
     "256 H100, TP4 PP16 CP2 EP8 (expert TP 1: EP8 folded over tp 4 x cp 2)"),
    ("gpt-oss-120b", "rack=1",
     ["--dp", "8", "--tp", "2", "--pp", "4", "--ep", "16", "--etp", "1", "--sequence-parallel", "on"],
     "Megatron-Bridge recipes/gpt_oss/h100/gpt_oss.py, gpt_oss_120b_pretrain_64gpu_h100_bf16_config: "
     "64 H100, TP2 PP4 EP16 (expert TP 1, so EP spans dp 8 x tp 2)"),
    ("qwen3-30b-a3b", "node=1",
     ["--dp", "2", "--tp", "4", "--pp", "2", "--ep", "4", "--etp", "1"],
     "Megatron-Bridge recipes/qwen/h100/qwen3_moe.py, the 8-GPU recipe: TP4 PP2 EP4 (expert TP 1), here twice over "
     "on 16 H100 (dp 2: EP4 over tp 4)"),
    ("dbrx", "rack=8",
     ["--dp", "32", "--tp", "4", "--pp", "4", "--ep", "16", "--sequence-parallel", "on"],
     "not published: Databricks' DBRX blog gives 3072 H100 but no degrees, and no Megatron-Bridge or NeMo "
     "recipe exists; a 512-H100 layout of the same kind (TP4 inside a node, EP over all 16 experts) is taken"),
    ("llama4-maverick", "rack=8",
     ["--dp", "128", "--tp", "4", "--pp", "1", "--ep", "128", "--sequence-parallel", "on"],
     "Megatron-Bridge recipes/llama/llama4_e128.py: TP4 PP1 CP1 EP128 expert-TP4, sequence parallelism, "
     "global batch 512, micro-batch 1 (sequence 8192 there; the preset's 4096 here): 512 H100"),
]

def _plan(capsys, model: str, resize: str, flags: list[str]):
    code = main(["plan", "-t", H100, "--resize", resize, "-m", model, "--micro-batch", "1", "--top", "1",
                 "--json", *flags])
    out = capsys.readouterr().out
    return code, (json.loads(out) if code == 0 else None)


@pytest.mark.parametrize("model, resize, flags, source", PUBLISHED,
                         ids=[f"{case[0]}-{case[1]}" for case in PUBLISHED])
def test_every_moe_preset_plans_at_its_published_degrees(capsys, model, resize, flags, source):
    code, plan = _plan(capsys, model, resize, flags)
    assert code == 0, source
    best = plan["ranked"][0]
    pinned = {flags[i][2:]: int(flags[i + 1]) for i in range(len(flags) - 1)
              if flags[i] in ("--dp", "--tp", "--pp", "--ep", "--cp", "--etp")}
    # etp appears in the degrees only when folded (it is tp otherwise)
    assert {role: best["degrees"].get(role, best["degrees"]["tp"]) for role in pinned} == pinned
    assert math.isfinite(best["step_s"]) and best["step_s"] > 0
    assert 0 < best["memory"]["peak_bytes"] <= plan["memory_limit_bytes"]
    assert best["breakdown"]["expert_parallel_s"] > 0


def test_every_builtin_moe_preset_has_a_published_case():
    from synth.plan.model import PRESETS

    named = {case[0] for case in PUBLISHED}
    wanted = {"deepseek-v3", "mixtral-8x7b", "mixtral-8x22b", "qwen3-235b-a22b", "qwen3-30b-a3b",
              "gpt-oss-120b", "dbrx", "llama4-maverick"}
    assert wanted <= named and all(PRESETS[name].is_moe for name in wanted)
