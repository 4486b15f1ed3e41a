"""Zero-copy torch tensors: a CPU tensor's storage is moved into shared memory in place the first
time it is used in a collective, and its file descriptor registered with the sidecar once.

This is what ``torch.multiprocessing`` does with ``share_memory_()``: the storage's bytes are
copied into an anonymous shared-memory file and the storage points at it from then on, so every
view of it (DDP's buckets and the gradients that are views of them included) sees the same
memory, and later collectives on it copy nothing. Like ``share_memory_()``, it also moves a
tensor that aliases foreign memory (``torch.from_numpy``, ``torch.frombuffer``): the alias is
broken. ``COLLECTIVED_TORCH_ADOPT_MAX_BYTES=0`` turns adoption off (everything is staged).

Bounded: at most ``max_bytes`` of adopted storages stay registered per session (the least
recently used are unregistered first); a tensor smaller than ``min_bytes``, or a storage larger
than the bound, is staged instead. A registration is reused only while it still names the same
file (its inode): a storage freed and another allocated at the same address is registered anew.
"""

import collections
import os
import threading

from collectived import environment

_DEFAULT_MAX_BYTES = 4 << 30
_DEFAULT_MIN_BYTES = 64 << 10


def _env_bytes(name, default):
    value = environment.get(name, "")
    try:
        return int(value) if value else default
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number of bytes") from None


def _untyped(tensor):
    if hasattr(tensor, "untyped_storage"):  # torch 2.x
        return tensor.untyped_storage()
    storage = tensor.storage()
    return storage.untyped() if hasattr(storage, "untyped") else storage._storage


class Adopter:
    """The adopted storages of one client session. Thread-safe."""

    def __init__(self, client, max_bytes=None, min_bytes=None):
        self._client = client
        self.max_bytes = _env_bytes("COLLECTIVED_TORCH_ADOPT_MAX_BYTES", _DEFAULT_MAX_BYTES) \
            if max_bytes is None else max_bytes
        self.min_bytes = _env_bytes("COLLECTIVED_TORCH_ADOPT_MIN_BYTES", _DEFAULT_MIN_BYTES) \
            if min_bytes is None else min_bytes
        self._lock = threading.Lock()
        self._regions = collections.OrderedDict()  # (address, size) -> (region, inode)
        self._bytes = 0
        self.adopted = 0  # storages moved into shared memory
        self.reused = 0   # ops that found their storage registered already

    def region_for(self, tensor):
        """The registered region ``tensor`` lives in after adopting its storage, or None when it
        must be staged (too small, too big, not contiguous, or shared some other way)."""
        if self.max_bytes <= 0 or not tensor.is_contiguous():
            return None
        if tensor.numel() * tensor.element_size() < self.min_bytes:
            return None
        storage = _untyped(tensor)
        size = storage.nbytes()
        if size > self.max_bytes:
            return None
        with self._lock:
            was_shared = storage.is_shared()
            try:
                fd, _ = storage._share_fd_cpu_()  # moves it in place unless shared already
            except RuntimeError:
                return None  # shared by file name (torch's file_system strategy): stage it
            inode = os.fstat(fd).st_ino
            key = (storage.data_ptr(), size)
            entry = self._regions.get(key)
            if entry is not None and entry[1] == inode:
                self._regions.move_to_end(key)
                self.reused += 1
                return entry[0]
            if entry is not None:  # that address now holds another file: forget the old one
                self._forget(key)
            while self._regions and self._bytes + size > self.max_bytes:
                self._forget(next(iter(self._regions)))
            region = self._client.register_fd(fd, size)
            region.address = storage.data_ptr()
            self._regions[key] = (region, inode)
            self._bytes += size
            if not was_shared:
                self.adopted += 1
            return region

    def _forget(self, key):
        region, _ = self._regions.pop(key)
        self._bytes -= region.size
        try:
            region.close()
        except Exception:  # noqa: BLE001 - a lost session released it already
            pass

    def registered_bytes(self):
        with self._lock:
            return self._bytes
