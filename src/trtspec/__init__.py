"""trtspec: draft-target speculative decoding from Hugging Face checkpoints to a served Triton deployment."""

__version__ = "0.1.0"
