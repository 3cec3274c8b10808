"""Data-parallel training, one process per GPU: an MLP on Fashion-MNIST with the global batch split over the ranks.

    torchrun --nproc-per-node 2 examples/mnist_distributed.py --id-file /shared/path/nccl.id
    mpirun -np 2 python examples/mnist_distributed.py --id-file /shared/path/nccl.id
    NCCL_COMM_ID=host0:29600 srun -n 8 python examples/mnist_distributed.py   # several machines

The launcher sets each process's rank, world size and local rank (fastnn.distributed.LAUNCHER_ENV). The NCCL id
reaches every rank through --id-file (rank 0 writes it; a path every machine can read) or NCCL_COMM_ID
(host:port of rank 0's machine, a free port). Every rank loads the same data and builds the same Trainer; rank 0
prints what it trains first, each epoch as it finishes when run in a terminal, the history at the end, and saves
the checkpoint. Needs NCCL: pip install -e ".[multi-cu12]" in a fastnn checkout (or multi-cu13).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    import fastnn
except ModuleNotFoundError:  # run from a source checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import fastnn
from fastnn import distributed


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", metavar="DIR", help="Fashion-MNIST's folder (else fastnn.datasets.load's search)")
    p.add_argument("--id-file", help="where rank 0 writes the NCCL id for the others (unless NCCL_COMM_ID is set)")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--batch", type=int, default=1024, help="global batch: split over the ranks")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--save", help="checkpoint path (written by rank 0)")
    args = p.parse_args(argv)

    with distributed.init(id_file=args.id_file) as group:
        # No download: every rank reads the same files, which must be there already (mnist_logreg.py fetches them).
        x, y, xt, yt = fastnn.datasets.load("fashion-mnist", root=args.data, download=False)
        h = args.hidden
        with fastnn.Trainer(fastnn.MLP([784, h, h, 10]), fastnn.SGD(lr=0.05, momentum=0.9), batch_size=args.batch,
                            normalize=(0.2860, 0.3530), distributed=group) as trainer:  # fmt: skip
            if group.rank == 0:
                print(f"{group.world} ranks, global batch {args.batch} ({args.batch // group.world} per GPU), "
                      f"MLP {trainer.model.sizes}, {args.epochs} epochs", flush=True)  # fmt: skip
            history = trainer.fit(x, y, epochs=args.epochs, progress="auto" if group.rank == 0 else False)
            acc = trainer.evaluate(xt, yt)["accuracy"]
            if group.rank == 0:
                print(history)
                print(f"test accuracy {acc:.4f}")
                if args.save:
                    trainer.save(args.save)


if __name__ == "__main__":
    main()
