"""Per-node timing of one fastnn training step, so the next optimisation target is visible.

    python benchmarks/bench_kernels.py --data DIR [--workload logreg|mlp128|mlp4096|all] [--precision mixed]

Each node of the step (gather, each GEMM, softmax, loss, update) is captured 1,000 times into a
graph of its own and the replay is timed with device events (the graph engine's profile_step, timing
as its GEMM autotuner does); "step" is the whole step the same way. The share column is each node's
time over the sum of the nodes. Kernel experiments that left the product (the hidden layers' bias
gradients from a column-sum kernel) are in benchmarks/kernels/.
"""

from __future__ import annotations

import argparse

import numpy as np

import fastnn

WORKLOADS = {
    "logreg": ([784, 10], 0.1, 128),
    "mlp128": ([784, 128, 128, 128, 10], 0.003, 32),
    "mlp4096": ([784, 4096, 4096, 4096, 10], 0.003, 32),
}


def profile(name: str, x: np.ndarray, y: np.ndarray, precision: str, repeats: int) -> list[tuple[str, float]]:
    sizes, lr, batch = WORKLOADS[name]
    with fastnn.Trainer(fastnn.MLP(sizes), optimizer=fastnn.SGD(lr=lr), batch_size=batch, precision=precision,
                        device="cuda") as t:  # fmt: skip
        t.fit(x, y, epochs=1, progress=False)
        return t._engine.profile_step(repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="folder with Fashion-MNIST's (or MNIST's) four IDX files")
    ap.add_argument("--workload", default="all", choices=[*WORKLOADS, "all"])
    ap.add_argument("--precision", default="mixed")
    ap.add_argument("--repeats", type=int, default=1000)
    args = ap.parse_args()
    x, y, _, _ = fastnn.datasets.load("fashion-mnist", root=args.data, download=False)
    x, y = x[:8192], y[:8192]
    for name in WORKLOADS if args.workload == "all" else [args.workload]:
        for prec in args.precision.split(","):
            rows = profile(name, x, y, prec, args.repeats)
            total = sum(us for node, us in rows if node != "step")
            print(f"\n{name} ({prec}): us per node")
            print(f"{'node':10s} {'us':>8s} {'share':>7s}")
            for node, us in rows:
                share = "" if node == "step" else f"{100 * us / total:6.1f}%"
                print(f"{node:10s} {us:8.2f} {share:>7s}")
            print(f"{'sum':10s} {total:8.2f}")


if __name__ == "__main__":
    main()
