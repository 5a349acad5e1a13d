"""Evaluation harness over math benchmarks: `python -m evaluation run|compare|sweep --help`.

Modules: `benchmarks` (loading), `prompting`, `generation` (vLLM / transformers backends),
`grader` (math-verify in worker processes), `metrics`, `report`, `models` (local models),
`cli`. Heavy libraries (torch, transformers, vLLM) are imported only where used.
"""
