"""Pictures of what the commands compute (`--plot FILE`), one module per picture; matplotlib,
the `plot` extra, is imported only when one is drawn (synth/plots/figure.py)."""
