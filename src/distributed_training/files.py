"""Files and folders that are whole or absent: written under a temporary name beside their place, then renamed into
it. A process killed mid-write (or a reader that looks while a retry rewrites the file) sees the old file or the new,
never half."""

import json
import os
import shutil
import uuid
from typing import BinaryIO, Callable


def write_atomically(path: str, write: Callable[[BinaryIO], object], mode: int | None = None) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    partial = f"{path}.partial-{os.getpid()}"
    try:
        with open(partial, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        if mode is not None:
            os.chmod(partial, mode)
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def write_json(path: str, content: dict) -> None:
    write_atomically(path, lambda file: file.write(json.dumps(content, indent=2).encode()))


def write_text(path: str, text: str, mode: int | None = None) -> None:
    write_atomically(path, lambda file: file.write(text.encode()), mode)


def write_folder_atomically(path: str, write: Callable[[str], object]) -> None:
    """`write(folder)` fills a folder beside `path`, which then replaces `path` (an earlier one is deleted only once
    the new one is in place). The folders beside it are this writer's own: writers of one shared output (two score
    jobs) never delete each other's; a writer killed mid-write leaves its `.partial-*` folder."""
    path = path.rstrip("/")
    partial, replaced = (f"{path}.{kind}-{uuid.uuid4().hex[:8]}" for kind in ("partial", "replaced"))
    try:
        write(partial)
        if os.path.exists(path):
            os.rename(path, replaced)
        os.rename(partial, path)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    shutil.rmtree(replaced, ignore_errors=True)
