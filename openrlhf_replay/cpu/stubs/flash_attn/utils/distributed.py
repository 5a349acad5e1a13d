"""The one flash_attn.utils.distributed helper OpenRLHF imports (used only with ring attention)."""
import torch
import torch.distributed as dist


def all_gather(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Concatenate `tensor` from every rank of `group` along the first axis."""
    world = dist.get_world_size(group)
    out = tensor.new_empty((world * tensor.shape[0], *tensor.shape[1:]))
    dist.all_gather_into_tensor(out, tensor.contiguous(), group=group)
    return out
