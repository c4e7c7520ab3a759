"""Benchmarks: each writes its figures under results/ with the command, machine and date."""
