"""benchmarks/sass_compare.py on the CPU: its fused families are fastnn's own plans for each fused kernel, and its
diff fails on a changed instruction (the proof a kernel refactor is behaviour-neutral rests on both)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("sass_compare", REPO / "benchmarks" / "sass_compare.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("sass_compare", mod)
    spec.loader.exec_module(mod)
    return mod


def test_the_fused_families_are_the_fused_plans_of_each_kernel():
    plans = _module().fused_plans()
    sources = {"logreg": "fused_logreg.cu", "mlp": "fused_mlp.cu", "fused": "fused.cu"}
    assert {kind for kind, *_ in plans} == set(sources)
    assert len({name for _, name, *_ in plans}) == len(plans)  # one dump file per plan
    for kind, name, source, options in plans:
        assert source == sources[kind], name
        assert options and options[0] == "-std=c++17", name
    opts = {name: " ".join(options) for _, name, _, options in plans}
    # what the refactor must keep: both input kinds, both operand precisions, SGD with and without state, AdamW
    assert any("-DLR_XF=1" in o for o in opts.values()) and any("-DLR_XF=0" in o for o in opts.values())
    assert any("-DLR_PREC=2" in o for o in opts.values()) and any("-DMP_PREC=2" in o for o in opts.values())
    assert any("-DLR_OPT=1" in o for o in opts.values()) and any("-DLR_NS=0" in o for o in opts.values())
    assert any("-DMP_NS=0" in o for o in opts.values()) and any("-DMP_NS=1" in o for o in opts.values())
    assert any("-DFUSED_MMA=1" in o for o in opts.values()) and any("-DFUSED_FOLD=1" in o for o in opts.values())
    assert any("-DFUSED_LOSS=1" in o for o in opts.values())


def test_diff_passes_identical_dumps_and_fails_a_changed_instruction(tmp_path, capsys):
    mod = _module()
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "k.sass").write_text("        /*0000*/                   MOV R1, c[0x0][0x28] ;\n")
        (d / "k.res").write_text("REG:40\n")
        (d / "k.opts").write_text("sm_90\nfused.cu\n")
        (d / "k.cubin").write_bytes(b"\x7fELF")
    args = SimpleNamespace(a=str(a), b=str(b), show=10)
    assert mod.diff(args) == 0
    (b / "k.sass").write_text("        /*0000*/                   MOV R2, c[0x0][0x28] ;\n")
    assert mod.diff(args) == 1
    assert "DIFF k.sass" in capsys.readouterr().out
