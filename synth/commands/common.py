"""Options and resolution shared by commands: the system, the job, the request."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from synth.errors import UsageError
from synth.hierarchy import HIERARCHY_KINDS, SynthesisHierarchy, build_hierarchy, parse_reduce
from synth.placement import (Axis, Placement, enumerate_placements, make_placement, parse_axes,
                             parse_factor, parse_inside, parse_matrix)
from synth.topology import Topology, topology_from_levels
from synth.topology_file import load_topology


def add_system_options(parser: argparse.ArgumentParser, required: bool = True) -> None:
    group = parser.add_mutually_exclusive_group(required=required)
    group.add_argument("--topology", "-t", metavar="T", help="built-in topology name or path to a TOML file")
    group.add_argument("--levels", metavar="L", help="bare hierarchy, outermost first, e.g. rack=2,node=4,gpu=8")


def add_job_options(parser: argparse.ArgumentParser, reduce: bool = True, placement: bool = True,
                    hierarchy: bool = True, system_required: bool = True) -> None:
    add_system_options(parser, required=system_required)
    parser.add_argument("--axes", "-a", required=True, metavar="A", help="parallelism axes in order, e.g. data=8,model=4")
    if reduce:
        parser.add_argument("--reduce", "-r", required=True, metavar="R", help="axis or axes to reduce over, e.g. data or data,model")
    if placement:
        parser.add_argument("--placement", "-p", metavar="M", help="parallelism matrix as JSON rows, e.g. '[[1,2,2],[2,1,2]]'; default: every placement")
        add_constraint_options(parser)
    if hierarchy:
        parser.add_argument("--hierarchy", default="merged", choices=HIERARCHY_KINDS, help="synthesis hierarchy (default merged)")


def add_constraint_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--inside", action="append", default=[], metavar="AXIS=LEVEL",
                        help="keep AXIS inside one unit of LEVEL (factor 1 at outer levels); repeatable")
    parser.add_argument("--factor", action="append", default=[], metavar="AXIS.LEVEL=N",
                        help="fix AXIS's factor at LEVEL to N; repeatable")


def add_max_len_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-len", "-L", type=int, default=5, help="longest program, in steps (default 5)")


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """The options of every command that synthesizes and costs programs."""
    from synth.model.algorithms import BACKENDS

    add_max_len_option(parser)
    parser.add_argument("--backend", default="nccl", choices=sorted(BACKENDS), help="collective library to model (default nccl)")


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def resolve_topology(args) -> Topology:
    if getattr(args, "topology", None):
        return load_topology(args.topology)
    if getattr(args, "levels", None):
        return topology_from_levels(args.levels)
    raise UsageError("give the system with --topology NAME or --levels rack=2,node=4,gpu=8")


@dataclass(frozen=True)
class Job:
    topology: Topology
    axes: tuple[Axis, ...]

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(axis.name for axis in self.axes)


def resolve_job(args) -> Job:
    return Job(resolve_topology(args), parse_axes(args.axes))


def resolve_placements(args, job: Job) -> list[Placement]:
    """The one placement given with --placement, or every placement satisfying the constraints."""
    if getattr(args, "placement", None):
        if getattr(args, "inside", None) or getattr(args, "factor", None):
            raise UsageError("--placement fixes the matrix; drop --inside/--factor or drop --placement")
        return [make_placement(job.topology, job.axes, parse_matrix(args.placement))]
    constraints = [parse_inside(text) for text in getattr(args, "inside", [])]
    constraints += [parse_factor(text) for text in getattr(args, "factor", [])]
    return enumerate_placements(job.topology, job.axes, constraints)


def resolve_reduce(args, job: Job) -> tuple[str, ...]:
    return parse_reduce(args.reduce, job.axis_names)


def hierarchy_for(placement: Placement, reduce_axes: tuple[str, ...], kind: str) -> SynthesisHierarchy:
    return build_hierarchy(placement, reduce_axes, kind)


def print_json(value) -> None:
    json.dump(value, sys.stdout, indent=2)
    sys.stdout.write("\n")


def read_program_text(text: str) -> str:
    """A program given inline, as '-' for standard input, or as @FILE."""
    if text == "-":
        return sys.stdin.read()
    if text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as handle:
                return handle.read()
        except OSError as error:
            raise UsageError(f"cannot read program file {text[1:]!r}: {error.strerror}") from None
    return text
