"""What a cold NVRTC compile of native/fused.cu costs per option set, and whether the options change its SASS.

Issue 26: a cold fused engine waits for NVRTC. Each (workload, option set) compiles in a fresh process, on the CPU
(a CUBIN for sm_90 needs no GPU), and reports the compile's CPU and wall seconds (best of --repeats) and whether
the CUBIN's code (.text sections) equals the one the current options give. Fresh processes because NVRTC 12.9
carries state from one program to the next: after a --Ofast-compile=mid compile, the same source with the current
options gives other SASS in that process. NVRTC's own cache (the CUDA compute cache, 12.9+) is off in them.

    python benchmarks/bench_nvrtc.py --repeats 3 --out nvrtc.md
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

if importlib.util.find_spec("fastnn") is None:  # run from a checkout without `pip install -e .`
    sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

__all__ = ["VARIANTS", "WORKLOADS", "text_digest"]

#: Option sets tried on top of the fused plan's: none of the first six changes what is computed; the last three
#: lower the optimisation effort or reorder it (other SASS: they would need the GPU suite and a timing before use).
#: --split-compile=0 (all cores) cannot split a file of one kernel: no faster, the same CUBIN size (measured: the
#: same SASS for logreg, other SASS for MLP 784-128x3-10).
#: Two compiles on two threads of one process take as long as one after the other: NVRTC 12.9 serialises them.
VARIANTS = {
    "current": (),
    "--minimal": ("--minimal",),
    "-default-device": ("-default-device",),
    "--no-source-include": ("--no-source-include",),
    "all three": ("--minimal", "-default-device", "--no-source-include"),
    "-lineinfo (for scale)": ("-lineinfo",),
    "--Ofast-compile=min": ("--Ofast-compile=min",),
    "--Ofast-compile=max": ("--Ofast-compile=max",),
    "--split-compile=0": ("--split-compile=0",),
}
#: (sizes, batch) of the fused engine's seed workloads, in "mixed".
WORKLOADS = {"logreg": ((784, 10), 128), "mlp-128": ((784, 128, 128, 128, 10), 32)}


def text_digest(cubin: bytes) -> str:
    """sha256 (12 hex digits) of the ELF's .text* sections in name order: the machine code, without metadata."""
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_at, names_size = headers[shstrndx][4], headers[shstrndx][5]
    names = cubin[names_at : names_at + names_size]
    text = {}
    for name_off, kind, _, _, offset, size, *_ in headers:
        name = names[name_off : names.index(b"\0", name_off)].decode()
        if name.startswith(".text") and kind != 8:  # 8: SHT_NOBITS
            text[name] = cubin[offset : offset + size]
    h = hashlib.sha256()
    for name in sorted(text):
        h.update(name.encode() + b"\0" + text[name])
    return h.hexdigest()[:12]


def _child(workload: str, variant: str) -> None:
    """Compile once in this (fresh) process; print the measurement as JSON."""
    import numpy as np

    import fastnn
    from fastnn.cuda import nvrtc
    from fastnn.engine.base import EngineConfig
    from fastnn.engine.fused.plan import fused_plan

    sizes, batch = WORKLOADS[workload]
    config = EngineConfig(model=fastnn.MLP(list(sizes)), optimizer=fastnn.SGD(lr=0.1), batch_size=batch)
    plan = fused_plan(config, np.uint8)
    native = nvrtc.native_dir()
    source = (native / "fused.cu").read_text()
    cpu, wall = time.process_time(), time.perf_counter()
    cubin = nvrtc.compile_source(source, "fused.cu", "sm_90", plan.options + VARIANTS[variant], (native,))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(json.dumps({"cpu": cpu, "wall": wall, "bytes": len(cubin), "text": text_digest(cubin)}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--variants", default=",".join(VARIANTS), help="option sets, comma-separated (see VARIANTS)")
    p.add_argument("--out", help="also write the markdown table here")
    p.add_argument("--child", metavar="WORKLOAD:VARIANT", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        _child(*args.child.split(":", 1))
        return 0
    workloads, variants = args.workloads.split(","), args.variants.split(",")
    # NVRTC 12.9+ keeps every program it compiles in the CUDA compute cache where a driver is installed: the
    # repeats (and another variant's identical program) would then time a cache hit, not a compile.
    env = {**os.environ, "CUDA_CACHE_DISABLE": "1"}
    results: dict[tuple[str, str], list[dict]] = {}
    for _ in range(args.repeats):  # interleaved, so a busy moment of the machine spreads over every variant
        for w in workloads:
            for v in variants:
                # "--child=W:V" in one piece: a variant's name may start with "-"
                cmd = [sys.executable, str(Path(__file__).resolve()), f"--child={w}:{v}"]
                res = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
                results.setdefault((w, v), []).append(json.loads(res.stdout.splitlines()[-1]))
    lines = ["| workload | options | CPU s (best) | wall s (best) | CUBIN bytes | SASS |"]
    lines.append("|---|---|---:|---:|---:|---|")
    for w in workloads:
        base = results.get((w, "current"), [{}])[0].get("text")
        for v in variants:
            rs = results[(w, v)]
            same = "same" if rs[0]["text"] == base else "other" if base else rs[0]["text"]
            lines.append(f"| {w} | {v} | {min(r['cpu'] for r in rs):.2f} | {min(r['wall'] for r in rs):.2f} | "
                         f"{rs[0]['bytes']} | {same} |")  # fmt: skip
    table = "\n".join(lines) + "\n"
    print(table, end="")
    if args.out:
        Path(args.out).write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
