"""The step's histograms in TensorBoard: upstream's real `TensorboardLogger` switched to
`HistogramTensorboardLogger` by the controller, writing a real event file read back here."""
import numpy as np
import pytest
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
from openrlhf.utils import get_strategy
from openrlhf.utils.logging_utils import TensorboardLogger

from openrlhf_replay.logging_utils import HistogramTensorboardLogger
from openrlhf_replay.trainer.ppo_trainer import _ReplayPPOTrainer


def _events(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return acc


def _logger(make_args, tmp_path):
    args = make_args("--logger.tensorboard_dir", tmp_path, "--logger.wandb.run_name", "tb")
    return HistogramTensorboardLogger(args)


def test_staged_arrays_are_drawn_beside_the_scalars_once(make_args, tmp_path):
    logger = _logger(make_args, tmp_path)
    logger.stage({"replay/replayed_age": np.array([1, 2, 2]), "replay/replayed_uses": np.zeros(0, np.int64)})
    logger.log_train(3, {"replay/replayed": 3.0, "replay/skip_rate": 0.25})
    logger.log_train(4, {"replay/replayed": 0.0})  # nothing staged for it
    logger.close()
    acc = _events(tmp_path / "tb")
    assert acc.Tags()["histograms"] == ["train/replay/replayed_age"]  # an empty array draws nothing
    (event,) = acc.Histograms("train/replay/replayed_age")
    h = event.histogram_value
    assert (event.step, h.num, h.min, h.max, h.sum) == (3, 3, 1, 2, 5)
    assert {e.step: e.value for e in acc.Scalars("train/replay/replayed")} == {3: 3.0, 4: 0.0}
    assert [e.value for e in acc.Scalars("train/replay/skip_rate")] == [0.25]  # any status scalar, as upstream


@pytest.mark.parametrize("values", [np.ones((2, 2)), np.array(["a"]), 3.0])
def test_a_histogram_must_be_a_flat_array_of_numbers(make_args, tmp_path, values):
    logger = _logger(make_args, tmp_path)
    with pytest.raises(ValueError, match="'replay/x': expected a 1-D array of numbers.*scalars in the status"):
        logger.stage({"replay/x": values})
    logger.close()


def _controller(make_args, tmp_path, *extra):
    """The synchronous controller as far as `_setup_replay` needs it, over upstream's real logger
    (its Ray groups and models are not built: the experience maker is driven below as in its tests)."""
    args = make_args("--logger.tensorboard_dir", tmp_path, "--logger.wandb.run_name", "tb", *extra)
    ctl = object.__new__(_ReplayPPOTrainer)
    ctl.args, ctl.strategy, ctl.kl_ctl = args, get_strategy(args), FixedKLController(0.0)
    ctl.tokenizer = type("Tokenizer", (), {"pad_token_id": 0})()
    ctl.actor_model_group = ctl.critic_model_group = ctl.reward_model_group = ctl.reference_model_group = None
    ctl.tensorboard_logger = TensorboardLogger(args)
    ctl._setup_replay(16, [])
    return ctl


def test_the_controller_draws_the_buffers_arrays_of_the_step(make_args, tmp_path, rollout_samples,
                                                              experience_maker_cls):
    ctl = _controller(make_args, tmp_path, "--replay.mode", "uniform", "--replay.warmup", "1")
    assert type(ctl.tensorboard_logger) is HistogramTensorboardLogger
    maker = ctl.experience_maker
    maker.make_experience = experience_maker_cls(RemoteExperienceMaker, ctl.args).make_experience  # fake_forward
    for step in range(2):
        maker.step = step
        maker.make_experience_batch(rollout_samples(8, 4, seed=step))
        ctl.tensorboard_logger.stage(ctl.step_histograms())
        ctl.tensorboard_logger.log_train(step + 1, {})
    ctl.tensorboard_logger.close()
    acc = _events(tmp_path / "tb")
    assert sorted(acc.Tags()["histograms"]) == ["train/replay/replayed_age", "train/replay/replayed_uses"]
    for tag, value in (("train/replay/replayed_age", 1), ("train/replay/replayed_uses", 1)):
        (event,) = acc.Histograms(tag)  # the warm-up step replayed nothing
        h = event.histogram_value
        assert event.step == 2 and h.num == len(maker.composition.replayed) == 16 and h.min == h.max == value


def test_replay_off_stages_no_histogram(make_args, tmp_path):
    ctl = _controller(make_args, tmp_path, "--replay.mode", "none")
    assert ctl.step_histograms() == {}
