"""Small helpers shared by the integration modules."""
import importlib.metadata

from openrlhf_replay import OPENRLHF_VERSION


def check_openrlhf_version() -> None:
    """Refuse to run against an OpenRLHF other than the pinned one: the seams may have moved."""
    found = importlib.metadata.version("openrlhf")
    if found != OPENRLHF_VERSION:
        raise RuntimeError(
            f"openrlhf-replay extends OpenRLHF {OPENRLHF_VERSION} but openrlhf {found} is installed; "
            f"install the pinned release: pip install --no-deps openrlhf=={OPENRLHF_VERSION}"
        )


def undecorated(actor_class):
    """The plain Python class behind a `@ray.remote` class, so that it can be subclassed.

    Ray refuses to subclass an actor class directly (ActorClassInheritanceException). This reads
    Ray's own record of the original class (Ray-internal; ray is pinned to 2.55.0).
    """
    try:
        return actor_class.__ray_metadata__.modified_class.__ray_actor_class__
    except AttributeError as e:
        raise TypeError(f"{actor_class!r} is not a Ray actor class of the pinned Ray version") from e


def world_size(args) -> int:
    """DeepSpeed ranks of the policy actor group: nodes x GPUs per node."""
    return args.actor.num_nodes * args.actor.num_gpus_per_node


def data_parallel_ranks(args) -> int:
    """Ranks that each take their own chunk of a batch (ring-attention / TP groups share one)."""
    return world_size(args) // args.ds.ring_attn_size // args.ds.tensor_parallel_size
