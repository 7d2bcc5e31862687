"""Distributed training that reports its metrics to Airflow.

Trains y = 2x + 0.1 noise with DDP over gloo (every pod is a rank: Volcano's pytorch plugin sets
RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), evaluates on held-out data, and rank 0 writes the
metrics as JSON to /dev/termination-log. The kubelet keeps that message in the pod's status, and
VolcanoPyTorchJobOperator returns it as `result` in the task's XCom.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=20)
parser.add_argument("--model-uri", default="s3://models/linear/latest")
options = parser.parse_args()

dist.init_process_group(backend="gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)
x = torch.randn(256, 1)
y = 2 * x + 0.1 * torch.randn_like(x)
model = nn.parallel.DistributedDataParallel(nn.Linear(1, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(options.epochs):
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()  # gradients are averaged across every rank here
    optimizer.step()
    if rank == 0:
        print(f"epoch {epoch + 1}/{options.epochs} train loss {loss.item():.4f}", flush=True)

torch.manual_seed(1000)
held_out = torch.randn(512, 1)
with torch.no_grad():
    eval_loss = nn.functional.mse_loss(model(held_out), 2 * held_out).item()
if rank == 0:
    metrics = {"eval_loss": eval_loss, "world_size": world, "model_uri": options.model_uri}
    print("metrics", json.dumps(metrics), flush=True)
    if os.path.exists("/dev/termination-log"):
        with open("/dev/termination-log", "w") as out:
            json.dump(metrics, out)
dist.destroy_process_group()
