"""Training data in GPU memory against mapped host memory (data_placement): us/step, same results.

    python benchmarks/bench_placement.py --data DIR [--workloads logreg,mlp128] [--precision mixed]

The graph engine trains the same model from the same weights in the same order twice in one process, once
with the training set resident on the GPU and once in page-locked host memory read over the bus by the
gather kernel. Training time is the sum of the per-epoch device-event times of a second `fit` (the captured
epoch replayed, as bench_fused.py); the table gives us/step, the ratio host/device and the final train loss
(identical when the two agree).
"""

from __future__ import annotations

import argparse

import numpy as np

import fastnn

WORKLOADS = {  # name: (sizes, lr, batch, epochs, samples), as bench_fused.py
    "logreg": ([784, 10], 0.1, 128, 20, 60000),
    "mlp128": ([784, 128, 128, 128, 10], 0.003, 32, 5, 32000),
}


def us_per_step(sizes, lr, batch, epochs, samples, data, precision: str, placement: str) -> tuple[float, float]:
    """(us/step of the timed fit, its final train loss)."""
    x, y = data[0][:samples], data[1][:samples]
    with fastnn.Trainer(fastnn.MLP(sizes), fastnn.SGD(lr=lr), batch_size=batch, precision=precision, device="cuda",
                        seed=0, engine="graph", data_placement=placement) as t:  # fmt: skip
        t.fit(x, y, epochs=1, progress=False)  # setup and capture
        h = t.fit(x, y, epochs=epochs, progress=False)
        steps = epochs * -(-len(x) // batch)
        return float(np.sum(h["seconds"])) / steps * 1e6, h[-1]["train_loss"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--workloads", default="logreg,mlp128")
    ap.add_argument("--precision", default="mixed")
    args = ap.parse_args()
    data = fastnn.datasets.load("fashion-mnist", root=args.data, download=False)
    print(f"{'workload':10} {'device us/step':>15} {'host us/step':>13} {'host/device':>12}  final train loss")
    for name in args.workloads.split(","):
        dev, loss_d = us_per_step(*WORKLOADS[name], data, args.precision, "device")
        host, loss_h = us_per_step(*WORKLOADS[name], data, args.precision, "host")
        same = "same" if loss_d == loss_h else f"DIFFER: {loss_d} vs {loss_h}"
        print(f"{name:10} {dev:15.2f} {host:13.2f} {host / dev:11.2f}x  {loss_d:.4f} ({same})")


if __name__ == "__main__":
    main()
