"""One example per command, shown at the end of `synth COMMAND --help`.

Each runs as written from any directory on a machine with the package installed (the
`emulate` and `bench --emulate` ones need root; `bench` needs torch); tests/test_cli_help.py
runs the quick ones. Kept in one table so a new command cannot forget its example.
"""

from __future__ import annotations

import argparse

EXAMPLES: dict[str, tuple[str, ...]] = {
    "topologies": ("synth topologies",),
    "placements": ("synth placements --topology dgx-a100-x4 --axes data=8,model=4 --inside model=node",),
    "check": ("synth check --levels server=2,cpu=2,gpu=4 --axes 4,4 --placement '[[1,2,2],[2,1,2]]' --reduce a0 "
              "'Reduce(InsideGroup(gpu)); AllReduce(Master(cpu)); Broadcast(InsideGroup(gpu))'",),
    "programs": ("synth programs --topology paper-fig3 --axes data=4,model=4 --reduce data "
                 "--placement '[[1,2,2],[2,1,2]]' --max-len 3",),
    "rank": ("synth rank --topology dgx-a100-x4 --axes data=32 --reduce data --bytes 256MiB --top 5",),
    "explore": ("synth explore --topology gcp-a2-2x16 --axes data=16,model=2 --reduce data --bytes 256MiB",),
    "workload": ("synth workload --topology dgx-h100-2x8x8 --axes data=16,model=8 --reduction data:1GiB "
                 "--reduction model:64MiBx96",),
    "fusion": ("synth fusion --topology dgx-a100-x4 --axes data=8,model=4 --reduce data --placement '[[4,2],[1,4]]' "
               "--tensors 4MiB,16MiB,64MiB,8KiB",),
    "sweep": ("synth sweep --topology gcp-n1-v100-4x8 --axes data=8,model=4 -b 1KiB -e 1GiB -f 4 -o sweep-results",),
    "probe": ("synth probe --topology hgx-h100-ib-4x8 -o probe.py",),
    "calibrate": ("synth calibrate results/accuracy/microbench-emu-2x4-calibration.csv --topology emu-2x4 --backend gloo "
                  "-o emu-2x4-mine.toml   # from the source tree",),
    "export": ("synth export --topology dgx-a100-x4 --axes data=8,model=4 --reduce data --placement '[[4,2],[1,4]]' "
               "--top 1 --format torch -o allreduce.py",),
    "bench": ("synth bench --topology emu-2x4 --axes data=8 --reduce data --top 3 --backend gloo --bytes 1MiB",
              "synth bench --emulate emu-2x4 --axes data=8 --reduce data --top 3 --bytes 1MiB   # as root"),
    "plan": ("synth plan --topology selene --model gpt3-2.7b --top 5",),
    "tune": ("synth tune --topology dgx-h100-x2 -o nccl_tuner.conf",),
    "codesign": ("synth codesign benchmarks/grids/codesign-example.toml --estimate   # from the source tree",),
    "emulate": ("synth emulate up emu-2x4 --scale 1/64   # as root; then: synth emulate status; synth emulate down",),
}


class ExampleFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that the examples block keeps its lines as written."""

    def _fill_text(self, text, width, indent):
        if text.startswith("example"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def add_examples(parser: argparse.ArgumentParser, command: str) -> None:
    lines = EXAMPLES.get(command, ())
    if not lines:
        return
    parser.epilog = ("example:\n" if len(lines) == 1 else "examples:\n") + "\n".join(f"  {line}" for line in lines)
    if parser.formatter_class is argparse.HelpFormatter:
        parser.formatter_class = ExampleFormatter
