"""Ctrl-C while the command line is still loading (imports take a while on a busy machine):
nothing is done yet, so say so and leave at once, without finalizers (a Ctrl-C there used to
print an import traceback, or Z3's `__del__` tracebacks for half-imported objects).
`synth.cli.main` replaces this handler with its own once it runs."""

import os
import signal
import sys


def _interrupted_early(signum, frame):
    try:
        sys.stderr.write("synth: interrupted\n")
        sys.stderr.flush()
    finally:
        os._exit(130)


def install() -> None:
    """The handler, unless Ctrl-C is ignored (a background job started with SIGINT ignored keeps it so)."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted_early)
