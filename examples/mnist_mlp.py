"""A ReLU MLP on MNIST or Fashion-MNIST: 784 -> h -> h -> h -> 10, SGD lr 0.003, batch 32, 5,000 steps.

    python examples/mnist_mlp.py                          # Fashion-MNIST, h=128, 5000 steps
    python examples/mnist_mlp.py --hidden 1024 --device cuda
    python examples/mnist_mlp.py --epochs 2 --device cpu

fastnn trains whole epochs, so --steps is rounded up to whole epochs: ceil(steps / steps per epoch), with
ceil(N / batch) steps per epoch (the last short batch is a step); the run says how many steps that is.
Data as in mnist_logreg.py: --data DIR, else $FASTNN_DATA, ~/.cache/fastnn/<name>,
/usr/share/datasets/<name>, else a checked download. Prints one line per epoch as it finishes when run in a
terminal or for 10 epochs or fewer, else (a log) every 10th after training (--log-every N, --progress), then
the training time and the test accuracy.
"""

from __future__ import annotations

import argparse
import math
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
    p.add_argument("--hidden", type=int, default=128, help="width of each hidden layer")
    p.add_argument("--layers", type=int, default=3, help="number of hidden layers")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, default=5000, help="optimizer steps, rounded up to whole epochs")
    length.add_argument("--epochs", type=int, help="train this many epochs instead of --steps")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--precision", choices=("mixed", "fp16", "fp32"), default="mixed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--log-every",
        type=int,
        metavar="N",
        help="print every N-th epoch (default 1 in a terminal or up to 10 epochs, else 10)",
    )
    p.add_argument("--progress", action="store_true", help="print every epoch as it finishes")
    args = p.parse_args(argv)
    for name in ("hidden", "layers", "steps", "epochs", "batch_size", "log_every"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "layers" else 1):
            p.error(f"--{name.replace('_', '-')} must be >= {0 if name == 'layers' else 1}, got {value}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        print(f"loading {args.dataset} ...", flush=True)  # a first run downloads it: say so before the wait
        data = fastnn.datasets.load(
            args.dataset, root=args.data, download=not args.no_download, verify=not args.no_verify
        )
        x, y, xt, yt = data
        check = "unverified: --no-verify" if args.no_verify else "sha256 verified"
        print(f"data: {args.dataset} from {data.folder} ({check})", flush=True)
        per_epoch = steps_per_epoch(len(x), args.batch_size)
        if args.epochs is not None:
            epochs = args.epochs
        else:
            epochs = math.ceil(args.steps / per_epoch)
            print(
                f"{args.steps} steps at batch {args.batch_size} over {len(x)} samples ({per_epoch} steps per epoch): "
                f"training {epochs} epochs = {epochs * per_epoch} steps"
            )
        log_every = args.log_every or (1 if epochs <= 10 or sys.stdout.isatty() else 10)
        model = fastnn.MLP([784] + [args.hidden] * args.layers + [10], activation="relu")
        trainer = fastnn.Trainer(
            model,
            optimizer=fastnn.SGD(lr=args.lr),
            batch_size=args.batch_size,
            precision=args.precision,
            device=args.device,
            seed=args.seed,
        )
        print(
            f"{args.dataset}: {len(x)} train / {len(xt)} test images; MLP {model.sizes} relu "
            f"({model.num_parameters()} parameters), SGD lr {args.lr}, batch {args.batch_size}, {epochs} epochs, "
            f"{args.precision if trainer.device == 'cuda' else 'fp32 (the CPU computes fp32)'} on {trainer.device}",
            flush=True,
        )
        # Live per-epoch lines come from the trainer; otherwise the chosen epochs are printed after fit.
        live = args.progress or log_every == 1
        start = time.perf_counter()
        history = trainer.fit(x, y, epochs=epochs, eval_data=(xt, yt), eval_every=log_every, progress=live)
        wall = time.perf_counter() - start
        if not live:
            for i, record in enumerate(history):
                if (i + 1) % log_every == 0 or i == len(history) - 1:
                    print(epoch_line(record, trainer.epoch))
        print(
            f"training time: {sum(history['seconds']):.3f} s for {epochs} epochs ({epochs * per_epoch} steps); "
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
