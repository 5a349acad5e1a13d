"""The CPU platform layer on its own: activation, the run-time adaptations, the refusals, the
quickstart helpers. The whole pipeline runs in tests/pipeline/test_cpu_pipeline.py."""
import json
import os
import re
import socket
import subprocess
import sys
import textwrap

import pytest

from openrlhf_replay.cpu import launcher
from openrlhf_replay.cpu.progress import diagnose, step_summary
from openrlhf_replay.cpu.quickstart import ARITHMETIC, HUB, QuickstartError, prepare_data


def _python(code: str, **env) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter of this environment (the .pth hook runs at its start-up)."""
    full_env = {k: v for k, v in os.environ.items() if k != "OPENRLHF_REPLAY_DEVICE"}
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, env=full_env)


def test_the_hook_is_installed_in_this_environment():
    assert launcher.hook_file_installed(), "run bash scripts/setup_env.sh"
    assert launcher.version_errors() == []


def test_nothing_is_adapted_unless_the_platform_is_on():
    proc = _python("""
        import sys, torch
        assert "openrlhf_replay.cpu._hook" not in sys.modules
        try:
            torch.cuda.current_device()
        except (RuntimeError, AssertionError):
            print("untouched")
    """)
    assert proc.returncode == 0, proc.stderr
    assert "untouched" in proc.stdout


def test_every_adaptation_is_in_place_in_a_new_process_of_a_cpu_run():
    """What a Ray worker or a vLLM subprocess of a CPU run gets from the .pth hook, each checked
    by what it changes (a world-size-1 gloo group stands in for trainer + vLLM)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _python(f"""
        import torch
        assert torch.cuda.current_device() == torch.device("cpu")
        torch.cuda.set_device(0); torch.cuda.synchronize()
        assert torch.cuda.current_stream() is None

        from openrlhf.trainer.ppo_utils.replay_buffer import NaiveReplayBuffer
        assert NaiveReplayBuffer(4).target_device == torch.device("cpu")

        import openrlhf.utils.deepspeed.deepspeed as ds
        config = ds.get_train_ds_config(False, optim_config={{"type": "AdamW", "params": {{"lr": 1.0}}}})
        assert config["optimizer"]["params"] == {{"lr": 1.0, "torch_adam": True, "fused": True}}

        from openrlhf.utils.distributed_util import stateless_init_process_group
        group = stateless_init_process_group("127.0.0.1", {port}, 0, 1, None)
        weight = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
        group.broadcast(weight, src=0, stream=torch.cuda.current_stream())
        assert weight.sum().item() == 15

        import vllm.model_executor.layers.utils as vllm_utils
        layer = torch.nn.Module()
        layer.weight = torch.nn.Parameter(torch.randn(4, 8), requires_grad=False)
        vllm_utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
        assert layer.weight.numel() == 32  # kept, not swapped for an empty packed copy
        x = torch.randn(2, 8)
        layer.weight.data.mul_(2)  # a later load_weights writes into the same parameter
        assert torch.allclose(layer.cpu_linear(x, layer.weight, None), x @ layer.weight.T)

        from openrlhf.trainer.ray.vllm_worker_wrap import WorkerWrap
        import openrlhf.trainer.ray as trainer_ray
        assert WorkerWrap.update_weight.__openrlhf_replay_cpu__
        assert trainer_ray.create_vllm_engines.__openrlhf_replay_cpu__
        from openrlhf.trainer.ray.launcher import RayActorGroup
        assert RayActorGroup.async_init_model_from_pretrained.__openrlhf_replay_cpu__
        print("all adapted")
    """, OPENRLHF_REPLAY_DEVICE="cpu")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "all adapted" in proc.stdout


def test_the_prompt_order_follows_the_seed_in_every_process():
    """The controller's prompt loader (no torch.distributed there, so no DistributedSampler) shuffles
    by --train.seed: two processes with one seed agree, another seed differs. Unpatched, each
    process drew its own order (the sample-efficiency lab's seeds were not paired)."""
    code = """
        import openrlhf.utils.deepspeed.deepspeed as ds
        for seed in {seeds}:
            class Strategy:
                pass
            Strategy.seed = seed
            loader = ds.DeepspeedStrategy.setup_dataloader(Strategy(), list(range(40)), 1, True, True)
            print([int(x) for x in loader])
    """
    # Two processes (each imports DeepSpeed, ~16 s here): seeds 3 and 4 in one, seed 3 in the other.
    both, alone = (_python(code.format(seeds=seeds), OPENRLHF_REPLAY_DEVICE="cpu") for seeds in ((3, 4), (3,)))
    assert both.returncode == alone.returncode == 0, (both.stderr + alone.stderr)[-3000:]
    first, other = both.stdout.strip().splitlines()[-2:]
    again = alone.stdout.strip().splitlines()[-1]
    assert first == again and first != other
    assert first != str(list(range(40)))  # still shuffled


