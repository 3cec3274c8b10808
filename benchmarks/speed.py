"""fastnn's own speed on issue 4's three workloads: device time of `fit` after warm-up, and setup.

    python benchmarks/speed.py --data DIR [--precision mixed] [--only logreg,mlp128,mlp4096]

Setup is the first `fit` (NVRTC with the cache as found, plans, autotuning, capture) of a fresh
trainer; training time is the sum of the per-epoch device-event times of a second `fit` of the
same trainer on the same data (the captured graph is replayed). Accuracy is on the test set.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import fastnn

WORKLOADS = {
    # name: (sizes, lr, batch, epochs, samples): the MLP runs 5,000 steps on 32,000 samples x 5 epochs
    "logreg": ([784, 10], 0.1, 128, 20, 60000),
    "mlp128": ([784, 128, 128, 128, 10], 0.003, 32, 5, 32000),
    "mlp4096": ([784, 4096, 4096, 4096, 10], 0.003, 32, 5, 32000),
}


def run(name: str, data, precision: str) -> dict:
    sizes, lr, batch, epochs, samples = WORKLOADS[name]
    x, y, xt, yt = data
    x, y = x[:samples], y[:samples]
    t = fastnn.Trainer(fastnn.MLP(sizes), optimizer=fastnn.SGD(lr=lr), batch_size=batch, precision=precision,
                       device="cuda", seed=0)  # fmt: skip
    t0 = time.perf_counter()
    t.fit(x, y, epochs=1, progress=False)
    setup = time.perf_counter() - t0
    t1 = time.perf_counter()
    h = t.fit(x, y, epochs=epochs, progress=False)
    wall = time.perf_counter() - t1
    device = float(np.sum(h["seconds"]))
    steps = epochs * -(-samples // batch)
    acc = t.evaluate(xt, yt)["accuracy"]
    t.close()
    return {"workload": name, "precision": precision, "steps": steps, "device_s": device, "wall_s": wall,
            "us_per_step": device / steps * 1e6, "first_fit_s": setup, "test_accuracy": acc,
            "final_train_loss": h[-1]["train_loss"]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--precision", default="mixed")
    ap.add_argument("--only", default=",".join(WORKLOADS))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    data = fastnn.datasets.load("fashion-mnist", root=args.data, download=False)
    rows = []
    for prec in args.precision.split(","):
        for name in args.only.split(","):
            r = run(name, data, prec)
            rows.append(r)
            print(
                f"{r['workload']:8s} {prec:6s} steps {r['steps']:6d}  device {r['device_s'] * 1e3:8.1f} ms  "
                f"{r['us_per_step']:7.2f} us/step  wall {r['wall_s'] * 1e3:8.1f} ms  "
                f"first fit {r['first_fit_s']:.2f} s  acc {r['test_accuracy']:.4f}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
