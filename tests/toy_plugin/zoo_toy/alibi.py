"""ALiBi positions (Press et al., 2022), supplied as one component: a linear penalty on
attention scores by distance, a slope per head. The shared decoder does everything else."""

import torch

from zoo.nn import PositionScheme


class ALiBi(PositionScheme):
    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads

    def score_bias(self, q_len, k_len, device):
        heads = torch.arange(1, self.n_heads + 1, device=device)
        slopes = 2.0 ** (-8.0 * heads / self.n_heads)  # (H,)
        queries = torch.arange(k_len - q_len, k_len, device=device)[:, None]  # (T, 1)
        keys = torch.arange(k_len, device=device)[None]  # (1, S)
        return -slopes[:, None, None] * (queries - keys).clamp(min=0)  # (H, T, S)


def alibi(config) -> ALiBi:
    return ALiBi(config.n_heads)
