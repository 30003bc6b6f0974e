"""Test stand-in for tensorrt_llm 1.2.x (see ../README.md). Only what trtspec's adapter calls."""

import os

__version__ = os.environ.get("FAKE_TRTLLM_VERSION", "1.2.1")
