"""Options and resolution shared by commands: the system, the job, the request, sizes, output.

The conventions every command follows, defined once here: `--topology/-t` or `--levels`,
`--axes/-a`, `--reduce/-r`, `--placement/-p` (or `--inside`/`--factor`), `--bytes/-B` (or a
sweep `-b/-e/-f`), `--top/-k`, `--max-len/-L`, `--backend` (default nccl), `--json`, and
`-o/--output` for where files go. Numbers are ASCII digits only.

The library raises errors that describe values; `flagged` puts the option's name in front,
so a user reads which option to change. Heavy modules (numpy, z3, the grammar) are imported
inside the functions that need them, so a command pays only for what it uses.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from synth.errors import SynthError, UsageError
from synth.names import echo

if TYPE_CHECKING:
    from synth.hierarchy import SynthesisHierarchy
    from synth.placement import Axis, Placement
    from synth.topology import Topology

HIERARCHY_KINDS = ("merged", "split", "system")  # synth.hierarchy's, without importing numpy for --help
BACKEND_NAMES = ("gloo", "nccl")  # synth.model.backends.BACKENDS, likewise
DEFAULT_BACKEND = "nccl"
_ASCII_INTEGER = re.compile(r"[+-]?[0-9]+\Z")
_ASCII_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")
MAX_COUNT_DIGITS = 9  # counts (--top, --iters, --max-len, -f) past a billion are typos


# --- values argparse converts --------------------------------------------------------------------


def _integer(text: str, minimum: int) -> int:
    stripped = text.strip()
    if not _ASCII_INTEGER.match(stripped):
        raise argparse.ArgumentTypeError(f"{echo(text)} is not a whole number (digits 0-9)")
    if len(stripped.lstrip("+-")) > MAX_COUNT_DIGITS:
        raise argparse.ArgumentTypeError(f"{echo(text)} is too large (at most {MAX_COUNT_DIGITS} digits)")
    value = int(stripped)
    if value < minimum:
        wanted = "a positive whole number" if minimum == 1 else f"a whole number of at least {minimum}"
        raise argparse.ArgumentTypeError(f"{echo(text)} is not {wanted}")
    return value


def positive_seconds(text: str, flag: str) -> float:
    """A positive, finite number of seconds (`nan` and `inf` would switch a budget's refusal off)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not text.strip().isascii() or not math.isfinite(value) or value <= 0:
        raise UsageError(f"{flag} {echo(text)}: give a positive, finite number of seconds, e.g. 600")
    return value


def search_memory_bytes(text: str, example: str = "4GiB") -> int:
    """--search-memory: a positive size."""
    from synth.units import parse_bytes

    value = parse_bytes(text, where="--search-memory")
    if value <= 0:
        raise UsageError(f"--search-memory {text}: give a positive size, e.g. {example}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 written in ASCII digits."""
    return _integer(text, 1)


def natural_int(text: str) -> int:
    """An argparse type: a whole number >= 0 written in ASCII digits."""
    return _integer(text, 0)


def factor_int(text: str) -> int:
    """An argparse type: a sweep's step factor, a whole number >= 2."""
    return _integer(text, 2)


def seconds(text: str) -> float:
    """An argparse type: a positive, finite number of seconds."""
    stripped = text.strip()
    if not _ASCII_NUMBER.match(stripped):
        raise argparse.ArgumentTypeError(f"{echo(text)} is not a number of seconds, e.g. 600")
    value = float(stripped)
    if not math.isfinite(value) or value <= 0 or value > 365 * 86400:
        raise argparse.ArgumentTypeError(f"{echo(text)} is not a positive number of seconds up to a year, e.g. 600")
    return value


# --- errors with the option's name -----------------------------------------------------------------


@contextmanager
def flagged(option: str) -> Iterator[None]:
    """Prefix a UsageError raised in the block with the option whose value caused it."""
    try:
        yield
    except UsageError as error:
        if str(error).startswith(option):
            raise
        raise _with_prefix(error, f"{option}: ") from None


def _with_prefix(error: SynthError, prefix: str) -> SynthError:
    copy = error.__class__.__new__(error.__class__)
    copy.__dict__.update(error.__dict__)
    copy.args = (prefix + str(error),)
    return copy


# --- options ---------------------------------------------------------------------------------------


def add_system_options(parser: argparse.ArgumentParser, required: bool = True) -> None:
    group = parser.add_mutually_exclusive_group(required=required)
    group.add_argument("--topology", "-t", metavar="T", help="built-in topology name or path to a TOML file")
    group.add_argument("--levels", metavar="L", help="bare hierarchy, outermost first, e.g. rack=2,node=4,gpu=8")


def add_axes_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--axes", "-a", required=True, metavar="A", help="parallelism axes in order, e.g. data=8,model=4")


def add_reduce_option(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument("--reduce", "-r", required=required, metavar="R",
                        help="axis or axes to reduce over, e.g. data or data,model")
    add_collective_option(parser)


def add_collective_option(parser: argparse.ArgumentParser) -> None:
    from synth.goals import DEFAULT_GOAL, GOALS, ROUTED_GOALS
    from synth.routing import EXAMPLE

    parser.add_argument("--collective", default=DEFAULT_GOAL, metavar="C",
                        help=f"the collective the programs compute over the --reduce group: "
                             f"{', '.join([*GOALS, *ROUTED_GOALS])} (default {DEFAULT_GOAL})")
    parser.add_argument("--routing", metavar="R",
                        help=f"the mixture-of-experts routing --collective dispatch|combine moves, e.g. {EXAMPLE} "
                             f"(also bytes=2, capacity=1.25, zipf=1.1, or weights=w0/w1/... or weights=@FILE: one load per expert, "
                             f"a measured histogram)")


def resolve_routing(args, goal, required: bool = True):
    """The --routing of a dispatch or combine goal (synth/routing.py); None for other goals."""
    from synth.routing import EXAMPLE, parse_routing

    text = getattr(args, "routing", None)
    if not goal.routed:
        if text is not None:
            raise UsageError(f"--routing is read by --collective dispatch|combine, not {goal.name}: drop it")
        return None
    if text is None:
        if not required:
            return None
        raise UsageError(f"--collective {goal.name} needs --routing, e.g. --routing {EXAMPLE}")
    with flagged("--routing"):
        return parse_routing(text)


def add_placement_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--placement", "-p", metavar="M",
                        help="parallelism matrix as JSON rows, e.g. '[[1,2,2],[2,1,2]]'; default: every placement "
                             "the constraints allow")
    add_constraint_options(parser)


def add_hierarchy_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hierarchy", default="merged", choices=HIERARCHY_KINDS, help="synthesis hierarchy (default merged)")


def add_job_options(parser: argparse.ArgumentParser, reduce: bool = True, placement: bool = True,
                    hierarchy: bool = True, system_required: bool = True, reduce_required: bool = True) -> None:
    add_system_options(parser, required=system_required)
    add_axes_option(parser)
    if reduce:
        add_reduce_option(parser, required=reduce_required)
    if placement:
        add_placement_options(parser)
    if hierarchy:
        add_hierarchy_option(parser)


def add_constraint_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--inside", action="append", default=[], metavar="AXIS=LEVEL",
                        help="keep AXIS inside one unit of LEVEL (e.g. model=node: the model axis never crosses a "
                             "node boundary); repeatable")
    parser.add_argument("--factor", action="append", default=[], metavar="AXIS.LEVEL=N",
                        help="fix AXIS's factor at LEVEL to N; repeatable")


def add_max_len_option(parser: argparse.ArgumentParser, what: str = "longest program, in steps") -> None:
    parser.add_argument("--max-len", "-L", type=positive_int, default=5, help=f"{what} (default 5)")


def add_backend_option(parser: argparse.ArgumentParser, what: str = "collective library to model",
                       default: str | None = DEFAULT_BACKEND, default_text: str = DEFAULT_BACKEND) -> None:
    parser.add_argument("--backend", default=default, choices=BACKEND_NAMES, help=f"{what} (default {default_text})")


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """The options of every command that synthesizes and costs programs."""
    add_max_len_option(parser)
    add_backend_option(parser)


def add_top_option(parser: argparse.ArgumentParser, what: str = "only the K best programs, found by a cost-guided search") -> None:
    parser.add_argument("--top", "-k", metavar="K", type=positive_int, help=what)


def add_bytes_option(parser: argparse.ArgumentParser, what: str = "buffer size per device, e.g. 256MiB",
                     required: bool = False) -> None:
    parser.add_argument("--bytes", "-B", metavar="S", required=required, help=what)


def add_size_options(parser: argparse.ArgumentParser, bytes_help: str = "buffer size per device, e.g. 256MiB",
                     sweep_required: bool = False) -> None:
    """`--bytes/-B S`, or a sweep `-b MIN -e MAX [-f F]` as nccl-tests takes it."""
    if not sweep_required:
        add_bytes_option(parser, bytes_help)
    parser.add_argument("-b", "--minbytes", metavar="MIN", required=sweep_required,
                        help="smallest size of a sweep, e.g. 1KiB or 8M (nccl-tests style)")
    parser.add_argument("-e", "--maxbytes", metavar="MAX", required=sweep_required,
                        help="largest size of a sweep, e.g. 1GiB or 1G")
    parser.add_argument("-f", "--stepfactor", metavar="F", type=factor_int, default=None,
                        help="multiply the size by F between MIN and MAX (integer >= 2, default 2)")
    if sweep_required:
        parser.set_defaults(bytes=None)


def add_output_option(parser: argparse.ArgumentParser, what: str, required: bool = False) -> None:
    parser.add_argument("--output", "-o", metavar="DIR", required=required, help=what)


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def add_plot_option(parser: argparse.ArgumentParser, what: str) -> None:
    """`--plot FILE` (synth/commands/plotting.py checks and draws it)."""
    parser.add_argument("--plot", metavar="FILE",
                        help=f"also draw {what} to FILE, PNG or SVG by its suffix (needs matplotlib: "
                             f"pip install '.[plot]')")


# --- resolution ------------------------------------------------------------------------------------


def resolve_topology(args) -> Topology:
    if getattr(args, "topology", None):
        from synth.topology_file import load_topology

        with flagged("--topology"):
            return load_topology(args.topology)
    if getattr(args, "levels", None):
        from synth.topology import topology_from_levels

        with flagged("--levels"):
            return topology_from_levels(args.levels)
    raise UsageError("give the system with --topology NAME or --levels rack=2,node=4,gpu=8")


@dataclass(frozen=True)
class Job:
    topology: Topology
    axes: tuple[Axis, ...]

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(axis.name for axis in self.axes)


def resolve_axes(text: str) -> tuple[Axis, ...]:
    from synth.placement import parse_axes

    with flagged("--axes"):
        return parse_axes(text)


def resolve_job(args) -> Job:
    from synth.placement import check_axes_fit

    job = Job(resolve_topology(args), resolve_axes(args.axes))
    with flagged("--axes"):
        check_axes_fit(job.topology, job.axes)
    return job


def constraints_of(args) -> list:
    from synth.placement import parse_factor, parse_inside

    constraints = []
    for text in getattr(args, "inside", None) or []:
        with flagged("--inside"):
            constraints.append(parse_inside(text))
    for text in getattr(args, "factor", None) or []:
        with flagged("--factor"):
            constraints.append(parse_factor(text))
    return constraints


def given_placement(args, job: Job) -> Placement | None:
    """The placement --placement gives, checked against the system and the axes (None without it)."""
    if getattr(args, "placement", None) is None:
        return None
    if getattr(args, "inside", None) or getattr(args, "factor", None):
        raise UsageError("--placement fixes the matrix; drop --inside/--factor or drop --placement")
    from synth.placement import make_placement, parse_matrix

    with flagged("--placement"):
        return make_placement(job.topology, job.axes, parse_matrix(args.placement))


def iter_placements(args, job: Job) -> Iterator[Placement]:
    """The one placement given with --placement, or every placement satisfying the constraints,
    one at a time (a system with millions of placements is never held whole)."""
    placement = given_placement(args, job)
    if placement is not None:
        yield placement
        return
    from synth.placement import generate_placements

    constraints = constraints_of(args)
    yield from _flagged_constraints(generate_placements(job.topology, job.axes, constraints))


def _flagged_constraints(placements: Iterator[Placement]) -> Iterator[Placement]:
    """Constraint errors come from the generator once it runs: name the options there."""
    try:
        yield from placements
    except UsageError as error:
        raise _with_prefix(error, "--inside/--factor: ") if not str(error).startswith("--") else error from None


def resolve_placements(args, job: Job) -> list[Placement]:
    return list(iter_placements(args, job))


def one_placement(args, job: Job, command: str) -> Placement:
    """The one placement a command needs: --placement, or constraints that leave exactly one."""
    found = []
    for placement in iter_placements(args, job):
        found.append(placement)
        if len(found) > 1:
            break
    if len(found) == 1:
        return found[0]
    raise UsageError(f"{command} works on one placement and several fit: give --placement M "
                     f"(e.g. {found[0].to_text()}; `synth placements` lists them) or more --inside/--factor")


def resolve_reduce(args, job: Job) -> tuple[str, ...]:
    from synth.hierarchy import parse_reduce

    with flagged("--reduce"):
        return parse_reduce(args.reduce, job.axis_names)


def resolve_goal(args, supported=None, routed: bool = False):
    """The --collective goal (synth/goals.py); a command that cannot yet cost or run a goal
    names the commands that can. `routed`: the command takes dispatch and combine."""
    from synth.goals import parse_goal

    with flagged("--collective"):
        chosen = getattr(args, "collective", None)
        goal = parse_goal("allreduce" if chosen is None else chosen)
    if goal.routed and not routed:
        raise UsageError(f"--collective {goal.name}: this command does not take dispatch or combine yet; "
                         f"`synth check`, `synth programs`, `synth rank` and `synth export --format json` do")
    if supported is not None and goal.name not in supported:
        raise UsageError(f"--collective {goal.name}: this command takes {', '.join(supported)} for now; "
                         f"`synth programs`, `synth check`, `synth rank` and `synth export --format torch|nccl|json --program` "
                         f"take every collective")
    return goal


def hierarchy_for(placement: Placement, reduce_axes: tuple[str, ...], kind: str) -> SynthesisHierarchy:
    from synth.hierarchy import build_hierarchy

    return build_hierarchy(placement, reduce_axes, kind)


def check_search(hierarchies, max_len: int, goal="allreduce") -> None:
    """The search's own refusals (a hierarchy too deep, a program too long, a search estimated
    beyond a minute), asked of every distinct hierarchy shape before anything is costed: one
    enumeration serves every hierarchy of the same sizes. A topology too deep to search is
    refused before its network is built (a 20-level system used gigabytes first)."""
    from synth.search import MAX_PROGRAM_LENGTH
    from synth.search.budget import check_budget

    if max_len > MAX_PROGRAM_LENGTH or max_len < 1:
        from synth.search import Enumerator, SearchOptions, semantics_for

        hierarchy = next((h for h in hierarchies if h.group_size > 1), None)
        if hierarchy is not None:
            Enumerator(semantics_for(hierarchy), SearchOptions(max_len=max_len))  # its own one-line refusal
    shapes = {(hierarchy.level_names, hierarchy.sizes) for hierarchy in hierarchies if hierarchy.group_size > 1}
    unique = {sizes: names for names, sizes in sorted(shapes)}
    check_budget([(names, sizes) for sizes, names in unique.items()], max_len, goal=goal)


# --- sizes -----------------------------------------------------------------------------------------

MAX_SIZES = 64


def parse_size(text: str, option: str) -> int:
    """A byte size as `--bytes` takes it (synth.units: `256MiB`, `1MB` = 10^6, nccl-tests' `8M`),
    or `-b/-e` as nccl-tests' flags take it (`1MB` = 2^20): the size rule of synth/units.py."""
    from synth.units import parse_bytes

    if len(text) > 64:
        raise UsageError(f"{option} {echo(text)}: not a size; write e.g. 256MiB")
    return parse_bytes(text, where=option, nccl_tests=option in ("-b", "-e"))


def resolve_sizes(args, default: int | None = None) -> list[int]:
    """--bytes S, or the sweep MIN, MIN*F, ... up to MAX (as nccl-tests' -b/-e/-f); `default`
    when neither is given (an error when there is none)."""
    low_text, high_text = getattr(args, "minbytes", None), getattr(args, "maxbytes", None)
    factor = getattr(args, "stepfactor", None)
    sweep = low_text is not None or high_text is not None or factor is not None
    if getattr(args, "bytes", None) is not None:
        if sweep:
            raise UsageError("give either --bytes S or a sweep -b MIN -e MAX [-f F], not both")
        return [parse_size(args.bytes, "--bytes")]
    if not sweep and default is not None:
        return [default]
    if low_text is None or high_text is None:
        raise UsageError("give the size: --bytes 256MiB, or a sweep -b 1KiB -e 1GiB [-f 2]")
    low, high = parse_size(low_text, "-b"), parse_size(high_text, "-e")
    factor = 2 if factor is None else factor
    if low > high:
        raise UsageError(f"-b {echo(low_text)} is larger than -e {echo(high_text)}: give MIN <= MAX")
    sizes, size = [], low
    while size <= high:
        if len(sizes) == MAX_SIZES:
            raise UsageError(f"the sweep has more than {MAX_SIZES} sizes; use a larger -f or a narrower -b/-e")
        sizes.append(size)
        size *= factor
    return sizes


# --- output ----------------------------------------------------------------------------------------


def output_directory(option: str | None, command: str) -> Path:
    """The directory -o names, created if needed; without -o a new directory under the system's
    temporary directory (`$TMPDIR/synth-<command>-XXXX`): generated files never land in the
    current directory (a source checkout, say) unless asked for, and never overwrite an
    earlier run's. The command prints where they went."""
    import tempfile

    if option is None:
        try:
            return Path(tempfile.mkdtemp(prefix=f"synth-{command}-"))
        except OSError as error:
            raise UsageError(f"cannot create a temporary directory ({error.strerror or error}): give -o DIR") from None
    path = Path(option)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UsageError(f"-o {echo(option)} is a file, not a directory: give a directory") from None
    except OSError as error:
        raise UsageError(f"-o {echo(option)}: cannot create the directory ({error.strerror or error})") from None
    return path


def print_json(value) -> None:
    json.dump(value, sys.stdout, indent=2)
    sys.stdout.write("\n")


MAX_INPUT_BYTES = 16 << 20  # a program or a list of sizes longer than this is not one


def read_text(path: str, what: str) -> str:
    """The UTF-8 text of a file the user names, at most MAX_INPUT_BYTES (so /dev/zero is refused,
    not read forever)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_INPUT_BYTES + 1)
    except OSError as error:
        raise UsageError(f"cannot read {what} {echo(path)}: {error.strerror or error}") from None
    except ValueError:  # a NUL in the name
        raise UsageError(f"cannot read {what} {echo(path)}: not a file name") from None
    if len(data) > MAX_INPUT_BYTES:
        raise UsageError(f"{what} {echo(path)} is larger than {MAX_INPUT_BYTES >> 20} MiB: not a {what}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{what} {echo(path)} is not UTF-8 text; give a text file") from None


MAX_PROGRAM_STEPS = 4096  # far past any search (synth.search.MAX_PROGRAM_LENGTH); parsing is ~0.2 ms a step
_COMMENT = re.compile(r"#[^\n]*")


def read_program_text(text: str) -> str:
    """A program given inline, as '-' for standard input, or as @FILE; one of more than
    MAX_PROGRAM_STEPS steps is refused before it is parsed (578,514 steps took 126 s and 2 GB
    to parse and refuse)."""
    program = _program_source(text)
    steps = _COMMENT.sub("", program).count("(") // 2  # every step is Collective(Form(level))
    if steps > MAX_PROGRAM_STEPS:
        raise UsageError(f"the program has about {steps:,} steps, more than any collective program "
                         f"(at most {MAX_PROGRAM_STEPS:,}); give a shorter one")
    return program


def _program_source(text: str) -> str:
    if text == "-":
        data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1) if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
        if len(data) > MAX_INPUT_BYTES:
            raise UsageError(f"the program on standard input is larger than {MAX_INPUT_BYTES >> 20} MiB")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise UsageError("the program on standard input is not UTF-8 text") from None
    if text.startswith("@"):
        return read_text(text[1:], "program file")
    return text
