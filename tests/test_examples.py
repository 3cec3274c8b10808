"""The examples run end to end as subprocesses on tiny generated IDX data (CPU, no network)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fastnn import datasets

REPO = Path(__file__).resolve().parent.parent
N_TRAIN, N_TEST = 64, 32
ACC = r"(\d\.\d{4})"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """The four IDX files of a tiny MNIST-shaped dataset."""
    folder = tmp_path_factory.mktemp("idx")
    rng = np.random.default_rng(0)
    for prefix, n in (("train", N_TRAIN), ("t10k", N_TEST)):
        datasets.write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        datasets.write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", rng.integers(0, 10, n, dtype=np.uint8))
    return folder


def run_example(script: str, *args: str, tmp_path: Path, verify: bool = False) -> subprocess.CompletedProcess:
    """Run examples/<script> with the repo importable, HOME in tmp, no FASTNN_DATA and unreachable mirrors;
    with --no-verify unless `verify`, since the generated data is neither MNIST nor Fashion-MNIST."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: a download attempt is refused at once
    env = {k: v for k, v in os.environ.items() if k != "FASTNN_DATA"}
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
        HOME=str(tmp_path / "home"),
        FASTNN_DATASET_MIRRORS=f"http://127.0.0.1:{port}/",
    )
    return subprocess.run(
        [sys.executable, str(REPO / "examples" / script), *args, *([] if verify else ["--no-verify"])],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def run_example_in_a_terminal(script: str, *args: str, tmp_path: Path) -> str:
    """Run examples/<script> as run_example does, but with stdout a terminal (a pseudo-terminal), as when a person
    runs it; returns what it printed."""
    import pty
    import select

    env = {k: v for k, v in os.environ.items() if k != "FASTNN_DATA"}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])), HOME=str(tmp_path / "h"),
               COLUMNS="120", TERM="dumb")  # fmt: skip
    main, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, str(REPO / "examples" / script), *args, "--no-verify"], cwd=REPO,
                            env=env, stdout=child, stderr=subprocess.PIPE)  # fmt: skip
    os.close(child)
    out = b""
    while True:  # read as it comes: a full terminal buffer would block the example
        ready, _, _ = select.select([main], [], [], 300)
        if not ready:
            proc.kill()
            raise AssertionError(f"{script} printed nothing for 300 s: {out[-2000:]!r}")
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the example exited and closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(main)
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    return out.decode().replace("\r\n", "\n")


def epoch_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("epoch ")]


