"""`python -m synth` and the `synth` script: Ctrl-C handled from the first instruction.

Importing the command line takes a while on a busy machine; a Ctrl-C then used to print an
import traceback, or Z3's `__del__` tracebacks as the half-imported objects were finalized.
"""

import os
import sys

from synth import _interrupt


def run() -> None:
    _interrupt.install()  # main() installs its own handling in its turn
    from synth.cli import main

    code = main()
    if code == 130:
        # Interrupted: what was kept is written; leave without running finalizers, which Z3's
        # objects run half torn down (tracebacks after the one-line message).
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(130)
    sys.exit(code)


if __name__ == "__main__":
    run()
