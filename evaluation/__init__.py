"""Evaluation harness over math benchmarks: `python -m evaluation run|compare|sweep --help`.

Modules: `benchmarks` (loading), `prompting`, `generation` (vLLM / transformers backends),
`grader` (math-verify in worker processes), `metrics`, `report`, `cli`. Local models, data
sources and the hardware choice live in `infra/`. Heavy libraries (torch, transformers, vLLM)
are imported only where used.
"""
