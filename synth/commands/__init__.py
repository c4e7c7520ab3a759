"""The command line's command groups, one module each; every module exposes
`register(subparsers)`. Not an API: only synth.cli imports these."""

__all__: list[str] = []
