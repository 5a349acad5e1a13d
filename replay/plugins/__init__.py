"""Modes in modules of their own. Every module in this folder is imported, in name order, when
`replay` is (after the built-in modes), and registers the modes and off-policy rules it defines:
adding a mode here is one new file, which `--replay.mode` and `--help` then list (README, "Adding a
sampler or a mode"). A module here uses the pure core only (numpy; no torch, Ray or vLLM), as the
rest of `replay/` does.
"""
import importlib
import pkgutil

for _module in sorted(info.name for info in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")
