"""A small DDP training script for torchrun: every process is a rank; rank 0 writes TensorBoard
scalars to TB_LOGDIR (if set) and hands its final loss to Airflow via the termination message."""

import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def say(line: str) -> None:
    """One write per line: the processes of a pod share its stdout, and print() writes the text and
    the newline separately, so two ranks' lines could interleave."""
    print(line + "\n", end="", flush=True)


def main() -> None:
    dist.init_process_group("gloo")  # "nccl" on GPUs
    rank, world = dist.get_rank(), dist.get_world_size()
    say(f"rank {rank} of {world} (local rank {os.environ.get('LOCAL_RANK')}, pod {os.environ.get('HOSTNAME')})")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(rank)
    inputs = torch.randn(256, 8, generator=generator)
    targets = inputs.sum(dim=1, keepdim=True)
    writer = None
    if rank == 0 and os.environ.get("TB_LOGDIR"):
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(os.environ["TB_LOGDIR"])
    loss = torch.tensor(0.0)
    for step in range(int(os.environ.get("STEPS", "50"))):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        if writer is not None:
            writer.add_scalar("loss", loss.item(), step)
    if writer is not None:
        writer.close()
    final = loss.detach().clone()
    dist.all_reduce(final)
    if rank == 0:
        mean = final.item() / world
        say(f"final mean loss over {world} ranks: {mean:.4f}")
        with open("/dev/termination-log", "w") as out:
            json.dump({"loss": mean, "world_size": world}, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
