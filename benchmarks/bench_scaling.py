"""Data-parallel scaling: samples/s of one GPU against 2, 4, ... GPUs, as processes (fastnn.distributed) and as
one process (devices=N).

    python benchmarks/bench_scaling.py --data DIR [--worlds 1,2] [--workloads mlp4096,logreg,mlp128]
        [--sharded both] [--comm-priority both] [--carveout 0,16] [--channels 0,8] [--modes procs,devices]
        [--ceiling-only]

Each world size is one set of processes started here (spawn, one GPU each, the NCCL id passed through pipes, as
tests/test_distributed.py), then one process training with devices=world. Every rank trains the same model from
the same weights: one untimed `fit` epoch (setup, capture), then a timed `fit`; throughput is the global samples
of the timed epochs over the slowest rank's summed device-event epoch times (devices=: the first GPU's, which
every all-reduce keeps in step with the others). World 1 runs twice: without a group (the plain graph engine)
and as a group of one (the all-reduces included: their cost on one GPU). All are measured in this one call.

The "ceiling" row of N GPUs is one GPU training at batch B/N (one GPU's share of the global batch B), its
samples/s times N: what N GPUs would reach if summing the gradients cost nothing. Data parallelism cannot beat it
while every GPU applies the whole update, which does not shrink with the share (--ceiling-only measures just these
rows, on one GPU).
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import os
import traceback
from typing import NamedTuple

import numpy as np

import fastnn
from fastnn.engine import Tuning

WORKLOADS = {  # name: (sizes, lr, global batch, timed epochs, samples, precision)
    "mlp4096": ([784, 4096, 4096, 4096, 10], 0.01, 8192, 3, 60000, "mixed"),
    "logreg": ([784, 10], 0.1, 128, 5, 60000, "mixed"),
    "mlp128": ([784, 128, 128, 128, 10], 0.003, 32, 2, 32000, "mixed"),
}


class Knobs(NamedTuple):
    """Data-parallel settings under test: Tuning.sharded_update, comm_high_priority and gemm_sm_carveout (the
    engine's), NCCL_MAX_NCHANNELS (NCCL's)."""

    sharded: bool = False
    high: bool = False
    carveout: int = 0
    channels: int = 0  # 0: NCCL's choice

    def tuning(self) -> Tuning:
        return Tuning(sharded_update=self.sharded, comm_high_priority=self.high, gemm_sm_carveout=self.carveout)

    def label(self) -> str:
        tags = [", sharded"] if self.sharded else []
        tags += [", comm high"] if self.high else []
        tags += [f", carve {self.carveout}"] if self.carveout else []
        tags += [f", {self.channels} channels"] if self.channels else []
        return "".join(tags)


DEFAULT_KNOBS = Knobs()


def _train(name: str, data_dir: str, group, devices: int = 1, share: int = 1,
           tuning: Tuning | None = None) -> tuple[float, int, float]:  # fmt: skip
    """(timed seconds, timed samples, final train loss) of one rank (or of one process on `devices` GPUs);
    share: train at 1/share of the workload's batch; tuning: the data-parallel settings under test."""
    sizes, lr, batch, epochs, samples, precision = WORKLOADS[name]
    batch //= share
    x, y = fastnn.datasets.load("fashion-mnist", root=data_dir, download=False)[:2]
    x, y = x[:samples], y[:samples]
    with fastnn.Trainer(fastnn.MLP(sizes), fastnn.SGD(lr=lr, momentum=0.9), batch_size=batch, precision=precision,
                        device="cuda", engine="graph", seed=0, distributed=group, devices=devices,
                        tuning=tuning) as t:  # fmt: skip
        t.fit(x, y, epochs=1, progress=False)
        h = t.fit(x, y, epochs=epochs, progress=False)
        return float(np.sum(h["seconds"])), epochs * len(x), float(h[-1]["train_loss"])


def _rank(rank: int, world: int, conn, names: list[str], data_dir: str, plain: bool, devices: int, knobs: Knobs,
          share: int) -> None:  # fmt: skip
    if knobs.channels:  # read by NCCL when this process makes its first communicator
        os.environ["NCCL_MAX_NCHANNELS"] = str(knobs.channels)
    try:
        if plain:
            conn.send(("ok", [_train(n, data_dir, None, devices, share, knobs.tuning()) for n in names]))
            return
        from fastnn import distributed

        if rank == 0:
            uid = distributed.unique_id()
            conn.send(("uid", uid))
        else:
            uid = conn.recv()
        with distributed.init(rank, world, uid=uid, device=rank) as group:
            conn.send(("ok", [_train(n, data_dir, group, tuning=knobs.tuning()) for n in names]))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


