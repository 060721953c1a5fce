"""Write the repository's own bundle (databricks.yml, resources/, notebooks/) by rendering the template.

The root bundle is the template's output for the answers below, so the two cannot drift:
`--check` exits 1 and names the files that differ instead of writing them (a test runs it).
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from cookiecutter.main import cookiecutter

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "templates" / "distributed-training"
ANSWERS = {
    "project_name": "Distributed Training",
    "project_slug": "distributed-training",
    "package_name": "distributed_training",
    "cloud": "azure",
    "engine": "all",
}
SYNCED = ("databricks.yml", "resources", "notebooks")


def _files(folder: Path) -> set[Path]:
    return {path.relative_to(folder) for name in SYNCED for path in (folder / name).rglob("*") if path.is_file()} | {
        Path(name) for name in SYNCED if (folder / name).is_file()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report drift instead of writing")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rendered = Path(cookiecutter(str(TEMPLATE), no_input=True, extra_context=ANSWERS, output_dir=tmp))
        expected, actual = _files(rendered), _files(ROOT)
        differ = sorted(str(path) for path in expected | actual
                        if path not in expected or path not in actual
                        or not filecmp.cmp(rendered / path, ROOT / path, shallow=False))
        if args.check:
            for path in differ:
                print(f"{path}: differs from the template's output; run `python scripts/sync_root_bundle.py`")
            return 1 if differ else 0
        for name in SYNCED:
            target = ROOT / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
            source = rendered / name
            (shutil.copytree if source.is_dir() else shutil.copy2)(source, target)
        print(f"wrote {', '.join(SYNCED)} ({len(differ)} file(s) changed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
