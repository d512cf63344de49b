"""The FlashInfer family: FlashInfer's nvcc JIT modules (``JitSpec``), built ahead in CPU-only helpers into
FlashInfer's own JIT folder, and loaded by the server with no nvcc run (``family.py``)."""
