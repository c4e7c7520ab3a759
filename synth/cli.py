"""The `synth` command line: parse, dispatch, and turn every user error into one line and an
exit code (2 for usage or input errors, 1 for "no program / invalid program", 130 for Ctrl-C).

Start-up is kept short by importing only what the command asked for: the command table below
names each command's module, and `synth --help` or `synth topologies` never loads numpy, z3,
networkx or the grammar (benchmarks/startup.py measures it).
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading

from synth import __version__
from synth.errors import SearchTooLargeError, SynthError, UsageError

# Every command, in the order of the data flow: the module that registers it (its
# register(subparsers) adds all of that module's commands) and the line `synth --help` shows.
COMMANDS = {
    "topologies": ("synth.commands.synthesis", "list the built-in topologies"),
    "placements": ("synth.commands.synthesis", "list every placement of the axes on the system"),
    "check": ("synth.commands.synthesis", "check a program against the semantics"),
    "programs": ("synth.commands.synthesis", "enumerate every valid program up to a length"),
    "rank": ("synth.commands.simulation", "rank programs by predicted time on a topology"),
    "explore": ("synth.commands.exploration", "the best program on every placement, and the spread between placements"),
    "workload": ("synth.commands.exploration",
                 "placements ranked by a step's total reduction time over several reductions"),
    "fusion": ("synth.commands.exploration",
               "fuse gradients into buckets and pick each bucket's program; compare with DDP's 25 MiB buckets"),
    "sweep": ("synth.commands.sweep", "best program of every placement x reduction x size, written as CSV and JSON"),
    "probe": ("synth.commands.probe", "write a short script that measures what calibration needs on a cluster"),
    "calibrate": ("synth.commands.calibration", "fit level latency and bandwidth from nccl-tests or benchmark measurements"),
    "export": ("synth.commands.export",
               "write programs as a torch script, NCCL C file or JSON plan, or a placement as meshes"),
    "bench": ("synth.commands.export", "run programs and the default all-reduce with torchrun here and time them"),
    "tune": ("synth.commands.tune",
             "NCCL tuner settings where the model's best algorithm/protocol differs from NCCL's pick"),
    "emulate": ("synth.commands.emulate", "bring an emulated cluster (network namespaces, shaped links) up or down; needs root"),
    "plan": ("synth.commands.plan",
             "degrees, placement and programs of a whole training step, ranked by predicted step time"),
    "codesign": ("synth.commands.codesign",
                 "plan every point of a grid of systems x models x planner choices; cost, time, Pareto front"),
}

EPILOG = """\
examples:
  synth topologies
  synth placements --topology dgx-a100-x4 --axes data=8,model=4 --inside model=node
  synth rank --topology dgx-a100-x4 --axes data=32 --reduce data --bytes 256MiB --top 5
  synth explore --topology gcp-n1-v100-4x8 --axes data=8,model=4 --reduce data --bytes 64MiB

`synth COMMAND --help` shows a command's options and an example. The guide (concepts, every
command, the cost model, the Python API) is README.md at the root of the source tree, with
details under docs/; docs/model.md defines the model.

exit codes: 0 done, 1 no program / invalid program, 2 usage or input error, 130 interrupted"""

# Error lines longer than this are cut: an input of megabytes is never echoed whole.
MAX_ERROR_CHARS = 600


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2 through our own path."""

    command: str | None = None  # set on the top parser: the command argv names, if any

    def error(self, message: str):
        # Unknown options are found by the top parser; they belong to the command all the same.
        prog = f"synth {self.command}" if self.prog == "synth" and self.command else self.prog
        raise CommandLineError(prog, f"{message} (see {prog} --help)")


class _TopFormatter(argparse.RawDescriptionHelpFormatter):
    """Command names and their lines side by side."""

    def __init__(self, prog: str):
        super().__init__(prog, max_help_position=18)
        self._action_max_length = 16  # room for the longest command name beside its line


class CommandLineError(UsageError):
    """A usage error found by argparse: it knows which (sub)command's parser raised it."""

    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog = prog


