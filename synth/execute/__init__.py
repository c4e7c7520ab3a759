"""Running exported programs: a local torchrun launcher, and the report of measured against
predicted times that `synth bench` writes."""