@pytest.mark.parametrize("dtype, torch_dtype", [("fp32", "float32"), ("bf16", "bfloat16")])
def test_every_process_computes_in_the_one_chosen_dtype(dtype, torch_dtype):
    """The actor's weights, DeepSpeed's mixed precision (training and eval configs) and the dtype a
    weight broadcast arrives in all follow OPENRLHF_REPLAY_CPU_DTYPE, whatever --ds.param_dtype says;
    a weight whose dtype differs from vLLM's is refused instead of being loaded."""
    proc = _python(f"""
        import types, torch
        from openrlhf.utils.utils import convert_to_torch_dtype
        assert convert_to_torch_dtype("bf16") == torch.{torch_dtype}
        try:
            convert_to_torch_dtype("int8")
        except ValueError:
            pass  # upstream's refusal of unknown names is kept
        else:
            raise AssertionError("int8 accepted")

        import openrlhf.utils.deepspeed.deepspeed as ds
        for config in (ds.get_train_ds_config(False, param_dtype="bf16"), ds.get_eval_ds_config(False, param_dtype="fp16")):
            assert config["bf16"]["enabled"] is {dtype == "bf16"} and config["fp16"]["enabled"] is False, config

        from openrlhf.trainer.ray.vllm_worker_wrap import WorkerWrap
        wrap = object.__new__(WorkerWrap)
        wrap.model_config = types.SimpleNamespace(dtype=torch.{torch_dtype})
        other = torch.bfloat16 if torch.{torch_dtype} == torch.float32 else torch.float32
        try:
            wrap.update_weight("lm_head.weight", other, (2, 2))
        except TypeError as e:
            assert "trainer sends" in str(e)
        else:
            raise AssertionError("a weight of another dtype was accepted")
        print("dtype ok")
    """, OPENRLHF_REPLAY_DEVICE="cpu", OPENRLHF_REPLAY_CPU_DTYPE=dtype)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "dtype ok" in proc.stdout
    assert f"cpu platform: model weights in {torch_dtype}" in proc.stdout


def test_vllm_engines_are_created_with_the_chosen_dtype_and_whole_prompt_prefill():
    """Upstream's `create_vllm_engines` passes dtype="bfloat16"; the platform's stand-in for its actor
    class replaces it and adds the CPU engine arguments the harness uses too, through a real Ray
    actor class's `options(...).remote(...)`."""
    import ray

    from openrlhf_replay.cpu.patches import CpuEngine

    @ray.remote(num_cpus=0)
    class Engine:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

        def get(self):
            return self.kwargs

    ray.init(num_cpus=1, include_dashboard=False, address="local")
    try:
        engine = CpuEngine(Engine, "float32").options(name="engine-dtype-test").remote(
            model="m", dtype="bfloat16", seed=1)
        kwargs = ray.get(engine.get.remote())
        assert kwargs["dtype"] == "float32" and kwargs["seed"] == 1
        assert kwargs["enable_chunked_prefill"] is False
    finally:
        ray.shutdown()


CPU_OK = {"--vllm.num_engines": "1", "--vllm.sync_backend": "gloo", "--vllm.enforce_eager": None,
          "--ds.attn_implementation": "sdpa"}


def _argv(flags: dict) -> list[str]:
    return [x for flag, value in flags.items() if value is not False for x in (flag, value) if x is not None]


def test_a_cpu_ready_command_line_passes(make_args):
    assert launcher.arg_errors(make_args(*_argv(CPU_OK))) == []


@pytest.mark.parametrize("change, fragment", [
    ({"--vllm.sync_backend": "nccl"}, "--vllm.sync_backend gloo"),
    ({"--vllm.sync_backend": "nccl", "--train.colocate_all": None}, "NCCL and CUDA IPC need CUDA"),
    ({"--vllm.num_engines": "0"}, "only with vLLM"),
    ({"--vllm.enable_sleep": None}, "sleep"),
    ({"--vllm.tensor_parallel_size": "2"}, "--vllm.tensor_parallel_size 1"),
    ({"--vllm.enforce_eager": False}, "pass --vllm.enforce_eager"),
    ({"--ds.attn_implementation": "flash_attention_2"}, "flash-attention"),
    ({"--ds.ring_attn_size": "2"}, "flash-attention"),
    ({"--ds.param_dtype": "fp16"}, "no fast fp16 kernels"),
    ({"--ds.adam_offload": None}, "already"),
    ({"--train.enable_ema": None}, "EMA"),
    ({"--vllm.sync_with_ray": None}, "sync_with_ray"),
])
def test_what_the_cpu_cannot_run_is_refused_with_its_fix(make_args, change, fragment):
    errors = launcher.arg_errors(make_args(*_argv({**CPU_OK, **change})))
    assert any(fragment in e for e in errors), errors


