"""A small regression trained by the DeepSpeed engine on every rank of the hostfile (CPU: gloo).

Launched by `deepspeed` (which passes --local_rank and sets RANK/WORLD_SIZE) or by `mpirun`
(deepspeed.init_distributed() then discovers the ranks through mpi4py). Rank 0 prints the process
group and the loss averaged over all ranks, and hands the final loss to Airflow through its
termination message (the master copies it, so it becomes the task's XCom).
"""

import argparse
import json
import os
import socket

import deepspeed
import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--local_rank", type=int, default=-1)  # passed by the deepspeed launcher
    args = parser.parse_args()

    deepspeed.init_distributed(dist_backend="gloo")  # "nccl" on GPUs
    rank, world = dist.get_rank(), dist.get_world_size()
    members: list = [None] * world
    dist.all_gather_object(members, f"rank {rank} on {socket.gethostname()}")
    if rank == 0:
        print(f"process group of {world} ranks: {', '.join(members)}", flush=True)

    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    config = {
        "train_micro_batch_size_per_gpu": 32,
        "optimizer": {"type": "Adam", "params": {"lr": 0.01, "torch_adam": True}},
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    true_weights = torch.randn(16, 1, generator=torch.Generator().manual_seed(7))
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard of the data
    first = last = None
    for step in range(1, args.steps + 1):
        inputs = torch.randn(32, 16, generator=data)
        loss = torch.nn.functional.mse_loss(engine(inputs), inputs @ true_weights)
        engine.backward(loss)
        engine.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean /= world
        first = mean.item() if first is None else first
        last = mean.item()
        if rank == 0 and (step == 1 or step % 10 == 0):
            print(f"step {step} loss {last:.4f}", flush=True)
    if rank == 0:
        print(f"DeepSpeed trained {world} ranks: loss {first:.4f} -> {last:.4f}", flush=True)
        if os.path.exists("/dev/termination-log"):
            with open("/dev/termination-log", "w") as message:
                json.dump({"world_size": world, "first_loss": round(first, 4), "final_loss": round(last, 4)}, message)
    dist.barrier()
    # Before the interpreter ends: a process group left to it lets gloo's worker thread free a tensor while
    # Python finalizes, which aborts (SIGABRT, exit 134, in ProcessGroupGloo::runLoop; seen under mpirun).
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
