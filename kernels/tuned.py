"""Tuned launch configurations: per-GPU tables that `dsactl tune` writes and the Triton launchers read.

A kernel module's table is JSON beside it, kernels/<stage>/tuned/<module>.json (a bundle copies it with
the module): {"kernel": <module>, "entries": [...]}, each entry one GPU (device name and compute
capability), one shape bucket (a string the launcher derives from the call's shape), the launch knobs
that won there and where they came from (command, date, timing method, us of the winner and of the
hand-picked configuration). A call whose GPU and bucket have no entry keeps the hand-picked
configuration. Nothing here may fail a call: an unreadable table or an entry the launcher refuses is
warned about once and ignored. Standard library only, so `dsactl list` reads tables without torch.
"""

from __future__ import annotations

import contextlib
import functools
import json
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

TABLE_FOLDER = "tuned"
TABLE_SUFFIX = ".json"
T = TypeVar("T")


@dataclass(frozen=True)
class Entry:
    gpu: str  # torch.cuda.get_device_name, e.g. "NVIDIA H200"
    capability: tuple[int, int]
    bucket: str
    config: dict[str, Any]  # the launcher's knobs, by name
    source: dict[str, Any] = field(default_factory=dict)  # command, date, method, us, default_us

    @property
    def key(self) -> tuple[str, tuple[int, int], str]:
        return self.gpu, self.capability, self.bucket


def table_path(module_file: str | Path) -> Path:
    """The table of the kernel module at module_file."""
    module = Path(module_file)
    return module.parent / TABLE_FOLDER / (module.stem + TABLE_SUFFIX)


def _entry(raw: Any) -> Entry:
    if not isinstance(raw, dict):
        raise ValueError(f"an entry must be an object, got {type(raw).__name__}")
    gpu, capability, bucket, config = (raw.get(k) for k in ("gpu", "capability", "bucket", "config"))
    source = raw.get("source", {})
    if not (isinstance(gpu, str) and isinstance(bucket, str) and isinstance(config, dict)
            and isinstance(source, dict) and isinstance(capability, list) and len(capability) == 2
            and all(type(c) is int for c in capability)):
        raise ValueError(f"entry {raw!r} needs gpu (text), capability ([major, minor]), bucket (text), "
                         "config (object) and an optional source (object)")
    return Entry(gpu, (capability[0], capability[1]), bucket, config, source)


def read(path: str | Path) -> list[Entry]:
    """The entries of a table file; [] when there is none; ValueError (or OSError) when it is malformed."""
    path = Path(path)
    if not path.is_file():
        return []
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise ValueError(f"{path}: a table is an object with a list of entries")
    entries = [_entry(raw) for raw in data["entries"]]
    keys = [e.key for e in entries]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{path}: an entry repeats a (gpu, capability, bucket)")
    return entries


def merge(old: list[Entry], new: list[Entry]) -> list[Entry]:
    """old with new added, a new entry replacing the old one of its (gpu, capability, bucket)."""
    merged = {e.key: e for e in old}
    merged.update((e.key, e) for e in new)
    return sorted(merged.values(), key=lambda e: e.key)


def dumps(kernel: str, entries: list[Entry]) -> str:
    """The table's text: sorted, one knob set a line, so that a re-tune shows as a small diff."""
    rows = [json.dumps({**asdict(e), "capability": list(e.capability)}, sort_keys=True)
            for e in sorted(entries, key=lambda e: e.key)]
    body = ",\n    ".join(rows)
    return f'{{\n  "kernel": {json.dumps(kernel)},\n  "entries": [' + (f"\n    {body}\n  " if rows else "") + "]\n}\n"


def write(path: str | Path, kernel: str, entries: list[Entry]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(dumps(kernel, entries), encoding="utf-8")
    tmp.replace(path)


@functools.lru_cache(maxsize=None)
def device_identity(device: Any) -> tuple[str, tuple[int, int]] | None:
    """(name, capability) of a CUDA device, None for any other (the interpreter's CPU tensors)."""
    if getattr(device, "type", None) != "cuda":
        return None
    import torch

    return torch.cuda.get_device_name(device), tuple(torch.cuda.get_device_capability(device))


class Table:
    """One kernel module's table, read on its first lookup and kept."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._entries: dict[tuple[str, tuple[int, int], str], dict[str, Any]] | None = None
        self._forced: tuple[dict[str, Any] | None] | None = None  # (config,) while forced
        self._warned: set[str] = set()

    def warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(f"{self.path.name}: {message}; the hand-picked configuration runs instead",
                          RuntimeWarning, stacklevel=4)

    def _load(self) -> dict:
        if self._entries is None:
            try:
                self._entries = {e.key: e.config for e in read(self.path)}
            except (OSError, ValueError) as e:
                self._entries = {}
                self.warn_once("table", f"unreadable ({e})")
        return self._entries

    def lookup(self, identity: tuple[str, tuple[int, int]] | None, bucket: str) -> dict[str, Any] | None:
        """The knobs of this GPU's entry for bucket, or None (no GPU, no entry)."""
        if self._forced is not None:
            return self._forced[0]
        if identity is None:
            return None
        return self._load().get((identity[0], identity[1], bucket))

    def choose(self, identity: tuple[str, tuple[int, int]] | None, bucket: str, tuned: Callable[[dict[str, Any]], T],
               hand_picked: Callable[[], T], refused: type[Exception]) -> T:
        """tuned(knobs) of this GPU's entry for bucket, else hand_picked(); an entry that tuned() refuses
        (raising `refused`) is warned about once and the hand-picked choice runs."""
        knobs = self.lookup(identity, bucket)
        if knobs is not None:
            try:
                return tuned(knobs)
            except refused as e:
                self.warn_once(bucket, f"entry {bucket} refused ({e})")
        return hand_picked()

    def drop(self, identity: tuple[str, tuple[int, int]] | None, bucket: str, why: object) -> bool:
        """Forget this GPU's entry for bucket for the rest of the process, warning once, when a launch of its
        configuration failed: the compiler refusing it (a table written under another compiler can ask for
        more shared memory than this one gives). False where no entry of the file was in play (none, or a
        forced configuration: tune's candidate, whose failure is its answer): the caller re-raises."""
        if self._forced is not None or identity is None:
            return False
        if self._load().pop((identity[0], identity[1], bucket), None) is None:
            return False
        self.warn_once(bucket, f"entry {bucket} did not launch ({why})")
        return True

    @contextlib.contextmanager
    def forced(self, config: dict[str, Any] | None) -> Iterator[None]:
        """Every lookup returns config (None: no entry, the hand-picked choice), whatever the GPU, bucket
        and file: how `dsactl tune` runs a candidate through the launcher's own path (in this process,
        one call at a time)."""
        self._forced = (config,)
        try:
            yield
        finally:
            self._forced = None

    def reload(self) -> None:
        """Read the file again on the next lookup (after a tune wrote it)."""
        self._entries = None
        self._warned.clear()
