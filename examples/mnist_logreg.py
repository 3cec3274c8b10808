"""Logistic regression on MNIST or Fashion-MNIST: the seed workload (784 -> 10, SGD lr 0.1, batch 128, 20 epochs).

    python examples/mnist_logreg.py                      # Fashion-MNIST, GPU when usable, 20 epochs
    python examples/mnist_logreg.py --dataset fashion-mnist --device cpu --epochs 5

The default dataset is Fashion-MNIST: Debian's dataset-fashion-mnist package provides it offline
(/usr/share/datasets/fashion-mnist), and it is harder than MNIST, so accuracy differences show.
Data: --data DIR, else $FASTNN_DATA, ~/.cache/fastnn/<name>, /usr/share/datasets/<name>, else a
checked download (see fastnn.datasets.load); the files must be the named dataset's (sha256) unless
--no-verify (your own MNIST-layout data), and the folder used is printed first. Prints one line per epoch
as it finishes when run in a terminal or for 10 epochs or fewer, else (a log) every 10th after training
(--log-every N changes that; --progress prints every epoch live), then the training time and the final
test accuracy.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

try:
    import fastnn
except ModuleNotFoundError:  # run from a source checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import fastnn
from fastnn.schedules import steps_per_epoch


def epoch_line(record: dict, last: int) -> str:
    """A `History` record as `fit(progress=True)` prints it (records are plain dicts: see fastnn.History)."""
    return (
        f"epoch {record['epoch']}/{last}  loss {record['train_loss']:.4f}  acc {record['train_accuracy']:.4f}  "
        f"eval loss {record['eval_loss']:.4f}  eval acc {record['eval_accuracy']:.4f}  {record['seconds']:.2f}s"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", choices=sorted(fastnn.datasets.DATASETS), default="fashion-mnist")
    p.add_argument("--data", metavar="DIR", help="folder holding the four IDX files (gz or raw)")
    p.add_argument("--no-download", action="store_true", help="fail instead of downloading missing files")
    p.add_argument(
        "--no-verify",
        action="store_true",
        help="read the IDX files unchecked (your own MNIST-layout data); by default each file's sha256 must be "
        "the named dataset's",
    )
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--precision", choices=("mixed", "fp16", "fp32"), default="mixed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--log-every",
        type=int,
        metavar="N",
        help="print every N-th epoch (default 1 in a terminal or up to 10 epochs, else 10)",
    )
    p.add_argument("--progress", action="store_true", help="print every epoch as it finishes")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log_every = args.log_every or (1 if args.epochs <= 10 or sys.stdout.isatty() else 10)
    try:
        print(f"loading {args.dataset} ...", flush=True)  # a first run downloads it: say so before the wait
        data = fastnn.datasets.load(
            args.dataset, root=args.data, download=not args.no_download, verify=not args.no_verify
        )
        x, y, xt, yt = data
        check = "unverified: --no-verify" if args.no_verify else "sha256 verified"
        print(f"data: {args.dataset} from {data.folder} ({check})", flush=True)
        model = fastnn.MLP([784, 10])
        trainer = fastnn.Trainer(
            model,
            optimizer=fastnn.SGD(lr=args.lr),
            batch_size=args.batch_size,
            precision=args.precision,
            device=args.device,
            seed=args.seed,
        )
        computes = args.precision if trainer.device == "cuda" else "fp32 (the CPU computes fp32)"
        print(
            f"{args.dataset}: {len(x)} train / {len(xt)} test images; logistic regression {model.sizes}, "
            f"SGD lr {args.lr}, batch {args.batch_size}, {args.epochs} epochs, {computes} on {trainer.device}",
            flush=True,
        )
        # Live per-epoch lines come from the trainer; otherwise the chosen epochs are printed after fit.
        live = args.progress or log_every == 1
        start = time.perf_counter()
        history = trainer.fit(x, y, epochs=args.epochs, eval_data=(xt, yt), eval_every=log_every, progress=live)
        wall = time.perf_counter() - start
        if not live:
            for i, record in enumerate(history):
                if (i + 1) % log_every == 0 or i == len(history) - 1:
                    print(epoch_line(record, trainer.epoch))
        steps = args.epochs * steps_per_epoch(len(x), args.batch_size)
        print(
            f"training time: {sum(history['seconds']):.3f} s for {args.epochs} epochs ({steps} steps); "
            f"fit() wall time {wall:.3f} s including setup and evaluation"
        )
        result = trainer.evaluate(xt, yt)
        trainer.close()
    except fastnn.FastnnError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"test accuracy: {result['accuracy']:.4f} (test loss {result['loss']:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
