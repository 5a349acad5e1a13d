"""The integration of the replay core (`replay/`) with OpenRLHF 0.11.2.

Laid out like the upstream modules it extends: `cli/train_ppo_ray.py` (the launcher),
`trainer/ppo_trainer.py` (the controller, which owns the replay buffer),
`trainer/ppo_utils/experience_maker.py` (fresh + replayed experiences),
`trainer/ray/ppo_actor.py` (the training actors: fresh/replay loss statistics).
Importing this package imports nothing heavy; the submodules import OpenRLHF.
"""
OPENRLHF_VERSION = "0.11.2"  # the upstream release every seam here was written against
