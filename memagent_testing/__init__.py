"""Test support shared by the tests and the benchmarks: perfect (scripted, constrained) readers, the fault
harness, and generators of inputs with known answers. Not part of the product: nothing in memagent/,
pipelines/, flows/ or memagent_cli/ imports it."""
