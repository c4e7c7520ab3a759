"""Model files and built-in models: every key documented, the published parameter counts of
the Llama family, the architecture the plan prints and the warning for keys a file leaves to
GPT-3's defaults."""

from __future__ import annotations

import json
import re
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from synth.cli import main
from synth.plan import formulas
from synth.plan.model import ARCHITECTURE, KEYS, PRESETS, Transformer, describe_architecture, read_model

DOCS = Path(__file__).resolve().parents[1] / "docs" / "plan.md"

# Parameter counts of the released checkpoints (the sums of their tensors' sizes, as the model
# cards round them: Llama 2 7B/13B/70B, Llama 3 8B "8.03B", 70B "70.6B", 3.1 405B "405.9B",
# 3.2 1B "1.24B", 3B "3.21B").
PUBLISHED = {"llama2-7b": 6_738_415_616, "llama2-13b": 13_015_864_320, "llama2-70b": 68_976_648_192,
             "llama3-8b": 8_030_261_248, "llama3-70b": 70_553_706_496, "llama3.1-405b": 405_853_388_800,
             "llama3.2-1b": 1_235_814_400, "llama3.2-3b": 3_212_749_824}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_llama_parameter_counts_are_the_published_ones(name):
    model = PRESETS[name]
    assert formulas.parameter_count(model) == PUBLISHED[name]
    assert model.source and model.gated_mlp and not model.biases and not model.learned_positions


def test_llama_architectures():
    assert PRESETS["llama3-8b"].query_groups == 8 and PRESETS["llama2-7b"].query_groups == 32
    assert PRESETS["llama3.2-1b"].tied_embeddings and not PRESETS["llama3-8b"].tied_embeddings
    text = describe_architecture(PRESETS["llama3-70b"])
    for words in ("gated FFN", "64 heads, 8 key/value groups", "rotary positions", "untied embeddings", "no biases"):
        assert words in text
    gpt = describe_architecture(PRESETS["gpt3-1.3b"])
    for words in ("FFN (2 matrices", "multi-head attention", "learned positions", "tied embeddings", "biases (LayerNorm)"):
        assert words in gpt


def _docs_table() -> dict[str, tuple[str, str, str]]:
    rows = {}
    for line in DOCS.read_text(encoding="utf-8").splitlines():
        match = re.fullmatch(r"\| `(\w+)` \| (.+) \| (.+) \| (.+) \|", line)
        if match:
            rows[match.group(1)] = match.group(2, 3, 4)
    return rows


def _default_text(field) -> str:
    if field.default is MISSING:
        return "required"
    if isinstance(field.default, bool):
        return f"`{'true' if field.default else 'false'}`"
    if isinstance(field.default, str):
        return f'`"{field.default}"`'
    return f"`{field.default}`"


def test_every_model_key_is_documented_with_its_default():
    table = _docs_table()
    assert set(KEYS) == {field.name for field in fields(Transformer)}
    for field in fields(Transformer):
        meaning, default, unit = table[field.name]
        assert (meaning, default, unit) == (KEYS[field.name][0], _default_text(field), KEYS[field.name][1]), field.name


SHAPE = ('name = "shape-only"\nlayers = 2\nhidden = 64\nheads = 4\nffn = 256\nseq_len = 128\nvocab = 1000\n'
         'micro_batch = 1\nglobal_batch = 64\n')


def test_read_model_names_the_defaulted_architecture_keys(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(SHAPE)
    source = read_model(str(path))
    assert source.defaulted == ARCHITECTURE
    assert "gated_mlp = false" in source.defaults_text() and "tied_embeddings = true" in source.defaults_text()
    path.write_text(SHAPE + "kv_heads = 2\ngated_mlp = true\nbiases = false\ndropout = false\nlearned_positions = false\n"
                    "tied_embeddings = false\nflash_attention = true\n")
    assert read_model(str(path)).defaulted == ()
    assert read_model("llama3-8b").defaulted == ()
    stated = tmp_path / "m.json"
    stated.write_text(json.dumps(PRESETS["llama3-8b"].to_json()))
    assert read_model(str(stated)).model == PRESETS["llama3-8b"] and read_model(str(stated)).defaulted == ()


def test_plan_warns_about_defaults_and_prints_the_model(tmp_path, capsys):
    path = tmp_path / "[bold]m.toml"
    path.write_text(SHAPE.replace('"shape-only"', '"[/x] odd"') + "gated_mlp = true\n")
    assert main(["plan", "-t", "dgx-a100", "-m", str(path), "--top", "1"]) == 0
    captured = capsys.readouterr()
    warning = captured.err.strip()
    assert warning.startswith("warning:") and "\n" not in warning
    assert "gated_mlp" not in warning and "kv_heads, biases" in warning and "[bold]m.toml" in warning
    parameters = formulas.parameter_count(read_model(str(path)).model)
    assert f"{parameters:,} parameters" in captured.out and "[/x] odd" in captured.out
    assert "gated FFN" in captured.out
    assert main(["plan", "-t", "dgx-a100", "-m", "llama3.2-1b", "--top", "1", "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    document = json.loads(captured.out)
    assert document["parameters"] == PUBLISHED["llama3.2-1b"] and "tied embeddings" in document["architecture"]


def test_list_models_shows_counts_architecture_and_sources(capsys):
    assert main(["plan", "--list-models"]) == 0
    out = capsys.readouterr().out
    for name in PUBLISHED:
        assert name in out
    assert "8.03B" in out and "405.85B" in out and "Llama 3 Herd" in out
