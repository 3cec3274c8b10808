"""SASS of the grid and fused kernels for a fixed set of plans, to prove a source change behaviour-neutral (no GPU).

    python benchmarks/sass_compare.py dump NATIVE_DIR OUT_DIR [--repo REPO] [--arch sm_90] [--only fast,stream,...]
    python benchmarks/sass_compare.py diff OUT_A OUT_B

A refactor of a kernel that keeps every plan's SASS byte-identical cannot change what it computes or how fast, so it
needs no GPU run; anything else does. cuobjdump: $CUOBJDUMP, else on PATH, else `pip install nvidia-cuda-cuobjdump`'s
(which runs nvdisasm: `pip install nvidia-cuda-nvdisasm` puts it beside it, and the folder goes on cuobjdump's PATH).

`dump` takes each plan's NVRTC options from fastnn's own plan functions (fastnn/engine/grid/plan.py: fast_plan,
stream_plan, grid_plan with the H100's 132 SMs and 232448 bytes of shared memory; fastnn/engine/fused/plan.py's
fused_plan for the families logreg (fused_logreg.cu), mlp (fused_mlp.cu) and fused (fused.cu)), compiles
NATIVE_DIR/<plan.source> with fastnn.cuda.nvrtc.compile_source exactly as compile_native does (native dir on the
include path, -std=c++17, --gpu-architecture=ARCH, then the plan's options), and writes per plan: NAME.cubin,
NAME.sass (cuobjdump -sass) and NAME.res (cuobjdump -res-usage). `diff` compares two dumps file by file and exits
1 on any difference.

Baseline:  git archive REV native | tar -x -C /tmp/base && python benchmarks/sass_compare.py dump /tmp/base/native A
After:     python benchmarks/sass_compare.py dump native B && python benchmarks/sass_compare.py diff A B
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SMS, SMEM = 132, 232448  # the H100's SMs and opt-in shared memory a CTA


def cuobjdump() -> str:
    """$CUOBJDUMP, else cuobjdump on PATH, else the one the pip package nvidia-cuda-cuobjdump installs."""
    found = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if found:
        return found
    try:
        import nvidia.cu13  # the package's namespace (CUDA 13 tools)

        path = Path(list(nvidia.cu13.__path__)[0]) / "bin" / "cuobjdump"
        if path.exists():
            return str(path)
    except ImportError:
        pass
    sys.exit("sass_compare: no cuobjdump: set $CUOBJDUMP, put it on PATH or `pip install nvidia-cuda-cuobjdump`")


def plans(repo: str):
    """(name, plan) of every plan checked; the plan's source and options are fastnn's own."""
    sys.path.insert(0, repo)
    import numpy as np

    from fastnn import MLP, SGD, AdamW
    from fastnn.engine import Tuning
    from fastnn.engine.base import EngineConfig
    from fastnn.engine.grid import plan as gp

    def cfg(sizes, opt, batch=32, **kw):
        return EngineConfig(model=MLP(sizes, activation="relu"), optimizer=opt, batch_size=batch, precision="mixed",
                            loss="cross_entropy", **kw)  # fmt: skip

    sgd, mom = SGD(lr=0.1), SGD(lr=0.1, momentum=0.9)
    nest_wd = SGD(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)
    sgd_wd = SGD(lr=0.05, weight_decay=1e-4)
    mom_wd = SGD(lr=0.05, momentum=0.9, weight_decay=1e-4)
    adamw = AdamW(lr=1e-3, weight_decay=0.01)
    prof = {"tuning": Tuning(grid_profile=True)}
    u8, f32 = np.uint8, np.float32

    def sz(h, c=10, d=784):
        return [d, h, h, h, c]

    fast = [  # grid_fast.cu
        ("fast_h256_sgd_c10_u8", sz(256), sgd, u8, 32, {}),
        ("fast_h256_mom_c10_u8", sz(256), mom, u8, 32, {}),
        ("fast_h256_adamw_c10_u8", sz(256), adamw, u8, 32, {}),
        ("fast_h256_sgd_c2_u8", sz(256, 2), sgd, u8, 32, {}),
        ("fast_h256_mom_c2_u8", sz(256, 2), mom, u8, 32, {}),
        ("fast_h256_sgd_c10_f32", sz(256), sgd, f32, 32, {}),
        ("fast_h256_sgd_c2_u8_shift", sz(256, 2, 512), sgd, u8, 32, {"normalize": (0.5, 0.25)}),
        ("fast_h512_sgd_c10_u8", sz(512), sgd, u8, 32, {}),
        ("fast_h512_nestwd_c16_u8_b7", sz(512, 16), nest_wd, u8, 7, {}),
        ("fast_h512_adamw_c10_u8_momg", sz(512), adamw, u8, 32, {}),
        ("fast_h512_sgd_c2_u8", sz(512, 2), sgd, u8, 32, {}),
        ("fast_h640_mom_c10_f32_norm", sz(640), mom, f32, 32, {"normalize": (0.1, 2.0)}),
        ("fast_h1024_sgd_c10_u8", sz(1024), sgd, u8, 32, {}),
        ("fast_h1024_mom_c10_u8_momg", sz(1024), mom, u8, 32, {}),
        ("fast_h1024_sgd_c2_u8", sz(1024, 2), sgd, u8, 32, {}),
        ("fast_h1024_sgd_c10_u8_prof", sz(1024), sgd, u8, 32, prof),
    ]
    stream = [  # grid_stream.cu
        ("stream_h2048_sgdwd_c10", sz(2048), sgd_wd, u8, 32, {}),
        ("stream_h2048_momwd_c10", sz(2048), mom_wd, u8, 32, {}),
        ("stream_h2048_nestwd_c16_b7", sz(2048, 16), nest_wd, u8, 7, {}),
        ("stream_h4096_sgd_c10", sz(4096), SGD(lr=0.05), u8, 32, {}),
        ("stream_h4096_momwd_c10", sz(4096), mom_wd, u8, 32, {}),
        ("stream_h4096_sgdwd_c2_norm", sz(4096, 2, 64), sgd_wd, u8, 32, {"normalize": (0.0, 0.5)}),
        ("stream_h8192_sgdwd_c10", sz(8192), sgd_wd, u8, 32, {}),
        ("stream_h8192_sgd_c2", sz(8192, 2), SGD(lr=0.05), u8, 32, {}),
        ("stream_h1152_sgdwd_c10", sz(1152), sgd_wd, u8, 32, {}),
        ("stream_h4096_sgd_c10_prof", sz(4096), SGD(lr=0.05), u8, 32, prof),
    ]
    out = []
    for kind, expect, rows in (("fast", "grid_fast.cu", fast), ("stream", "grid_stream.cu", stream)):
        for name, sizes, opt, xd, batch, kw in rows:
            p = gp.grid_plan(cfg(sizes, opt, batch, **kw), xd, SMS, SMEM)
            assert isinstance(p, gp.GridPlan), (name, p)
            assert p.source == expect, (name, p.why)
            out.append((kind, name, p.source, tuple(p.options)))
    return out + fused_plans()


def fused_plans():
    """(kind, name, source, options) of the fused engine's plans checked: fused/plan.py's fused_plan on the H100."""
    import numpy as np

    from fastnn import MLP, SGD, AdamW
    from fastnn.engine import Tuning
    from fastnn.engine.base import EngineConfig
    from fastnn.engine.fused import plan as fp

    sgd, mom, adamw = SGD(lr=0.1), SGD(lr=0.1, momentum=0.9), AdamW(lr=1e-3, weight_decay=0.01)
    nest_wd = SGD(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)
    u8, f32 = np.uint8, np.float32
    prof = Tuning(fused_profile=True)
    lean = Tuning(fused_layouts=("lean",))
    rows = [  # (family, name, sizes, optimizer, inputs, batch, precision, other EngineConfig fields)
        ("logreg", "logreg_d784_c10_mom_u8", [784, 10], mom, u8, 128, "mixed", {}),
        ("logreg", "logreg_d784_c10_sgd_u8_b32", [784, 10], sgd, u8, 32, "mixed", {}),
        ("logreg", "logreg_d784_c10_adamw_u8", [784, 10], adamw, u8, 128, "mixed", {}),
        ("logreg", "logreg_d784_c10_mom_f32", [784, 10], mom, f32, 128, "mixed", {}),
        ("logreg", "logreg_d784_c10_nestwd_fp16", [784, 10], nest_wd, u8, 64, "fp16", {}),
        ("logreg", "logreg_d784_c16_adamw_u8_shift", [784, 16], adamw, u8, 128, "mixed", {"normalize": (0.5, 0.25)}),
        ("logreg", "logreg_d64_c2_sgd_f32", [64, 2], sgd, f32, 16, "mixed", {}),
        ("logreg", "logreg_d783_c13_mom_u8_b100", [783, 13], mom, u8, 100, "mixed", {}),
        ("logreg", "logreg_d2048_c10_mom_u8_prof", [2048, 10], mom, u8, 128, "mixed", {"tuning": prof}),
        ("mlp", "mlp_784_128x3_10_mom", [784, 128, 128, 128, 10], mom, u8, 32, "mixed", {}),
        ("mlp", "mlp_784_64_10_sgd", [784, 64, 10], sgd, u8, 32, "mixed", {}),
        ("mlp", "mlp_784_128x2_16_nestwd_fp16", [784, 128, 128, 16], nest_wd, u8, 16, "fp16", {}),
        ("mlp", "mlp_100_32x2_2_mom_gelu_b7", [100, 32, 32, 2], mom, u8, 7, "mixed", {"activation": "gelu"}),
        ("mlp", "mlp_783_32x6_10_mom", [783] + [32] * 6 + [10], mom, u8, 32, "mixed", {}),
        ("mlp", "mlp_784_128x3_10_mom_prof", [784, 128, 128, 128, 10], mom, u8, 32, "mixed", {"tuning": prof}),
        ("fused", "fused_784_128x2_10_adamw_mixed", [784, 128, 128, 10], adamw, u8, 128, "mixed", {}),
        ("fused", "fused_784_256_10_mom_fp32_f32", [784, 256, 10], mom, f32, 64, "fp32", {}),
        ("fused", "fused_784_10_adamw_fp32", [784, 10], adamw, u8, 128, "fp32", {}),
        ("fused", "fused_784_256x3_10_mom_lean", [784, 256, 256, 256, 10], mom, u8, 256, "mixed", {"tuning": lean}),
        ("fused", "fused_64_128x2_3_sgd_mse_f32", [64, 128, 128, 3], sgd, f32, 32, "mixed", {"loss": "mse"}),
        ("fused", "fused_784_200_10_nestwd_fp16_b8", [784, 200, 10], nest_wd, u8, 8, "fp16", {}),
        ("fused", "fused_784_256x2_10_mom_prof", [784, 256, 256, 10], mom, u8, 64, "mixed", {"tuning": prof}),
    ]
    expect = {"logreg": "fused_logreg.cu", "mlp": "fused_mlp.cu", "fused": "fused.cu"}
    out = []
    for kind, name, sizes, opt, xd, batch, precision, kw in rows:
        kw = dict(kw)
        act = kw.pop("activation", "relu")
        config = EngineConfig(model=MLP(sizes, activation=act), optimizer=opt, batch_size=batch, precision=precision,
                              **kw)  # fmt: skip
        p = fp.fused_plan(config, xd, fp.HOPPER_SMEM)
        assert isinstance(p, fp.FusedPlan), (name, p)
        assert p.source == expect[kind], (name, p.source, p.why)
        out.append((kind, name, p.source, tuple(p.options)))
    return out


def _one(job):
    repo, native, out, arch, name, source, options = job
    sys.path.insert(0, repo)
    from fastnn.cuda.nvrtc import compile_source

    native = Path(native)
    cubin = compile_source((native / source).read_text(), source, arch, options, include_dirs=(native,))
    path = Path(out) / f"{name}.cubin"
    path.write_bytes(cubin)
    tool = cuobjdump()
    env = dict(os.environ, PATH=os.pathsep.join((str(Path(tool).parent), os.environ.get("PATH", ""))))  # nvdisasm
    for flag, ext in (("-sass", "sass"), ("-res-usage", "res")):
        text = subprocess.run([tool, flag, str(path)], check=True, capture_output=True, text=True, env=env).stdout
        (Path(out) / f"{name}.{ext}").write_text(text)
    (Path(out) / f"{name}.opts").write_text("\n".join((arch, source, *options)) + "\n")
    return name


def dump(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    jobs = [(args.repo, str(Path(args.native).resolve()), str(out), args.arch, name, source, options)
            for kind, name, source, options in plans(args.repo)
            if (only is None or kind in only) and (not args.names or name in args.names.split(","))]  # fmt: skip
    with ProcessPoolExecutor(args.j) as pool:
        for name in pool.map(_one, jobs):
            print("compiled", name, flush=True)
    return 0


def diff(args) -> int:
    a, b = Path(args.a), Path(args.b)
    names = sorted({p.name for p in a.glob("*.sass")} | {p.name for p in b.glob("*.sass")})
    bad = 0
    for sass in names:
        stem = sass[:-5]
        for ext in ("sass", "res", "opts"):
            fa, fb = a / f"{stem}.{ext}", b / f"{stem}.{ext}"
            if not fa.exists() or not fb.exists():
                print(f"MISSING {stem}.{ext}")
                bad += 1
                continue
            ta, tb = fa.read_text(), fb.read_text()
            if ta != tb:
                bad += 1
                lines = list(difflib.unified_diff(ta.splitlines(), tb.splitlines(), f"A/{stem}.{ext}",
                                                  f"B/{stem}.{ext}", lineterm="", n=1))  # fmt: skip
                print(f"DIFF {stem}.{ext}: {sum(1 for x in lines if x[:1] in '+-') - 2} lines changed")
                print("\n".join(lines[: args.show]))
        if (a / sass).exists():
            n_ins = sum(1 for ln in (a / sass).read_text().splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", ln))
            print(f"checked {stem}: {n_ins} instructions")
    same_cubin = sum(1 for c in a.glob("*.cubin")
                     if (b / c.name).exists() and c.read_bytes() == (b / c.name).read_bytes())  # fmt: skip
    print(f"{len(names)} plans compared, {bad} files differ (SASS, resource usage, options); "
          f"{same_cubin} of {len(list(a.glob('*.cubin')))} whole cubins byte-identical")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("native")
    d.add_argument("out")
    d.add_argument("--repo", default=str(REPO), help="the checkout whose fastnn makes the plans (default: this one)")
    d.add_argument("--arch", default="sm_90")
    d.add_argument("--only", default="")
    d.add_argument("--names", default="", help="comma-separated plan names (default: all)")
    d.add_argument("-j", type=int, default=2)
    c = sub.add_parser("diff")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--show", type=int, default=60)
    args = ap.parse_args()
    return dump(args) if args.cmd == "dump" else diff(args)


if __name__ == "__main__":
    sys.exit(main())
