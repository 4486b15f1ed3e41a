"""A per-session pool of shared memory that stages tensors which do not live in shared memory.

Arenas are registered once and reused by every op; ranges are handed out first-fit and returned
when the op completes, so nothing is registered per op.
"""

import threading

import torch

_ALIGN = 64
_MIN_ARENA = 64 << 20


class _Arena:
    def __init__(self, buffer):
        self.buffer = buffer
        self.free = [(0, buffer.size)]  # sorted (offset, length)

    def take(self, nbytes):
        for i, (offset, length) in enumerate(self.free):
            if length >= nbytes:
                if length == nbytes:
                    del self.free[i]
                else:
                    self.free[i] = (offset + nbytes, length - nbytes)
                return offset
        return None

    def give(self, offset, nbytes):
        self.free.append((offset, nbytes))
        self.free.sort()
        merged = []
        for o, n in self.free:
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((o, n))
        self.free = merged


class StagingPool:
    """Hands out shared-memory torch tensors; thread-safe."""

    def __init__(self, client):
        self._client = client
        self._arenas = []
        self._lock = threading.Lock()

    def tensor(self, like):
        """A shared-memory tensor shaped and typed like ``like`` (returned with release())."""
        nbytes = max(_ALIGN, (like.numel() * like.element_size() + _ALIGN - 1) // _ALIGN * _ALIGN)
        with self._lock:
            for arena in self._arenas:
                offset = arena.take(nbytes)
                if offset is not None:
                    break
            else:
                arena = _Arena(self._client.allocate(max(_MIN_ARENA, 2 * nbytes)))
                self._arenas.append(arena)
                offset = arena.take(nbytes)
        view = arena.buffer.tensor((like.numel(),), like.dtype, offset).view(like.shape)
        return view, (arena, offset, nbytes)

    def release(self, handle):
        arena, offset, nbytes = handle
        with self._lock:
            arena.give(offset, nbytes)

    def registered_bytes(self):
        with self._lock:
            return sum(a.buffer.size for a in self._arenas)
