"""The `synth` command line: parse, dispatch, and turn every user error into one line and an
exit code (2 for usage or input errors, 1 for "no program / invalid program")."""

from __future__ import annotations

import argparse
import importlib
import sys

from synth import __version__
from synth.errors import SearchTooLargeError, SynthError, UsageError

# Command groups, in the order of the data flow; each module exposes register(subparsers).
COMMAND_MODULES = (
    "synth.commands.synthesis",    # topologies, placements, check, programs
    "synth.commands.simulation",   # rank
    "synth.commands.exploration",  # explore, workload, fusion
    "synth.commands.sweep",        # sweep
    "synth.commands.calibration",  # calibrate
    "synth.commands.export",       # export, bench
    "synth.commands.emulate",      # emulate
)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2 through our own path."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="synth", description="Synthesize, prove, simulate and export hierarchical collective programs.")
    parser.add_argument("--version", action="version", version=f"synth {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "handler", None):
            parser.print_help(sys.stderr)
            return 2
        return args.handler(args) or 0
    except SynthError as error:
        print(f"synth: {error}{_flag_hint(error)}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt as interrupt:
        print(f"synth: {interrupt.args[0] if interrupt.args else 'interrupted'}", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def _flag_hint(error: SynthError) -> str:
    """The library describes values; here they become the flags that change them."""
    if isinstance(error, SearchTooLargeError):
        if error.largest_length:
            return f" (use --max-len {error.largest_length})"
        return " (use --hierarchy merged, or fewer levels in --levels or the topology)"
    return ""


if __name__ == "__main__":
    sys.exit(main())
