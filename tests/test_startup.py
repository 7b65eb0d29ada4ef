"""What a doit command imports: `doit list`, `doit help TASK` and a build with nothing to do pay for
no heavy module (onnx alone costs ~1 s to import). dodo.py names its actions' functions as
"module:function" (hexbundle.graph.actions), imported when an action runs.

Speed itself is measured by `doit bench` (row 2: `doit list` and a no-op build vs
`python -m doit --version`), not asserted here.
"""
import json
import os
import subprocess
import sys

import pytest

HEAVY = ("onnx", "numpy", "onnxruntime", "ml_dtypes", "tokenizers", "grpc", "docker")

# doit's own entry point (python -m doit) run in-process, then what it left in sys.modules.
RUN_DOIT = """
import json, runpy, sys
sys.argv = ["doit", *json.loads(sys.argv[1])]
try:
    runpy.run_module("doit", run_name="__main__", alter_sys=True)
    code = 0
except SystemExit as exc:
    code = exc.code or 0
print("\\nIMPORTED " + json.dumps({"code": code,
                                   "heavy": sorted(m for m in HEAVY if m in sys.modules)}))
"""


def doit_imports(root, *args) -> tuple:
    """(exit code, the heavy modules imported, doit's output) of `python -m doit ARGS`."""
    code = f"HEAVY = {HEAVY!r}\n" + RUN_DOIT
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(list(args))], cwd=root,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    marker = [line for line in proc.stdout.splitlines() if line.startswith("IMPORTED ")]
    assert marker, f"doit {' '.join(args)} did not finish:\n{proc.stdout}\n{proc.stderr}"
    result = json.loads(marker[-1][len("IMPORTED "):])
    return result["code"], result["heavy"], proc.stdout + proc.stderr


def test_the_probe_sees_a_heavy_import(project):
    """The probe itself: a command that does import numpy is seen doing so."""
    (project.root / "dodo.py").write_text("import numpy\n\ndef task_x():\n"
                                          "    return {'actions': ['true']}\n")
    code, heavy, out = doit_imports(project.root, "list")
    assert code == 0 and "numpy" in heavy, out


@pytest.mark.parametrize("args", [("list",), ("list", "--all"), ("help", "inspect")],
                         ids=" ".join)
def test_listing_and_help_import_no_heavy_module(project, args):
    code, heavy, out = doit_imports(project.root, *args)
    assert code == 0, out
    assert heavy == [], f"`doit {' '.join(args)}` imported {heavy}"


def test_a_build_with_nothing_to_do_imports_no_heavy_module(built):
    code, heavy, out = doit_imports(built.root, "bundle")
    assert code == 0, out
    assert "\n.  " not in out, f"the build was not up to date:\n{out}"
    assert heavy == [], f"a no-op `doit bundle` imported {heavy}"
