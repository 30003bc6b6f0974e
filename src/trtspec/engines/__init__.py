"""Runtimes: the PyTorch draft-target speculative engine (CPU/CUDA) and the TensorRT-LLM runner adapter."""
