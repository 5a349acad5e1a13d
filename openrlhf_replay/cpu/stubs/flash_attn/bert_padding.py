"""Pure-torch versions of the flash_attn.bert_padding helpers OpenRLHF imports."""
import torch
import torch.nn.functional as F
from einops import rearrange  # noqa: F401  (re-exported: OpenRLHF imports it from here)


def index_first_axis(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """x[indices] along the first axis. x: (N, ...), indices: (n,) -> (n, ...)."""
    return x[indices]


def unpad_input(hidden_states: torch.Tensor, attention_mask: torch.Tensor, unused_mask=None):
    """Drop padded positions. hidden_states: (B, T, ...), attention_mask: (B, T) of 0/1.

    Returns (packed (nnz, ...), indices (nnz,), cu_seqlens (B+1,) int32, max_seqlen, seqlens (B,)),
    the same tuple flash_attn >= 2.7 returns.
    """
    mask = attention_mask if unused_mask is None else attention_mask + unused_mask
    seqlens = mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    packed = hidden_states.reshape(-1, *hidden_states.shape[2:])[indices]
    return packed, indices, cu_seqlens, int(seqlens.max().item()) if len(seqlens) else 0, seqlens


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """Inverse of unpad_input. hidden_states: (nnz, ...) -> (batch, seqlen, ...), zeros elsewhere."""
    out = hidden_states.new_zeros(batch * seqlen, *hidden_states.shape[1:])
    out[indices] = hidden_states
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])
