"""Where the CPU training path loses time, measured side by side on this machine (issue #11).

Each line compares two settings of one knob in the same process, alternating them over
`--rounds` rounds (medians reported), so the ratio holds even on a busy machine:

1. dtype: a 1024 x 1024 matmul, and one forward + backward of a causal LM (SmolLM2-135M's shape,
   random weights) on `--batch` x `--tokens`, in fp32 and bf16. bf16 is what the CPU platform used
   everywhere before it chose by CPU (`evaluation.hardware.choose_cpu_dtype`).
2. threads: the same forward + backward with 1 thread and with every core (what the platform
   gives each Ray worker through OMP_NUM_THREADS).
3. gradient checkpointing: the same forward + backward with and without it.
4. optimizer: one AdamW step over the model's parameters with torch's default (per-tensor loop),
   torch's fused kernel (what the platform configures) and DeepSpeed's CPU Adam, when its op
   builds here (its first build takes minutes; the build time is reported too).

    python benchmarks/cpu_path.py [--rounds 3] [--batch 4] [--tokens 256] [--skip-bf16-model]

The last line printed is one JSON object, with the CPU it ran on.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evaluation.hardware import choose_cpu_dtype, cpu_description  # noqa: E402


def side_by_side(settings: dict, rounds: int) -> dict[str, float]:
    """Median seconds of each setting's call, the settings taking turns within every round (so a
    change in the machine's load falls on all of them alike). A setting is a function that
    prepares its knob and returns the call to time."""
    times = {name: [] for name in settings}
    for _ in range(rounds):
        for name, prepare in settings.items():
            call = prepare()
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    return {name: round(statistics.median(t), 3) for name, t in times.items()}


def matmul_gflops(dtype, seconds: float = 1.0) -> float:
    import torch

    a, b = torch.randn(1024, 1024, dtype=dtype), torch.randn(1024, 1024, dtype=dtype)
    a @ b
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        n += 1
    return 2 * 1024 ** 3 * n / (time.perf_counter() - t0) / 1e9


def smollm2_shaped(dtype):
    """A random causal LM of SmolLM2-135M's shape (30 layers, hidden 576, 9 heads, 3 KV heads)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(dtype)


def forward_backward(model, batch: int, tokens: int):
    import torch

    ids = torch.randint(0, model.config.vocab_size, (batch, tokens))

    def step():
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds in which the settings take turns (default 3)")
    parser.add_argument("--batch", type=int, default=4, help="sequences per forward + backward (default 4)")
    parser.add_argument("--tokens", type=int, default=256, help="tokens per sequence (default 256)")
    parser.add_argument("--skip-bf16-model", action="store_true",
                        help="skip the bf16 forward + backward (minutes on a CPU without native bf16)")
    args = parser.parse_args()
    import os

    import torch

    cores = os.cpu_count() or 1
    torch.set_num_threads(cores)
    out = {"cpu": cpu_description(), "chosen_dtype": choose_cpu_dtype().name, "rounds": args.rounds,
           "batch": args.batch, "tokens": args.tokens}
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

    def with_threads(n):
        torch.set_num_threads(n)
        return step

    threads = side_by_side({f"{n}_threads": lambda n=n: with_threads(n) for n in (1, cores)}, args.rounds)
    torch.set_num_threads(cores)
    out["forward_backward_threads_s"] = threads
    print(f"threads: {threads}", flush=True)

    def with_checkpointing(on: bool):
        if on:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_disable()
        model.train()
        return step

    checkpointing = side_by_side({"off": lambda: with_checkpointing(False), "on": lambda: with_checkpointing(True)},
                                 args.rounds)
    model.gradient_checkpointing_disable()
    out["gradient_checkpointing_s"] = checkpointing
    print(f"gradient checkpointing: {checkpointing}", flush=True)

    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    optimizers = {"torch_adamw": torch.optim.AdamW(params, lr=1e-6, weight_decay=0.01),
                  "torch_adamw_fused": torch.optim.AdamW(params, lr=1e-6, weight_decay=0.01, fused=True)}
    t0 = time.perf_counter()
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        optimizers["deepspeed_cpu_adam"] = DeepSpeedCPUAdam(params, lr=1e-6, weight_decay=0.01, adamw_mode=True)
        out["deepspeed_cpu_adam_build_s"] = round(time.perf_counter() - t0, 1)
    except Exception as e:  # the op compiles C++ here; report why it could not
        out["deepspeed_cpu_adam_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    for optimizer in optimizers.values():
        optimizer.step()  # state allocated
    adam = side_by_side({name: lambda o=o: o.step for name, o in optimizers.items()}, args.rounds)
    out["adam_step_s"] = adam
    out["parameters"] = sum(p.numel() for p in params)
    print(f"optimizer step: {adam}", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
