"""Atomic output: every file and directory hexbundle writes appears whole or not at all.

A writer writes under a temp name beside its target (same directory, so same file system), and
renames it over the target only once it is complete: a reader never sees half a file. Every temp
name hexbundle gives in the project's directories comes from here (scripts/make_base_image.sh,
a shell script, spells it out by hand), and all follow ONE scheme (TEMP_NAME):

    .<target>.<pid>.<12 hex digits>.tmp   a file or directory being written: renamed to <target>
                                          when complete, removed on failure
    .<target>.<pid>.<12 hex digits>.old   the previous <target> directory, moved aside by
                                          swap_in while the new one takes its place

e.g. `.qwen2_tiny_part_2_of_4.bin.4242.9f3ac01b77e2.tmp`. A killed writer leaves only such
names. The next run (hexbundle.graph.runguard, under the build lock) first puts a `.old`
directory back where its target is missing (`put_back`), then removes every name `is_temp_name`
accepts, and nothing else.

One API per kind of producer:
  atomic_output(path)   a file object (write_atomic and write_json are built on it)
  output_path(path)     a path not yet created, for producers that create the file themselves
                        (tarfile, os.link, an SDK's save(path)); same_name=True gives the target's
                        own file name, inside a temp directory, for producers that go by the suffix
  create_temp, commit, discard
                        the three steps apart, for a writer that streams over several calls
                        (formats.container.ContainerWriter)
  staged_dir(final)     a new directory that replaces `final` whole when complete (swap_in)
  temp_dir(near, name)  a scratch directory, removed after use (SDK scratch, pip downloads)

Files are fsynced before the rename unless the writer passes sync=False (the writers of bulk,
regenerable data and of the digest cache, which never did).
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import shutil
import sys
from pathlib import Path
from typing import Optional

from hexbundle.support.errors import output_error
from hexbundle.support.files import link_target

TEMP_NAME = re.compile(r"\.(?P<target>.+)\.(?P<pid>[0-9]+)\.(?P<token>[0-9a-f]{12})"
                       r"\.(?P<kind>tmp|old)", re.DOTALL)


# ---------------------------------------------------------------------------------------------
# the names

def temp_name(target: str, kind: str = "tmp") -> str:
    """A fresh temp name for `target` (a file name, not a path): kind "tmp" for what is being
    written, "old" for a previous directory moved aside."""
    assert kind in ("tmp", "old") and "/" not in target and target
    return f".{target}.{os.getpid()}.{secrets.token_hex(6)}.{kind}"


def is_temp_name(name: str) -> bool:
    """True for a name a writer of ours gave to something not yet (or no longer) in place: what
    the clean-up after a killed run removes. Never true for a target's own name."""
    return TEMP_NAME.fullmatch(name) is not None


def displaced_target(name: str) -> Optional[str]:
    """For a `.old` name (a directory swap_in moved aside): the name it had; else None."""
    m = TEMP_NAME.fullmatch(name)
    return m["target"] if m and m["kind"] == "old" else None


# ---------------------------------------------------------------------------------------------
# the steps

def create_temp(path, mode: int = 0o666) -> tuple:
    """Create a new, empty temp file beside `path`: returns (fd, temp path), as mkstemp does.

    mode 0o666 lets the umask decide, as for any new file (mkstemp's 0600 would survive the
    rename). OSError if the directory is missing or not writable.
    """
    path = Path(path)
    flags = (os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
             | getattr(os, "O_CLOEXEC", 0))
    while True:
        tmp = path.with_name(temp_name(path.name))
        try:
            return os.open(tmp, flags, mode), tmp
        except FileExistsError:
            continue


def commit(tmp, path, sync_dir: bool = False) -> None:
    """Rename the complete temp `tmp` over `path` (atomic: `path` is the old or the new one).
    sync_dir: also fsync the directory, making the rename itself durable."""
    os.replace(tmp, path)
    if sync_dir:
        fsync_dir(Path(path).parent)


def discard(tmp) -> None:
    """Remove a temp file or directory, if it is there."""
    tmp = Path(tmp)
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.unlink(missing_ok=True)


def fsync_dir(directory: Path) -> None:
    try:   # not possible on every platform/filesystem
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _new_temp_dir(near: Path, target: str, mode: int) -> Path:
    while True:
        path = Path(near) / temp_name(target)
        try:
            os.mkdir(path, mode)
            return path
        except FileExistsError:
            continue


# ---------------------------------------------------------------------------------------------
# files

@contextlib.contextmanager
def _failing_cleanly(path: Path, user_errors: bool, tmp: Optional[Path] = None):
    """On any failure in the body: the temp `tmp` (if any) is removed, and with user_errors an
    OSError (full disk, file-size limit) becomes an OutputError naming `path`."""
    try:
        yield
    except BaseException as exc:
        if tmp is not None:
            discard(tmp)
        if user_errors and isinstance(exc, OSError):
            raise output_error(path, exc) from None
        raise


@contextlib.contextmanager
def atomic_output(path, mode: str = "wb", user_errors: bool = True, *, sync: bool = True,
                  perms: Optional[int] = 0o644):
    """Yield a file object; on success it replaces `path`, on any failure nothing is left.

    user_errors: an OSError (full disk, file-size limit) becomes an OutputError naming the file.
    sync: fsync the file before the rename. perms: the file's mode (None: the umask decides).
    """
    path = Path(path)
    with _failing_cleanly(path, user_errors):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = create_temp(path)
    with _failing_cleanly(path, user_errors, tmp):
        with os.fdopen(fd, mode) as fh:
            yield fh
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        if perms is not None:
            os.chmod(tmp, perms)
        commit(tmp, path)