def test_logreg_one_epoch(data_dir, tmp_path):
    r = run_example("mnist_logreg.py", "--data", str(data_dir), "--device", "cpu", "--epochs", "1", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.splitlines()[0] == "loading fashion-mnist ..."  # before the wait (a first run downloads)
    assert out.splitlines()[1] == f"data: fashion-mnist from {data_dir} (unverified: --no-verify)"
    assert out.splitlines()[2].startswith(f"fashion-mnist: {N_TRAIN} train / {N_TEST} test images")
    assert "(784, 10)" in out and "on cpu" in out
    (line,) = epoch_lines(out)
    m = re.match(rf"epoch 1/1 .*eval acc {ACC}", line)
    assert m, line
    assert re.search(r"^training time: \d+\.\d{3} s for 1 epochs \(1 steps\)", out, re.M), out
    final = re.search(rf"^test accuracy: {ACC} \(test loss \d+\.\d{{4}}\)$", out, re.M)
    assert final, out
    # The final evaluation sees the weights the last epoch's evaluation saw.
    assert final.group(1) == m.group(1)
    assert 0.0 <= float(final.group(1)) <= 1.0


def test_logreg_log_every(data_dir, tmp_path):
    r = run_example(
        "mnist_logreg.py",
        *("--data", str(data_dir), "--device", "cpu", "--epochs", "3", "--log-every", "2", "--dataset", "mnist"),
        *("--batch-size", "16", "--lr", "0.05", "--precision", "fp32"),
        tmp_path=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[2].startswith(f"mnist: {N_TRAIN} train")
    lines = epoch_lines(r.stdout)
    assert [line.split()[1] for line in lines] == ["2/3", "3/3"]
    assert "(12 steps)" in r.stdout  # 3 epochs of ceil(64 / 16) = 4 steps


def test_logreg_progress_prints_every_epoch(data_dir, tmp_path):
    args = ("--data", str(data_dir), "--device", "cpu", "--epochs", "12", "--progress")
    r = run_example("mnist_logreg.py", *args, tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    assert [line.split()[1] for line in epoch_lines(r.stdout)] == [f"{e}/12" for e in range(1, 13)]


def test_logreg_run_by_a_person_prints_every_epoch_as_it_goes(data_dir, tmp_path):
    """In a terminal, without --log-every or --progress: a line per epoch (not epochs 10 and 12 at the end), after
    saying what it does before the first epoch ends."""
    out = run_example_in_a_terminal("mnist_logreg.py", "--data", str(data_dir), "--device", "cpu", "--epochs", "12",
                                    tmp_path=tmp_path)  # fmt: skip
    lines = [line.split("\r")[-1] for line in out.splitlines()]  # a moving bar rewrites its line with \r
    assert lines[0] == "loading fashion-mnist ..."
    epochs = [line.split()[1] for line in lines if line.startswith("epoch ") and "eval acc" in line]
    assert epochs == [f"{e}/12" for e in range(1, 13)], out
    first = next(i for i, line in enumerate(lines) if line.startswith("epoch "))
    assert any(line.startswith("fashion-mnist: ") and "12 epochs" in line for line in lines[:first]), out


def test_mlp_one_epoch(data_dir, tmp_path):
    args = ("--data", str(data_dir), "--device", "cpu", "--epochs", "1", "--hidden", "16", "--layers", "2")
    r = run_example("mnist_mlp.py", *args, tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:2] == ["loading fashion-mnist ...",
                                         f"data: fashion-mnist from {data_dir} (unverified: --no-verify)"]  # fmt: skip
    assert "MLP (784, 16, 16, 10) relu" in r.stdout
    assert "steps per epoch" not in r.stdout  # --epochs given: no step arithmetic to report
    (line,) = epoch_lines(r.stdout)
    assert line.startswith("epoch 1/1")
    assert "(2 steps)" in r.stdout  # ceil(64 / 32)
    assert re.search(rf"^test accuracy: {ACC}", r.stdout, re.M), r.stdout


def test_mlp_steps_round_up_to_epochs(data_dir, tmp_path):
    args = ("--data", str(data_dir), "--device", "cpu", "--steps", "5", "--hidden", "8", "--layers", "1")
    r = run_example("mnist_mlp.py", *args, tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    # 64 samples at batch 32: 2 steps per epoch, so 5 steps need 3 epochs = 6 steps.
    assert f"5 steps at batch 32 over {N_TRAIN} samples (2 steps per epoch): training 3 epochs = 6 steps" in r.stdout
    assert [line.split()[1] for line in epoch_lines(r.stdout)] == ["1/3", "2/3", "3/3"]


def test_mlp_rejects_steps_with_epochs_and_bad_sizes(data_dir, tmp_path):
    r = run_example("mnist_mlp.py", "--data", str(data_dir), "--steps", "5", "--epochs", "1", tmp_path=tmp_path)
    assert r.returncode == 2 and "not allowed with" in r.stderr
    r = run_example("mnist_mlp.py", "--data", str(data_dir), "--hidden", "0", tmp_path=tmp_path)
    assert r.returncode == 2 and "--hidden must be >= 1" in r.stderr


@pytest.mark.skipif(Path("/usr/share/datasets/mnist").exists(), reason="a system-wide MNIST would be found")
@pytest.mark.parametrize("script", ["mnist_logreg.py", "mnist_mlp.py"])
def test_missing_data_is_one_clear_error(tmp_path, script):
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run_example(script, "--dataset", "mnist", "--data", str(empty), "--device", "cpu", tmp_path=tmp_path)
    assert r.returncode == 1
    assert r.stderr.startswith("error: dataset 'mnist' not found")
    assert str(empty) in r.stderr and "FASTNN_DATA" in r.stderr
    assert "Traceback" not in r.stderr
    assert list(empty.iterdir()) == []  # the refused download wrote nothing


@pytest.mark.parametrize("script", ["mnist_logreg.py", "mnist_mlp.py"])
def test_data_that_is_not_the_named_dataset_is_refused(data_dir, tmp_path, script):
    """--dataset mnist --data <other data> must not train on it while printing "mnist"."""
    r = run_example(
        script, "--dataset", "mnist", "--data", str(data_dir), "--device", "cpu", tmp_path=tmp_path, verify=True
    )
    assert r.returncode == 1, r.stdout
    assert f"error: {data_dir / 'train-images-idx3-ubyte.gz'} is not mnist's train-images-idx3-ubyte" in r.stderr
    assert "--no-verify" in r.stderr and "Traceback" not in r.stderr
