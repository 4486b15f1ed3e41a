"""The Python client's native library, libcollectived_ring.so (built with the client, next to
this file): a C interface to the C++ client's submission ring (collectived.ring) and CUDA tensor
export (collectived.cuda), loaded once with ctypes. Each user declares the signatures it calls."""

import ctypes
import os
import threading

_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libcollectived_ring.so")
_lock = threading.Lock()
_lib = None


def load():
    """The loaded library, or None when it was not built."""
    global _lib
    with _lock:
        if _lib is None and os.path.exists(_PATH):
            _lib = ctypes.CDLL(_PATH)
        return _lib
