"""Training that resumes where it stopped, on every rank of a Volcano Job.

Rank 0 saves a checkpoint at the end of every epoch under $CHECKPOINT_DIR (the operator's
`checkpoint_dir`, resolved to this task instance's own directory on a shared volume), and every
attempt starts from the latest one: after a gang restart (a rank killed, a pod evicted, a lost node)
and after an Airflow retry of the task alike. It says so in the line the operator reports as the
result's `resumed_from`:

    [airflow-volcano] resumed from /checkpoints/<dag>/<task>/<run>/epoch-3.pt

On SIGTERM (the Job deleted, a restart, a preemption: the operator passes it on to the script) it
finishes the epoch under way (none if asked before the epoch's first step), saves, and exits, within
`termination_grace_period`. The ranks agree to stop: before every step they reduce "has any rank been
asked to stop", and all stop at the same step, before its collectives. The signal reaches each pod at
its own moment; a rank that stopped alone would leave its peers in a collective with a missing peer,
which fails with a gloo/NCCL error (exit code 1) before rank 0 has saved, and Volcano reads it as a
failure of its own.

Checkpoints belong to the newest generation (docs/failures.md "Checkpoints and resuming"): a gang's generation is
(AIRFLOW_TRY_NUMBER, VOLCANO_RESTART_COUNT), rank 0 claims CHECKPOINT_DIR for it at start, and a rank
writes only while no newer generation has claimed it. So ranks on a node cut off from the cluster, which
keep running while a restarted gang trains elsewhere, stop writing once it starts, instead of
overwriting its checkpoints with older ones.

It reports its progress in steps, the way the operator reads it (docs/waiting.md "How far is it"), on rank 0:

    [airflow-volcano] progress 12/24 steps

Environment: EPOCHS (default 6), STEPS_PER_EPOCH (default 1), EPOCH_SECONDS (a pause per epoch, spread
over its steps, default 0: the model is tiny), CHECKPOINT_EVERY (save every N epochs, default 1; the
last epoch is always saved). To watch a resume happen, CRASH_AT_EPOCH=N makes rank CRASH_RANK (default 1) exit with
CRASH_EXIT_CODE (default 137, as the OOM killer gives) after epoch N on the first attempt only
(VOLCANO_RESTART_COUNT 0, AIRFLOW_TRY_NUMBER 1).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

EPOCHS = int(os.environ.get("EPOCHS", "6"))
STEPS_PER_EPOCH = int(os.environ.get("STEPS_PER_EPOCH", "1"))
EPOCH_SECONDS = float(os.environ.get("EPOCH_SECONDS", "0"))
CHECKPOINT_EVERY = int(os.environ.get("CHECKPOINT_EVERY", "1"))
RANK, WORLD_SIZE = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
RESTARTS = int(os.environ.get("VOLCANO_RESTART_COUNT") or 0)
TRY_NUMBER = int(os.environ.get("AIRFLOW_TRY_NUMBER") or 1)
CHECKPOINTS = Path(os.environ.get("CHECKPOINT_DIR") or ".")
CLAIMS = ".airflow-volcano-generations"  # in CHECKPOINT_DIR: a file per generation that claimed it

stop_requested = False


def generation() -> tuple[int, int]:
    """This gang's generation: the Airflow try that submitted the Job, Volcano's restarts of it."""
    return TRY_NUMBER, RESTARTS


def newest_generation() -> tuple[int, int] | None:
    """The newest generation that claimed the directory. Claims are only ever added, so this only grows:
    no two gangs can both believe they are the newest."""
    claims = [tuple(int(part) for part in path.name.split("-")) for path in (CHECKPOINTS / CLAIMS).glob("*-*")
              if re.fullmatch(r"\d+-\d+", path.name)]
    return max(claims) if claims else None


def claim_checkpoints() -> bool:
    """Rank 0, at start: claim the directory for this generation; False if a newer one owns it already."""
    (CHECKPOINTS / CLAIMS).mkdir(parents=True, exist_ok=True)
    (CHECKPOINTS / CLAIMS / "{}-{}".format(*generation())).touch()
    return may_write_checkpoints()


def may_write_checkpoints() -> bool:
    """Before every save: no newer generation has claimed the directory."""
    newest = newest_generation()
    return newest is None or newest <= generation()


def report_progress(done: int, total: int, unit: str = "steps") -> None:
    """The line the operator reads as progress (no import needed: docs/waiting.md "How far is it")."""
    print(f"[airflow-volcano] progress {done}/{total} {unit}", flush=True)


def on_sigterm(signum: int, frame: object) -> None:
    global stop_requested
    stop_requested = True  # finish the step under way, save, exit


def any_rank_stopping(dist: object) -> bool:
    """Whether any rank has been asked to stop: every rank calls it at the same step, so all stop together."""
    if WORLD_SIZE == 1:
        return stop_requested
    import torch

    flag = torch.tensor([1 if stop_requested else 0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def latest_checkpoint() -> Path | None:
    found = [(int(match[1]), path) for path in CHECKPOINTS.glob("epoch-*.pt")
             if (match := re.fullmatch(r"epoch-(\d+)\.pt", path.name))]
    return max(found)[1] if found else None


class Superseded(Exception):
    """A newer generation owns the checkpoint directory: this one stops writing, and training."""


def save(epoch: int, model: object, optimizer: object, reason: str) -> Path:
    import torch

    if not may_write_checkpoints():
        raise Superseded(f"generation {generation()} (try, restarts) stops: generation {newest_generation()} owns "
                         f"{CHECKPOINTS}")
    path = CHECKPOINTS / f"epoch-{epoch}.pt"
    partial = path.with_suffix(".partial")
    torch.save({"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, partial)
    os.replace(partial, path)  # a checkpoint is whole or absent
    record = CHECKPOINTS / "latest.json.partial"  # and so is its record, which a reader may read any time
    record.write_text(json.dumps({"epoch": epoch, "path": str(path), "reason": reason}))
    os.replace(record, CHECKPOINTS / "latest.json")
    return path


def main() -> int:
    import torch
    import torch.distributed as dist

    signal.signal(signal.SIGTERM, on_sigterm)
    if WORLD_SIZE > 1:
        os.environ.setdefault("USE_LIBUV", "0")
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    first_epoch = 1
    if RANK == 0 and not claim_checkpoints():
        print(f"generation {generation()} (try, restarts) is older than {newest_generation()}, which owns "
              f"{CHECKPOINTS}: not training", flush=True)
        return 1
    checkpoint = latest_checkpoint()
    if checkpoint is not None:
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first_epoch = state["epoch"] + 1
        if RANK == 0:
            print(f"[airflow-volcano] resumed from {checkpoint}", flush=True)
    print(f"rank {RANK}/{WORLD_SIZE} starts at epoch {first_epoch} of {EPOCHS} (VOLCANO_RESTART_COUNT={RESTARTS}, "
          f"AIRFLOW_TRY_NUMBER={TRY_NUMBER})", flush=True)
    total_steps = EPOCHS * STEPS_PER_EPOCH
    stopping = False
    if RANK == 0:
        report_progress((first_epoch - 1) * STEPS_PER_EPOCH, total_steps)
    for epoch in range(first_epoch, EPOCHS + 1):
        for step in range(1, STEPS_PER_EPOCH + 1):
            time.sleep(EPOCH_SECONDS / STEPS_PER_EPOCH)  # where a real step reads its data
            if not stopping and any_rank_stopping(dist):
                stopping = True  # on every rank at this same step
                if step == 1:  # nothing of this epoch done yet: the previous one is the checkpoint
                    if RANK == 0 and epoch > 1:
                        path = save(epoch - 1, model, optimizer, "SIGTERM")
                        print(f"SIGTERM: saved checkpoint {path}, exiting", flush=True)
                    return 143
            inputs = torch.randn(64, 16, generator=torch.Generator().manual_seed(epoch * 100 + step * 10 + RANK))
            loss = ((model(inputs) - inputs.sum(1, keepdim=True)) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            if WORLD_SIZE > 1:
                for parameter in model.parameters():
                    dist.all_reduce(parameter.grad)
                    parameter.grad /= WORLD_SIZE
            optimizer.step()
            if RANK == 0:
                report_progress((epoch - 1) * STEPS_PER_EPOCH + step, total_steps)
        if RANK == 0 and (stopping or epoch % CHECKPOINT_EVERY == 0 or epoch == EPOCHS):
            path = save(epoch, model, optimizer, "SIGTERM" if stopping else "epoch end")
            print(f"epoch {epoch}/{EPOCHS} loss {loss.item():.4f}, saved {path}", flush=True)
        elif RANK == 0:
            print(f"epoch {epoch}/{EPOCHS} loss {loss.item():.4f}", flush=True)
        if stopping:  # asked in the middle of the epoch: it was finished and saved
            print(f"rank {RANK}: SIGTERM, stopping after epoch {epoch} (checkpoint saved)", flush=True)
            return 143
        if WORLD_SIZE > 1:
            dist.barrier()
        if (epoch == int(os.environ.get("CRASH_AT_EPOCH") or 0) and RANK == int(os.environ.get("CRASH_RANK", "1"))
                and RESTARTS == 0 and TRY_NUMBER == 1):
            print(f"rank {RANK}: crashing after epoch {epoch}, as asked (CRASH_AT_EPOCH)", flush=True)
            os._exit(int(os.environ.get("CRASH_EXIT_CODE", "137")))
    if WORLD_SIZE > 1:
        dist.destroy_process_group()
    print(f"rank {RANK}: trained {EPOCHS} epochs", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Superseded as superseded:
        print(superseded, flush=True)
        sys.exit(1)
