"""The start episode of a resume (`openrlhf_replay/trainer/resume.py`), on the real prompt loader
upstream builds (torchdata's `StatefulDataLoader`, batch 1, shuffled). The whole controller resumed
at an episode's last step: `tests/scripts/test_rehearsal_resume.py`."""
import contextlib

import pytest
from openrlhf.trainer import ppo_trainer as upstream_sync
from openrlhf.trainer import ppo_trainer_async as upstream_async
from torchdata.stateful_dataloader import StatefulDataLoader

from openrlhf_replay.cli.train_ppo_ray import _install_resume_classes
from openrlhf_replay.trainer import resume
from openrlhf_replay.trainer.ppo_trainer import _ReplayPPOTrainer
from openrlhf_replay.trainer.ppo_trainer_async import _ReplayPPOTrainerAsync, _ReplayTrainingActor
from openrlhf_replay.utils import undecorated

PROMPTS = list(range(8))


def _saved_on_last_step(loader_ran_dry: bool):
    """(checkpoint states of episode 0's last step, the next epoch an uninterrupted run draws).
    `loader_ran_dry`: the step asked the loader for one more prompt, as dynamic filtering's
    replacement draw does, and found it empty."""
    loader = StatefulDataLoader(PROMPTS, batch_size=1, shuffle=True)
    it = iter(loader)
    for _ in PROMPTS:
        next(it)
    if loader_ran_dry:
        with pytest.raises(StopIteration):
            next(it)
    states = {"episode": 0, "global_step": 4, "total_consumed_prompts": 8,
              "data_loader_state_dict": loader.state_dict()}
    return states, [int(x) for x in loader]


def _walk_from(states):
    """The prompts a resumed controller walks in each episode from the start one (upstream's
    loop: load the state, then iterate once per episode), for 2 episodes in all."""
    loader = StatefulDataLoader(PROMPTS, batch_size=1, shuffle=True)
    loader.load_state_dict(states["data_loader_state_dict"])
    return [[int(x) for x in loader] for _ in range(states["episode"], 2)]


def test_a_checkpoint_whose_loader_ran_dry_resumes_in_the_next_episode_in_the_uninterrupted_order():
    states, next_epoch = _saved_on_last_step(loader_ran_dry=True)
    walked = _walk_from(states)  # upstream: the next epoch walked as episode 0 again, then episode 1
    assert len(walked) == 2 and walked[0] == next_epoch and sorted(walked[1]) == PROMPTS
    resumed = resume.resume_states(states)
    assert resumed["episode"] == 1 and resumed["data_loader_state_dict"] is states["data_loader_state_dict"]
    assert _walk_from(resumed) == [next_epoch]  # episode 1 only, in the order the run would draw


def test_a_checkpoint_on_a_whole_last_batch_resumes_as_upstream_does():
    states, next_epoch = _saved_on_last_step(loader_ran_dry=False)
    assert resume.resume_states(states) == states
    assert _walk_from(states) == [[], next_epoch]  # episode 0 ends at once, then episode 1
    fresh = {"episode": 0, "global_step": 0, "total_consumed_prompts": 0, "data_loader_state_dict": {}}
    assert resume.resume_states(fresh) == fresh  # no checkpoint: nothing to move


@pytest.mark.parametrize("cls", [resume._ResumePPOTrainer, resume._ResumeTrainingActor, _ReplayPPOTrainer,
                                 _ReplayTrainingActor])
def test_every_controller_the_launcher_starts_takes_its_start_episode_from_the_resume(cls):
    # Upstream's `fit` (sync) and `PPOTrainerAsync.fit` (through the training actor) read it here.
    assert cls.init_checkpoint_states.__qualname__ != "BasePPOTrainer.init_checkpoint_states"
    assert resume.EpisodeResume in cls.__mro__


def test_the_launcher_with_replay_off_starts_the_resume_controllers():
    with contextlib.ExitStack() as stack:
        _install_resume_classes(stack)
        assert upstream_sync.PPOTrainer is resume.ResumePPOTrainer
        assert upstream_async.PPOTrainerAsync is resume.ResumePPOTrainerAsync
    assert upstream_sync.PPOTrainer is not resume.ResumePPOTrainer  # restored after the run
    assert undecorated(resume.ResumePPOTrainerAsync).actor_classes["TrainingActor"] is resume.ResumeTrainingActor
    assert issubclass(_ReplayPPOTrainerAsync, resume._ResumePPOTrainerAsync)
