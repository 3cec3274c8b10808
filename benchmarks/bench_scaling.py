"""Data-parallel scaling: samples/s of one GPU against 2, 4, ... GPUs, as processes (fastnn.distributed) and as
one process (devices=N).

    python benchmarks/bench_scaling.py --data DIR [--worlds 1,2] [--workloads mlp4096,logreg,mlp128]

Each world size is one set of processes started here (spawn, one GPU each, the NCCL id passed through pipes, as
tests/test_distributed.py), then one process training with devices=world. Every rank trains the same model from
the same weights: one untimed `fit` epoch (setup, capture), then a timed `fit`; throughput is the global samples
of the timed epochs over the slowest rank's summed device-event epoch times (devices=: the first GPU's, which
every all-reduce keeps in step with the others). World 1 runs twice: without a group (the plain graph engine)
and as a group of one (the all-reduces included: their cost on one GPU). All are measured in this one call.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import traceback

import numpy as np

import fastnn

WORKLOADS = {  # name: (sizes, lr, global batch, timed epochs, samples, precision)
    "mlp4096": ([784, 4096, 4096, 4096, 10], 0.01, 8192, 3, 60000, "mixed"),
    "logreg": ([784, 10], 0.1, 128, 5, 60000, "mixed"),
    "mlp128": ([784, 128, 128, 128, 10], 0.003, 32, 2, 32000, "mixed"),
}


def _train(name: str, data_dir: str, group, devices: int = 1) -> tuple[float, int, float]:
    """(timed seconds, timed samples, final train loss) of one rank (or of one process on `devices` GPUs)."""
    sizes, lr, batch, epochs, samples, precision = WORKLOADS[name]
    x, y = fastnn.datasets.load("fashion-mnist", root=data_dir, download=False)[:2]
    x, y = x[:samples], y[:samples]
    with fastnn.Trainer(fastnn.MLP(sizes), fastnn.SGD(lr=lr, momentum=0.9), batch_size=batch, precision=precision,
                        device="cuda", engine="graph", seed=0, distributed=group, devices=devices) as t:  # fmt: skip
        t.fit(x, y, epochs=1, progress=False)
        h = t.fit(x, y, epochs=epochs, progress=False)
        return float(np.sum(h["seconds"])), epochs * len(x), float(h[-1]["train_loss"])


def _rank(rank: int, world: int, conn, names: list[str], data_dir: str, plain: bool, devices: int,
          high: bool) -> None:  # fmt: skip
    from fastnn.engine import cuda_engine

    cuda_engine.COMM_HIGH_PRIORITY = high
    try:
        if plain:
            conn.send(("ok", [_train(n, data_dir, None, devices) for n in names]))
            return
        from fastnn import distributed

        if rank == 0:
            uid = distributed.unique_id()
            conn.send(("uid", uid))
        else:
            uid = conn.recv()
        with distributed.init(rank, world, uid=uid, device=rank) as group:
            conn.send(("ok", [_train(n, data_dir, group) for n in names]))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


def run_world(
    world: int, names: list[str], data_dir: str, plain: bool = False, devices: int = 1, high: bool = False
) -> list[tuple[float, int, float]]:
    """Per workload: (slowest rank's timed seconds, timed samples, rank 0's final loss). plain: `world` processes
    without a group (1: the one-GPU baseline), each training on `devices` GPUs; high: all-reduces at high
    stream priority (cuda_engine.COMM_HIGH_PRIORITY)."""
    ctx = mp.get_context("spawn")
    ends, procs = [], []
    for rank in range(world):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_rank, args=(rank, world, child, names, data_dir, plain, devices, high),
                           daemon=True)  # fmt: skip
        proc.start()
        ends.append(parent)
        procs.append(proc)
    answers = []
    if not plain:
        tag, uid = ends[0].recv()
        if tag != "uid":
            raise RuntimeError(uid)
        for end in ends[1:]:
            end.send(uid)
    for end in ends:
        tag, payload = end.recv()
        if tag != "ok":
            raise RuntimeError(payload)
        answers.append(payload)
    for proc in procs:
        proc.join()
    return [(max(a[i][0] for a in answers), answers[0][i][1], answers[0][i][2]) for i in range(len(names))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--worlds", default="1,2")
    ap.add_argument("--workloads", default="mlp4096,logreg,mlp128")
    ap.add_argument("--comm-priority", choices=("default", "high", "both"), default="default",
                    help="stream priority of the all-reduces (both: a row for each)")  # fmt: skip
    args = ap.parse_args()
    names = args.workloads.split(",")
    rows = {"1 GPU, no group": run_world(1, names, args.data, plain=True)}
    highs = {"default": [False], "high": [True], "both": [False, True]}[args.comm_priority]
    for world in (int(w) for w in args.worlds.split(",")):
        for high in highs:
            tag = ", comm high" if high else ""
            rows[f"{world} GPU{'s' if world > 1 else ''}, NCCL group{tag}"] = run_world(world, names, args.data,
                                                                                         high=high)  # fmt: skip
            if world > 1:
                rows[f"{world} GPUs, devices={world}{tag}"] = run_world(1, names, args.data, plain=True, devices=world,
                                                                       high=high)  # fmt: skip
    base = rows["1 GPU, no group"]
    for i, name in enumerate(names):
        sizes, _, batch, *_ = WORKLOADS[name]
        print(f"\n{name} {sizes} global batch {batch}")
        print(f"  {'run':32} {'samples/s':>12} {'vs 1 GPU':>9} {'final loss':>11}")
        for label, res in rows.items():
            seconds, samples, loss = res[i]
            rate = samples / seconds
            print(f"  {label:32} {rate:12.0f} {rate / (base[i][1] / base[i][0]):8.2f}x {loss:11.4f}")


if __name__ == "__main__":
    main()
