"""Triton model-repository generation, templates, the Triton python models, and the server launcher."""
