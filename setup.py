"""openrlhf-replay: rollout-level, advantage-prioritised experience replay for OpenRLHF GRPO.

Install for development with `bash scripts/setup_env.sh` (CPU stack in .venv/), or on a GPU node
with `pip install -r requirements/gpu.txt && pip install -e .`.
"""
from setuptools import find_packages, setup

setup(
    name="openrlhf-replay",
    version="0.1.0",
    description="Advantage-prioritised rollout replay for GRPO, on top of OpenRLHF 0.11.2",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["replay", "replay.*", "openrlhf_replay", "openrlhf_replay.*",
                                    "evaluation", "evaluation.*", "infra", "infra.*"]),
    # The heavy stacks differ between a GPU node and a CPU machine: see requirements/.
    # Only what the pure replay core needs is a hard dependency.
    install_requires=["numpy"],
    extras_require={"gpu": ["openrlhf[vllm]==0.11.2"]},
    include_package_data=True,
)
