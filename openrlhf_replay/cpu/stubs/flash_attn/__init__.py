"""CPU stand-in for the `flash_attn` package (CUDA-only, cannot be built without CUDA).

OpenRLHF 0.11.2 imports `flash_attn.bert_padding` and `flash_attn.utils.distributed` at module
import time (`openrlhf/models/ring_attn_utils.py`). This stand-in provides those pure-torch
helpers and nothing else: no attention kernels. It ships no package metadata, so transformers
still reports flash-attention as unavailable and OpenRLHF takes its non-triton code paths.
It is put on sys.path only on CPU machines (see openrlhf_replay/cpu/__init__.py).
"""
__version__ = "0.0.0+cpu-stand-in"
