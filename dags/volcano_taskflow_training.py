"""TaskFlow: a Python function is the distributed training script (`@task.volcano_pytorch`).

The function runs on every rank of a Volcano PyTorch Job (master + workers); it imports what it
needs itself, since only its source reaches the pods. Its arguments come from upstream tasks
(JSON-serialisable), and rank 0's return value comes back as `result` in the task's XCom.
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG, task

with DAG(
    dag_id="volcano_taskflow_training",
    schedule=None,
    start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    catchup=False,
    tags=["volcano", "pytorch", "example"],
    params={"namespace": "default"},
) as dag:

    @task
    def hyperparameters() -> dict:
        return {"epochs": 20, "lr": 0.1}

    @task.volcano_pytorch(
        namespace="{{ params.namespace }}",
        image="pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime",
        worker_replicas=2,
        container_resources={"cpu": "1", "memory": "2Gi"},
        job_timeout=3600,
    )
    def train(config: dict) -> dict:
        import torch
        import torch.distributed as dist
        from torch import nn

        dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR/PORT come from Volcano
        rank, world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(rank)
        x = torch.randn(128, 1)
        y = 3 * x - 1
        model = nn.parallel.DistributedDataParallel(nn.Linear(1, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
        for epoch in range(config["epochs"]):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            if rank == 0:
                print(f"epoch {epoch + 1} loss {loss.item():.4f}", flush=True)
        ranks = torch.tensor([rank])
        dist.all_reduce(ranks)  # every rank takes part: 0 + 1 + 2
        weight, bias = (p.item() for p in model.module.parameters())
        dist.destroy_process_group()
        return {"final_loss": loss.item(), "weight": weight, "bias": bias, "rank_sum": int(ranks.item()),
                "world_size": world}

    @task
    def report(summary: dict) -> str:
        result = summary["result"]
        return f"trained on {result['world_size']} ranks: loss {result['final_loss']:.4f}, w={result['weight']:.2f}"

    report(train(hyperparameters()))
