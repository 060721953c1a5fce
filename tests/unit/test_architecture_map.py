"""ARCHITECTURE.md, the repository's map, names only files that are in the repository: a module renamed or moved
without the map fails here."""

import os
import re
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
NOT_SOURCES = {".git", ".venv", "build", "__pycache__"}


def repository_files() -> list[str]:
    found = []
    for folder, folders, names in os.walk(REPOSITORY):
        folders[:] = [name for name in folders if name not in NOT_SOURCES and not name.endswith(".egg-info")]
        found += [Path(folder, name).relative_to(REPOSITORY).as_posix() for name in names]
    return found


def test_every_file_the_map_names_is_in_the_repository():
    named = set(re.findall(r"`([^`\s<]+\.(?:py|md|sh))`", (REPOSITORY / "ARCHITECTURE.md").read_text()))
    files = repository_files()
    missing = sorted(name for name in named if not any(path == name or path.endswith(f"/{name}") for path in files))
    assert len(named) > 20 and missing == [], f"ARCHITECTURE.md names files that are not here: {missing}"
