"""The flags every real-pipeline test run on the CPU shares: one vLLM engine and one reference
rank, gloo weight sync, sdpa attention, ZeRO-2 in bf16, the prompt file's keys, and batches sized
for a tiny model (4 prompts x 4 rollouts a step, training batches of 8, 16 new tokens). Each test
adds its own replay, KL and checkpoint flags; argparse takes the last value of a flag given twice.
Also the log line a run writes when it saves or restores the replay buffer, and the histograms a
run draws in TensorBoard, read back."""
import re
from pathlib import Path

PLATFORM = [
    "--data.input_key", "prompt", "--data.label_key", "label", "--data.apply_chat_template",
    "--vllm.num_engines", "1", "--vllm.tensor_parallel_size", "1", "--vllm.sync_backend", "gloo",
    "--vllm.enforce_eager", "--ds.attn_implementation", "sdpa", "--ds.zero_stage", "2",
    "--ds.param_dtype", "bf16", "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
]
BATCHES = [
    "--rollout.batch_size", "4", "--rollout.n_samples_per_prompt", "4", "--rollout.micro_batch_size", "4",
    "--train.batch_size", "8", "--train.micro_batch_size", "4", "--rollout.max_new_tokens", "16",
    "--data.max_len", "128",
]
# A large constant step, so that a change of weights shows.
LARGE_LR = ["--actor.adam.lr", "1e-3", "--actor.lr_warmup_ratio", "0", "--actor.lr_scheduler", "constant"]
DIGEST = re.compile(r"replay: (saved|restored) (\d+) rollouts (?:to|from) global_step(\d+)\.npz \(state (\w+)\)")


def read_histograms(folder: Path) -> dict[str, dict[int, object]]:
    """{tag: {step: HistogramValue (num, min, max, sum, buckets)}} from the event files in `folder`
    (the histograms `HistogramTensorboardLogger` draws beside upstream's scalars)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"histograms": 0})
    acc.Reload()
    return {tag: {e.step: e.histogram_value for e in acc.Histograms(tag)} for tag in acc.Tags()["histograms"]}
