"""The Lark grammar of reduction programs, shipped as package data (synth.grammar)."""
