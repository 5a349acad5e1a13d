"""Plumbing every part of the project uses: which dtype this CPU computes in (`hardware`), local
models and model specs (`models`), where data files come from (`datasources`), and the error a
user can fix (`errors`). It imports nothing of `replay/`, `openrlhf_replay/` or `evaluation/`.
"""