@contextlib.contextmanager
def output_path(path, user_errors: bool = True, *, sync: bool = True, same_name: bool = False):
    """Yield a temp path beside `path`, not yet created: the body creates the file there (opens
    it, links it, has a tool save to it). On success it replaces `path`; on any failure nothing
    is left. user_errors and sync as for atomic_output.

    same_name: the path has `path`'s own file name, inside a temp directory beside it, for tools
    that choose the format by, or append, the suffix.
    """
    path = Path(path)
    holder = None
    with _failing_cleanly(path, user_errors):
        path.parent.mkdir(parents=True, exist_ok=True)
        if same_name:
            holder = _new_temp_dir(path.parent, path.name, 0o700)
    tmp = holder / path.name if holder else path.with_name(temp_name(path.name))
    try:
        with _failing_cleanly(path, user_errors, tmp):
            yield tmp
            if sync:
                _fsync_file(tmp)
            commit(tmp, path)
    finally:
        if holder is not None:
            discard(holder)


def write_atomic(path, data: bytes) -> None:
    with atomic_output(path) as fh:
        fh.write(data)


def json_bytes(obj) -> bytes:
    """Indented JSON, keys in the order given, ASCII, newline-terminated: the bytes of every JSON
    file hexbundle writes for people and runtimes to read (bundle configs, manifest, reports)."""
    return (json.dumps(obj, indent=2, sort_keys=False, ensure_ascii=True) + "\n").encode()


def write_json(path, obj) -> None:
    write_atomic(path, json_bytes(obj))


# ---------------------------------------------------------------------------------------------
# directories

@contextlib.contextmanager
def staged_dir(final, mode: int = 0o700):
    """Yield a new empty directory beside `final`; when the body completes, it replaces `final`
    whole (swap_in). On any failure it is removed and `final` is untouched.

    mode: of the new directory (0o700 like mkdtemp; 0o777 lets the umask decide).
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = _new_temp_dir(final.parent, final.name, mode)
    try:
        yield staging
        swap_in(staging, final)
    finally:
        discard(staging)   # gone after a plain rename; the old directory after an exchange


@contextlib.contextmanager
def temp_dir(near, name: str):
    """Yield a new scratch directory in `near` (named for `name`), removed afterwards."""
    path = _new_temp_dir(Path(near), name, 0o700)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def swap_in(staging: Path, final: Path) -> None:
    """Replace `final` by `staging`: the old directory stays whole until the new one is complete.

    Where the kernel can (Linux renameat2 RENAME_EXCHANGE), the two directories trade places in
    one step, so `final` is at every instant either the whole old or the whole new directory.
    Elsewhere, two renames: a kill between them leaves the old one as `.<final>.<pid>.<token>.old`,
    which the next run puts back (put_back, from hexbundle.graph.runguard).
    """
    if not final.exists():
        os.rename(staging, final)
        return
    if exchange_dirs(staging, final):
        discard(staging)   # it now holds the old directory (or whatever was in its place)
        return
    old = final.with_name(temp_name(final.name, "old"))
    os.rename(final, old)
    os.rename(staging, final)
    discard(old)


def aside_name(path: Path, tag: str) -> Path:
    """A free name beside `path` to move it to: <name>.<tag>, or <name>.<tag>.<n>."""
    path = Path(path)
    aside, n = path.with_name(f"{path.name}.{tag}"), 1
    while aside.exists() or aside.is_symlink():
        n += 1
        aside = path.with_name(f"{path.name}.{tag}.{n}")
    return aside


def set_aside(path: Path, tag: str) -> Path:
    """Move `path` itself to aside_name(path, tag) (a symbolic link is moved as a link, its
    target left as it is); returns the new name. OSError if it cannot be moved."""
    aside = aside_name(path, tag)
    os.replace(path, aside)
    return aside


def set_aside_link(path: Path, what: str, then: str) -> None:
    """A state file found to be a symbolic link (to a file outside the build root, maybe): not
    read, the link alone moved aside so the next save writes a file of hexbundle's own there,
    and one warning saying `what` it is and what happens `then`."""
    target = link_target(path)
    try:
        where = f"set aside as {set_aside(path, 'link').name}"
    except FileNotFoundError:
        where = "gone meanwhile"
    except OSError as exc:
        where = f"left in place (cannot move it: {exc.strerror})"
    print(f"hexbundle: warning: {what} {path} is a symbolic link (to {target}), not "
          f"hexbundle's file: not read, {where}; {then}", file=sys.stderr, flush=True)


def put_back(path: Path) -> Optional[Path]:
    """If `path` is a directory swap_in moved aside and its target is missing (a kill between
    swap_in's two renames), rename it back and return the target; else None."""
    target = displaced_target(path.name)
    if target is None:
        return None
    final = path.with_name(target)
    if final.exists() or final.is_symlink():
        return None
    os.rename(path, final)
    return final


_RENAME_EXCHANGE = 2


_AT_FDCWD = -100


def exchange_dirs(a: Path, b: Path) -> bool:
    """Atomically swap two paths; False where the OS or filesystem cannot (then nothing moved)."""
    import ctypes   # here, not at the top: every doit command imports this module
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):   # not Linux, or a libc without renameat2 (< glibc 2.28)
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))
