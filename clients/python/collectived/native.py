"""The Python client's native libraries, built with the client and shipped next to this file,
each loaded once with ctypes (dlopen) by the module that needs it, when it first needs it:

- ``libcollectived_ring.so``: the C++ client's submission ring (collectived.ring). No CUDA.
- ``libcollectived_cuda.so``: the C++ client's CUDA tensor export (collectived.cuda). It links
  the CUDA runtime, so it is opened only when a CUDA tensor is first passed: the client imports
  and runs on CPU tensors on a machine without any CUDA library. Absent when the client was built
  without CUDA.
- ``libcollectived_native.so``: a session of the C++ client (collectived.native_session), for the
  torch backend's native op path; opened only when that path is asked for.

Each user declares the signatures it calls. A library also comes as a second view that keeps the
GIL during its calls (``load(..., keep_gil=True)``, a ``ctypes.PyDLL`` of the same library): for
the short calls of every op, which would otherwise hand the GIL to whichever thread waits for it
(the completion reader, on each op) and wait to get it back. Calls that may wait keep using the
view that releases it."""

import ctypes
import os
import threading

_HERE = os.path.dirname(os.path.abspath(__file__))
RING = os.path.join(_HERE, "libcollectived_ring.so")
CUDA = os.path.join(_HERE, "libcollectived_cuda.so")
NATIVE = os.path.join(_HERE, "libcollectived_native.so")

_lock = threading.Lock()
_libraries = {}  # (path, keep_gil) -> ctypes.CDLL or ctypes.PyDLL
_declared = set()  # (path, keep_gil, declare function) already applied


class LoadError(OSError):
    """A native library exists but cannot be loaded; ``str()`` has the loader's words."""


def built(path):
    """Whether the library at ``path`` was built with this client (without loading it)."""
    return os.path.exists(path)


def load(path=RING, declare=None, keep_gil=False):
    """The library at ``path`` (RING, CUDA or NATIVE), loaded on first use, or None when it was not
    built. Raises LoadError when it exists but the loader refuses it (for the CUDA library: no
    CUDA runtime on this machine). ``declare(lib)``, a module's function that sets the signatures
    it calls, runs once per view, on the first load that names it. With ``keep_gil``, the view
    whose calls keep the GIL (for calls that never wait)."""
    key = (path, keep_gil)
    lib = _libraries.get(key)
    if lib is not None and (declare is None or (path, keep_gil, declare) in _declared):
        return lib
    with _lock:
        lib = _libraries.get(key)
        if lib is None:
            if not os.path.exists(path):
                return None
            try:
                lib = (ctypes.PyDLL if keep_gil else ctypes.CDLL)(path)
            except OSError as error:
                raise LoadError(f"cannot load {os.path.basename(path)}: {error}") from None
            _libraries[key] = lib
        if declare is not None and (path, keep_gil, declare) not in _declared:
            declare(lib)
            _declared.add((path, keep_gil, declare))
        return lib
