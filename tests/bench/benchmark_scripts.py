"""Imports a script of benchmarks/ as a module (they are not a package), with benchmarks/
on the path for the scripts that import each other."""
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def load_benchmark(name: str):
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
