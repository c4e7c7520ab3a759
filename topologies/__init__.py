"""Built-in topology descriptions, shipped as package data (synth.topologies)."""