def test_packed_samples_run_with_sdpa(make_args, tmp_path):
    """Upstream packs samples with dynamic batching and then asks for flash-attention; the platform
    accepts packing and trains it with sdpa, whose log-probs through upstream's Actor equal the
    padded batch's: transformers keeps packed rows apart by their position ids."""
    import torch
    from openrlhf.models import Actor
    from transformers import Qwen3Config, Qwen3ForCausalLM

    assert launcher.arg_errors(make_args(*_argv({**CPU_OK, "--ds.packing_samples": None}))) == []
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=32, intermediate_size=128)
    Qwen3ForCausalLM(config).save_pretrained(tmp_path)
    lengths = [9, 5, 7]  # real tokens per row, right-padded to 9
    sequences = torch.randint(1, 64, (3, 9))
    attention_mask = (torch.arange(9) < torch.tensor(lengths)[:, None]).long()
    action_mask = attention_mask[:, 1:][:, -4:].bool()
    log_probs = []
    for packed in (False, True):
        actor = Actor(str(tmp_path), attn_implementation="sdpa", packing_samples=packed)
        actor.model.float()  # exact comparison: fp32 (upstream loads bf16 or fp16 only)
        log_probs.append(actor(sequences, action_mask, attention_mask=attention_mask))
    assert torch.allclose(log_probs[0], log_probs[1], atol=1e-5), (log_probs[0] - log_probs[1]).abs().max()


def test_an_unknown_device_value_stops_the_launcher(monkeypatch):
    monkeypatch.setenv("OPENRLHF_REPLAY_DEVICE", "tpu")
    with pytest.raises(launcher.CpuPlatformError, match="OPENRLHF_REPLAY_DEVICE"):
        launcher.activate()


def test_forcing_cuda_leaves_the_platform_off(monkeypatch):
    monkeypatch.setenv("OPENRLHF_REPLAY_DEVICE", "cuda")
    assert launcher.activate() is False


# ------------------------------------------------------------------------------------ quickstart

def _gsm8k_file(path, answers):
    rows = [{"question": f"Q{i}?", "answer": answer} for i, answer in enumerate(answers)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_prepare_data_writes_prompts_and_gold_labels(tmp_path):
    source = _gsm8k_file(tmp_path / "gsm8k.jsonl", ["48/2 = 24\n#### 72", "a #### b #### 1,234,567", "#### -3.5 "])
    out = tmp_path / "prompts.jsonl"
    assert prepare_data(source, out, 3) == 3
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["label"] for r in rows] == ["72", "1234567", "-3.5"]
    assert rows[0]["prompt"].startswith("Q0?\n") and "\\boxed{}" in rows[0]["prompt"]
    assert set(rows[0]) == {"prompt", "label"}


def test_the_default_arithmetic_problems_carry_their_right_answers_and_need_no_data_file(tmp_path):
    out = tmp_path / "prompts.jsonl"
    assert prepare_data(ARITHMETIC, out, 8, easiest=True) == 8
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    kinds = {r"What is (\d) \+ (\d)\?": lambda a, b: a + b,
             r"Tom has (\d+) apples and gives away (\d)\. How many apples does Tom have left\?": lambda a, b: a - b,
             r"What is (\d+) - (\d)\?": lambda a, b: a - b,
             r"Tom has (\d) apples and buys (\d) more\. How many apples does Tom have now\?": lambda a, b: a + b}
    seen = []
    for row in rows:
        question, instruction = row["prompt"].split("\n")
        assert "\\boxed{}" in instruction
        [(kind, m)] = [(k, m) for k in kinds if (m := re.fullmatch(k, question))]
        assert row["label"] == str(kinds[kind](int(m[1]), int(m[2]))) and int(row["label"]) > 0
        seen.append(kind)
    assert seen == [*kinds, *kinds]  # the kinds take turns
    again = tmp_path / "again.jsonl"
    prepare_data(ARITHMETIC, again, 8)
    assert again.read_text() == out.read_text()  # seeded: every run trains on the same problems