def command_name(argv: list[str]) -> str | None:
    """The command argv asks for: its first word that is not an option (synth's own options
    take no values), when it names a command."""
    for word in argv:
        if word == "--":
            return None
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def build_parser(command: str | None = None, every_command: bool = False) -> argparse.ArgumentParser:
    """The parser with `command`'s module registered for real (every module with
    `every_command`) and the other commands as listed-only placeholders, so building it imports
    nothing heavy."""
    parser = _Parser(prog="synth", epilog=EPILOG, formatter_class=_TopFormatter,
                     description="Synthesize, prove, simulate and export hierarchical collective programs.")
    parser.command = command
    parser.add_argument("--version", action="version", version=f"synth {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    modules = list(dict.fromkeys(module for module, _ in COMMANDS.values()))
    wanted = modules if every_command else [COMMANDS[command][0]] if command else []
    for module_name in wanted:
        importlib.import_module(module_name).register(subparsers)
    from synth.commands.examples import add_examples

    for name, (_, summary) in COMMANDS.items():
        if name not in subparsers.choices:
            subparsers.add_parser(name, help=summary, add_help=False)
        else:
            add_examples(subparsers.choices[name], name)
    return parser


class _Interrupts:
    """Ctrl-C as KeyboardInterrupt, never lost. Python prints and drops an exception raised in a
    finalizer (`__del__`, which Z3's objects run all the time), so a Ctrl-C landing there used to
    vanish and the run went on to exit 0; here it is raised 10 ms later instead, and a run that
    saw Ctrl-C never reports success."""

    def __init__(self):
        self.received = False
        self.previous: dict = {}
        self.previous_hook = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGALRM):
                if signal.getsignal(sig) is not signal.SIG_IGN:  # a background job ignoring Ctrl-C keeps ignoring it
                    self.previous[sig] = signal.signal(sig, self._handle)
        self.previous_hook = sys.unraisablehook
        sys.unraisablehook = self._unraisable
        return self

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0) if self.previous else None
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        if not self.received:  # after a Ctrl-C, half-built objects may still be collected later
            sys.unraisablehook = self.previous_hook
        return False

    def _unraisable(self, unraisable) -> None:
        """After a Ctrl-C, an object interrupted half built (a Z3 Context or Solver) fails in its
        `__del__` when collected; that is the interrupt's doing, not news: not printed."""
        if not self.received:
            (self.previous_hook or sys.__unraisablehook__)(unraisable)

    def _handle(self, signum, frame):
        if signum == signal.SIGINT:
            self.received = True
        elif not self.received:
            return
        while frame is not None:
            if frame.f_code.co_name == "__del__":
                signal.setitimer(signal.ITIMER_REAL, 0.01)
                return
            frame = frame.f_back
        raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    interrupts = _Interrupts()
    try:
        with interrupts:
            code = _main(argv)
    except KeyboardInterrupt:  # one that arrived after the command's own handling
        code = 0
    except Exception:  # a library that turned the Ctrl-C into its own error (numpy: ImportError)
        if not interrupts.received:
            raise
        code = 0
    if interrupts.received and code != 130:  # a Ctrl-C swallowed somewhere: not a success
        _report("synth", "interrupted")
        return 130
    return code


def _main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = command_name(argv)
    prefix = f"synth {command}" if command else "synth"
    try:
        parser = build_parser(command)  # inside the try: Ctrl-C while modules import is an interrupt too
        args = parser.parse_args(argv)
        if not getattr(args, "handler", None):
            parser.print_help(sys.stderr)
            return 2
        return args.handler(args) or 0
    except CommandLineError as error:
        _report(error.prog, error)
        return error.exit_code
    except SynthError as error:
        _report(prefix, f"{error}{_flag_hint(error)}" if _flag_hint(error) else error)
        return error.exit_code
    except KeyboardInterrupt as interrupt:
        _report(prefix, interrupt.args[0] if interrupt.args and isinstance(interrupt.args[0], str) else "interrupted")
        return 130
    except BrokenPipeError:
        _quiet_broken_pipe()
        return 0
    except Exception as error:
        from synth.commands.terminal import interrupt_in_native_call

        if not interrupt_in_native_call(error):
            raise
        _report(prefix, "interrupted")
        return 130


def _report(prefix: str, error: BaseException | str) -> None:
    """One error line, cut when long (a program syntax error adds the program line and a
    caret under it, each cut alike)."""
    from synth.commands.terminal import printable
    from synth.errors import ProgramSyntaxError

    lines = printable(str(error)).splitlines() or [""]  # an escape code from a file is shown, not obeyed
    if not isinstance(error, ProgramSyntaxError):
        lines = [" ".join(" ".join(lines).split())]
    message = "\n".join(_cut(line) for line in lines)
    try:
        print(f"{prefix}: {message}", file=sys.stderr, flush=True)
    except (BrokenPipeError, OSError):
        pass


def _cut(line: str) -> str:
    if len(line) <= MAX_ERROR_CHARS:
        return line
    return f"{line[:MAX_ERROR_CHARS - 40]} ... ({len(line)} characters, cut)"


def _quiet_broken_pipe() -> None:
    """The reader went away (`synth programs | head`): send the rest of stdout nowhere, so the
    interpreter's final flush does not print an error."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _flag_hint(error: SynthError) -> str:
    """The library describes values; here they become the flags that change them."""
    if isinstance(error, SearchTooLargeError):
        if error.largest_length:
            return f" (use --max-len {error.largest_length})"
        return " (use --hierarchy merged, or fewer levels in --levels or the topology)"
    inputs = getattr(error, "inputs", ())
    if inputs:  # each input the library names is set by the option of the same name
        return f" ({', '.join('--' + name.replace('_', '-') for name in inputs)})"
    return ""


if __name__ == "__main__":
    sys.exit(main())
