"""Benchmarks: each writes its study's folder under results/ (results/<study>/README.md, the
report with the command, machine and date, and its data beside it)."""