def test_prepare_data_easiest_puts_single_digit_answers_then_short_solutions_first(tmp_path):
    answers = ["long long #### 12", "short #### 10", "a much longer one #### 7", "tiny #### 5", "mid one #### 3"]
    source = _gsm8k_file(tmp_path / "gsm8k.jsonl", answers)
    out = tmp_path / "prompts.jsonl"
    prepare_data(source, out, 4, easiest=True)
    assert [json.loads(line)["label"] for line in out.read_text().splitlines()] == ["5", "3", "7", "10"]
    prepare_data(source, out, 2)
    assert [json.loads(line)["label"] for line in out.read_text().splitlines()] == ["12", "10"]


def test_prepare_data_names_the_fix(tmp_path):
    with pytest.raises(QuickstartError, match="DATA="):
        prepare_data(tmp_path / "missing.jsonl", tmp_path / "out.jsonl", 4)
    bad = _gsm8k_file(tmp_path / "bad.jsonl", ["no marker"])
    with pytest.raises(QuickstartError, match="line 1 is not a GSM8K row"):
        prepare_data(bad, tmp_path / "out.jsonl", 1)
    (tmp_path / "torn.jsonl").write_text('{"question": "q", "ans')
    with pytest.raises(QuickstartError, match="line 1 is not JSON"):
        prepare_data(tmp_path / "torn.jsonl", tmp_path / "out.jsonl", 1)
    empty = _gsm8k_file(tmp_path / "empty.jsonl", [])
    with pytest.raises(QuickstartError, match="holds 0 problems"):
        prepare_data(empty, tmp_path / "out.jsonl", 1)
    assert not (tmp_path / "out.jsonl").exists()


def test_without_a_local_file_the_hub_is_tried_and_its_failure_named(tmp_path, monkeypatch):
    import datasets

    # Offline at once: `datasets` reads these variables when it is imported, which in a suite run
    # may have happened earlier in this process; unset, the hub is retried for 23 s here.
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(QuickstartError, match="openai/gsm8k.*DATA="):
        prepare_data(HUB, tmp_path / "out.jsonl", 4)


def _busy_port_error() -> str:
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        a.listen()
        try:
            b.bind(a.getsockname())
        except OSError as e:
            return f"{type(e).__name__}: {e}"
    raise AssertionError("binding a bound port succeeded")


@pytest.mark.parametrize("tail, cause, fix", [
    ([f"(PolicyModelActor pid=12) {_busy_port_error()}"], "Address already in use", "ss -ltnp"),
    (["(raylet) A worker died or was killed while executing a task by an unexpected system error.",
      "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory."],
     "OutOfMemoryError", "MODEL=tiny"),
    (["openrlhf_replay.cpu.CpuPlatformError: the vLLM engine failed to start: "
      "safetensors_rust.SafetensorError: Error while deserializing header: header too large."],
     "deserializing header", "models"),
    (["Traceback (most recent call last):", '  File "x.py", line 1', "KeyError: 'label'"], "KeyError: 'label'", None),
])
def test_diagnose_names_the_cause_and_its_fix(tmp_path, tail, cause, fix):
    log = tmp_path / "train.log"
    log.write_text("\n".join(["INFO starting", "Loading weights: 100%", *tail, "INFO shutting down"]) + "\n")
    text = diagnose(log)
    assert cause in text
    assert ("fix: " in text) == (fix is not None) and (fix is None or fix in text)


def test_diagnose_without_an_error_shows_the_last_lines(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("one\ntwo\n")
    assert diagnose(log).endswith("one\ntwo")
    assert "no log" in diagnose(tmp_path / "missing.log")


def test_step_summary_reads_the_logged_metrics():
    line = step_summary(2, {"rollout/reward_mean": 0.25, "replay/replayed": 8.0, "rollout/num_samples": 16.0,
                            "replay/size": 12.0, "policy_loss": -0.01, "timing/step_total": 41.3,
                            "timing/generation": 20.0, "timing/ppo_train": 18.0, "replay/overhead_s": 0.004}, 4)
    assert line.startswith("step 2/4: reward 0.25, replayed 8 + fresh 16, buffer 12")
    assert "41.3 s" in line and "replay work 0.004" in line


def test_preflight_passes_here_and_names_each_problem_with_its_fix(tmp_path, monkeypatch):
    from openrlhf_replay.cpu import quickstart

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert quickstart.preflight("tiny", tmp_path / "run") == []
    monkeypatch.setattr(quickstart, "available_memory_gib", lambda: 1.0)  # this machine has 24 GiB
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    problems = quickstart.preflight("smollm2", tmp_path / "run")
    assert len(problems) == 2
    assert "1.0 GiB of memory" in problems[0] and "MODEL=tiny" in problems[0]
    assert "unset it" in problems[1]
