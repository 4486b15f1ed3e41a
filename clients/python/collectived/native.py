"""The Python client's native library, libcollectived_ring.so (built with the client, next to
this file): a C interface to the C++ client's submission ring (collectived.ring) and CUDA tensor
export (collectived.cuda), loaded once with ctypes. Each user declares the signatures it calls."""

import ctypes
import os
import threading

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libcollectived_ring.so")
_lock = threading.Lock()
_lib = None
_declared = set()  # the declare functions already applied to _lib


def load(declare=None):
    """The loaded library, or None when it was not built. ``declare(lib)``, a module's function
    that sets the signatures it calls, runs once, on the first load that names it."""
    lib = _lib
    if lib is not None and (declare is None or declare in _declared):
        return lib
    return _load_locked(declare)


def _load_locked(declare):
    global _lib
    with _lock:
        if _lib is None and os.path.exists(PATH):
            _lib = ctypes.CDLL(PATH)
        if _lib is not None and declare is not None and declare not in _declared:
            declare(_lib)
            _declared.add(declare)
        return _lib
