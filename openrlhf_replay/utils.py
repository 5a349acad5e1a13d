"""Small helpers shared by the integration modules."""
import hashlib
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


def state_digest(state) -> str:
    """A short sha256 of a nested state dict (dicts, lists, numpy arrays, scalars), equal for equal
    contents: logged when the replay buffer is saved and restored, so a resume can be checked
    against the file and the buffer that wrote it."""
    import numpy as np

    h = hashlib.sha256()

    def feed(value) -> None:
        if isinstance(value, dict):
            h.update(b"{")
            for key in sorted(value, key=str):
                h.update(repr(key).encode())
                feed(value[key])
            h.update(b"}")
        elif isinstance(value, (list, tuple)):
            h.update(b"[")
            for item in value:
                feed(item)
            h.update(b"]")
        elif isinstance(value, np.ndarray):
            h.update(f"{value.dtype.str}{value.shape}".encode())
            h.update(np.ascontiguousarray(value).tobytes())
        elif isinstance(value, np.generic):
            feed(value.item())
        else:
            h.update(repr(value).encode())

    feed(state)
    return h.hexdigest()[:16]