def run_world(
    world: int,
    names: list[str],
    data_dir: str,
    plain: bool = False,
    devices: int = 1,
    knobs: Knobs = DEFAULT_KNOBS,
    share: int = 1,
) -> list[tuple[float, int, float]]:
    """Per workload: (slowest rank's timed seconds, timed samples, rank 0's final loss). plain: `world` processes
    without a group (1: the one-GPU baseline), each training on `devices` GPUs; knobs: the data-parallel
    experiment settings; share: at 1/share of the batch."""
    ctx = mp.get_context("spawn")
    ends, procs = [], []
    for rank in range(world):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_rank, args=(rank, world, child, names, data_dir, plain, devices, knobs, share),
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


def write_rows(
    path: str, names: list[str], rows: dict[str, list[tuple[float, int, float]]], device: str, gpus: int
) -> None:
    """The table as JSON rows (workload, run, samples/s, speedup over one GPU without a group, final loss), with the
    device and GPU count (the caller asks the driver), for report.py."""
    import json
    from pathlib import Path

    base = rows["1 GPU, no group"]
    out = []
    for i, name in enumerate(names):
        sizes, _, batch, *_ = WORKLOADS[name]
        for label, res in rows.items():
            seconds, samples, loss = res[i]
            rate = samples / seconds
            out.append({"workload": name, "sizes": sizes, "global_batch": batch, "run": label,
                        "samples_per_s": rate, "vs_one_gpu": rate / (base[i][1] / base[i][0]),
                        "final_loss": loss})  # fmt: skip
    doc = {"device": device, "gpus": gpus, "rows": out}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--worlds", default="1,2")
    ap.add_argument("--workloads", default="mlp4096,logreg,mlp128")
    ap.add_argument("--comm-priority", choices=("default", "high", "both"), default="default",
                    help="stream priority of the all-reduces (both: a row for each)")  # fmt: skip
    ap.add_argument("--sharded", choices=("off", "on", "both"), default="off",
                    help="shard the optimizer update over the GPUs (both: a row for each)")  # fmt: skip
    ap.add_argument("--carveout", default="0", help="SMs the backward GEMMs leave to NCCL, a row for each: 0,16")
    ap.add_argument("--channels", default="0", help="NCCL_MAX_NCHANNELS, a row for each (0: NCCL's own): 0,4,8")
    ap.add_argument("--modes", default="procs,devices", help="processes (a group), devices= (one process), or both")
    ap.add_argument("--ceiling-only", action="store_true", help="only the one-GPU rows: baseline and ceilings")
    ap.add_argument("--json", metavar="F", help="also write the rows as JSON (report.py's scaling table reads it)")
    args = ap.parse_args()
    names = args.workloads.split(",")
    modes = args.modes.split(",")
    rows = {"1 GPU, no group": run_world(1, names, args.data, plain=True)}
    highs = {"default": [False], "high": [True], "both": [False, True]}[args.comm_priority]
    carves, channels = ([int(v) for v in arg.split(",")] for arg in (args.carveout, args.channels))
    shardeds = {"off": [False], "on": [True], "both": [False, True]}[args.sharded]
    variants = [Knobs(*v) for v in itertools.product(shardeds, highs, carves, channels)]
    for world in (int(w) for w in args.worlds.split(",")):
        if world > 1:
            ceiling = run_world(1, names, args.data, plain=True, share=world)
            rows[f"{world} GPUs, ceiling"] = [(seconds / world, samples, loss) for seconds, samples, loss in ceiling]
        if args.ceiling_only:
            continue
        for knobs in variants:
            tag = knobs.label()
            if "procs" in modes or world == 1:
                rows[f"{world} GPU{'s' if world > 1 else ''}, NCCL group{tag}"] = run_world(world, names, args.data,
                                                                                             knobs=knobs)  # fmt: skip
            if world > 1 and "devices" in modes:
                rows[f"{world} GPUs, devices={world}{tag}"] = run_world(1, names, args.data, plain=True, devices=world,
                                                                       knobs=knobs)  # fmt: skip
    base = rows["1 GPU, no group"]
    if args.json:
        from fastnn.cuda import driver

        write_rows(args.json, names, rows, driver.device_name(0), driver.device_count())
    for i, name in enumerate(names):
        sizes, _, batch, *_ = WORKLOADS[name]
        print(f"\n{name} {sizes} global batch {batch}")
        print(f"  {'run':44} {'samples/s':>12} {'vs 1 GPU':>9} {'final loss':>11}")
        for label, res in rows.items():
            seconds, samples, loss = res[i]
            rate = samples / seconds
            print(f"  {label:44} {rate:12.0f} {rate / (base[i][1] / base[i][0]):8.2f}x {loss:11.4f}")


if __name__ == "__main__":
    main()
