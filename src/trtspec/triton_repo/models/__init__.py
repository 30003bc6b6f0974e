"""The Triton python models of a trtspec repository, as importable modules.

Each rendered ``<model>/1/model.py`` is one line importing ``TritonPythonModel`` from here. Pure logic
(request validation, the speculative loop, detokenization) lives in modules without Triton imports so it is
unit-tested without a server; ``triton_io`` is the only module that touches ``triton_python_backend_utils``.
"""
