"""The processes of a run: one alone, or several under ``torchrun``, and the few collectives
the loop needs (a mean, an any, a max, a barrier)."""

from __future__ import annotations

import dataclasses
import datetime
import os

import torch
import torch.distributed as dist

from ..devices import check_device
from ..settings import Settings

__all__ = ["World", "any_rank", "barrier", "join", "max_rank", "mean"]


@dataclasses.dataclass(frozen=True)
class World:
    """This process's place in the run.

    Attributes:
        rank: this process's index (0 alone).
        size: the number of processes.
        device: where this process trains.
    """

    rank: int
    size: int
    device: torch.device

    @property
    def main(self) -> bool:
        """Whether this process logs and writes (rank 0)."""
        return self.rank == 0


def join(device: str | None) -> World:
    """Join the process group ``torchrun`` describes (``RANK``/``WORLD_SIZE`` set), or run
    alone. A rank that dies makes the others fail at the next collective within the timeout
    instead of hanging. A device this machine lacks is a ConfigError (zoo's one check)."""
    target = check_device(device)
    if "RANK" not in os.environ or dist.is_initialized():
        if dist.is_initialized():
            rank, size = dist.get_rank(), dist.get_world_size()
        else:
            rank, size = 0, 1
        return World(rank, size, target)
    cuda = target.type == "cuda"
    local = int(os.environ.get("LOCAL_RANK", "0"))
    target = torch.device(f"cuda:{local}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(target)
    timeout = datetime.timedelta(seconds=Settings.from_env().dist_timeout)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timeout)
    return World(dist.get_rank(), dist.get_world_size(), target)


def mean(value: float, world: World) -> float:
    """The mean of ``value`` over the ranks."""
    if world.size == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=world.device)  # NCCL: on the GPU
    dist.all_reduce(tensor)
    return float(tensor.item()) / world.size


def any_rank(flag: bool, world: World) -> bool:
    """Whether ``flag`` is set on any rank."""
    return bool(max_rank(int(flag), world))


def max_rank(value: int, world: World) -> int:
    """The largest ``value`` over the ranks."""
    if world.size == 1:
        return value
    tensor = torch.tensor([value], device=world.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def barrier(world: World) -> None:
    """Wait for every rank (nothing to wait for alone)."""
    if world.size > 1:
        dist.barrier()
