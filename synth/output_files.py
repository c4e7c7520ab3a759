"""The one way synth writes a file a user named (or a results directory it made): every command
goes through `write_text` or `writing`, so no run leaves a half-written file or replaces
something that was not a file.

* A regular file (new or existing) is written to a temporary file in the same directory,
  flushed to disk, and renamed over the target: a full disk or an interrupted run leaves the
  old file (or none), never a truncated one. A new file gets the mode the umask gives
  (0644 under umask 022), an existing file keeps its mode.
* A symbolic link to a regular file: the file it points to is replaced; the link stays.
* Anything that is not a regular file (a device such as /dev/null, a FIFO, a link to
  /proc/self/fd/1 or /dev/stdout) is written through, by opening the path: it is never
  replaced by a regular file.
* A file owned by another user (as root, say) keeps its owner: the replacement is given the
  old owner and group before the rename; where that is not permitted, the file is written
  through in place (as a shell's `>` would), keeping owner and mode, not atomically. A file
  with several hard links is written through too, so every name sees the new text.
* A directory, a missing parent directory or any failed write is one UsageError naming the
  path and the reason (exit 2); the temporary file is removed.
"""

from __future__ import annotations

import os
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

from synth.errors import UsageError


def write_text(path: str | os.PathLike, text: str, what: str | None = None) -> Path:
    """Write `text` (UTF-8) to `path` as the module docstring says; returns the path.
    `what` names the path in errors (e.g. "-o out.toml"); default: the path itself."""
    with writing(path, what) as handle:
        handle.write(text)
    return Path(path)


def write_bytes(path: str | os.PathLike, data: bytes, what: str | None = None) -> Path:
    """Write `data` (a picture) to `path` as the module docstring says; returns the path."""
    with writing(path, what, binary=True) as handle:
        handle.write(data)
    return Path(path)


@contextmanager
def writing(path: str | os.PathLike, what: str | None = None, newline: str | None = None,
            binary: bool = False) -> Iterator[IO]:
    """A text handle (a bytes one with `binary`) on `path`'s new content (for csv.writer and
    json.dump): the file is put in place when the block ends without an exception, and left as
    it was when it raises."""
    target = Path(path)
    label = what or str(target)
    through, real = _plan(target, label)
    mode = (binary, newline)
    temporary, handle = (None, _open(real, label, mode)) if through else _temporary(real, label, mode)
    committed = False
    try:
        with handle:
            yield handle
            handle.flush()
            if temporary is not None:
                os.fsync(handle.fileno())  # a full disk shows here, before the old file is gone
        if temporary is not None:
            os.replace(temporary, real)
        committed = True
    except OSError as error:
        raise _failed(label, error) from None
    finally:
        if temporary is not None and not committed:
            _remove(temporary)


def _open(real: Path, label: str, mode: tuple[bool, str | None]) -> IO:
    """Write through: the path opened for writing, as a shell's `>` opens it."""
    try:
        return open(real, "wb") if mode[0] else open(real, "w", encoding="utf-8", newline=mode[1])
    except OSError as error:
        raise _failed(label, error) from None


def _fdopen(fd: int, mode: tuple[bool, str | None]) -> IO:
    return os.fdopen(fd, "wb") if mode[0] else os.fdopen(fd, "w", encoding="utf-8", newline=mode[1])


def _plan(target: Path, label: str) -> tuple[bool, Path]:
    """(write through?, the path to write): links followed to what they name."""
    try:
        info = os.stat(target)  # follows links: a link to /proc/self/fd/1 is a pipe or a terminal
    except FileNotFoundError:
        real = Path(os.path.realpath(target))  # a dangling link: create what it names
        if not real.parent.is_dir():
            raise UsageError(f"{_shown(label)}: cannot write it (no directory {_shown(str(real.parent))})") from None
        return False, real
    except (OSError, ValueError) as error:
        raise _failed(label, error) from None
    if stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{_shown(label)} is a directory; give a file name")
    if not stat.S_ISREG(info.st_mode):
        return True, target
    if info.st_nlink > 1:
        return True, target
    return False, Path(os.path.realpath(target))


def _temporary(real: Path, label: str, mode: tuple[bool, str | None]) -> tuple[Path | None, IO]:
    """(a new file beside `real` with its final mode and owner, its handle); (None, a handle
    on `real` itself) for another user's file whose owner we may not give the new one."""
    try:
        existing = os.stat(real)
    except FileNotFoundError:
        existing = None
    except OSError as error:
        raise _failed(label, error) from None
    for _ in range(100):
        temporary = real.parent / f".{real.name[:32]}.{os.urandom(4).hex()}.tmp"  # short: any name fits
        try:
            # 0o666 & ~umask, as open(path, "w") gives a new file (mkstemp would give 0600)
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
            break
        except FileExistsError:
            continue
        except PermissionError as error:  # a directory we may not add to, a file we may write: in place
            if existing is not None and os.access(real, os.W_OK):
                return None, _open(real, label, mode)
            raise _failed(label, error) from None
        except OSError as error:
            raise _failed(label, error) from None
    else:
        raise UsageError(f"{_shown(label)}: cannot write it (no free temporary name in {_shown(str(real.parent))})")
    try:
        if existing is not None:
            os.fchmod(fd, stat.S_IMODE(existing.st_mode))
            if (existing.st_uid, existing.st_gid) != _owner(fd):
                os.fchown(fd, existing.st_uid, existing.st_gid)
        handle = _fdopen(fd, mode)
    except PermissionError:
        os.close(fd)
        _remove(temporary)
        return None, _open(real, label, mode)
    except OSError as error:
        os.close(fd)
        _remove(temporary)
        raise _failed(label, error) from None
    return temporary, handle


def _owner(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_uid, info.st_gid


def _remove(temporary: Path) -> None:
    try:
        os.unlink(temporary)
    except OSError:
        pass


def _shown(text: str) -> str:
    shown = repr(text)[1:-1] if not text.isprintable() else text
    return shown if len(shown) <= 120 else shown[:100] + f"... ({len(text)} characters)"


def _failed(label: str, error: Exception) -> UsageError:
    reason = getattr(error, "strerror", None) or " ".join(str(error).split()) or type(error).__name__
    return UsageError(f"{_shown(label)}: cannot write it ({reason})")
