"""Files that are whole or absent: written under a temporary name beside their place, then renamed into it. A process
killed mid-write (or a reader that looks while a retry rewrites the file) sees the old file or the new, never half."""

import json
import os
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
