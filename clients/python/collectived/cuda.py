"""CUDA tensors: how the Python client hands a torch CUDA tensor to its sidecar, and orders a
stream after the sidecar's work on it.

The allocation the tensor lies in is shared through CUDA IPC (its handle and the tensor's offset
in it) together with an interprocess event recorded on the tensor's device's current stream, so
that the sidecar's stream waits for the work that produces the tensor, without a CPU
synchronisation. The export is the C++ client's own (libcollectived_cuda.so, opened with ctypes
when the first CUDA tensor is passed, so that nothing of CUDA is loaded before),
not torch's ``storage._share_cuda_()``: torch's ties a storage's release to a reference counter
in a named /dev/shm file that the receiver must decrement, and a sidecar takes no memory by name.
"""

import ctypes
import functools

from collectived import native
from collectived.v1 import common_pb2


def _declare(lib):
    """The signatures of the export functions this module calls."""
    lib.collectived_cuda_available.restype = ctypes.c_int
    lib.collectived_cuda_export.restype = ctypes.c_int
    lib.collectived_cuda_export.argtypes = [
        ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int, ctypes.c_uint64, ctypes.c_char_p,
        ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64), ctypes.c_char_p, ctypes.c_uint64]
    lib.collectived_cuda_wait_sidecar_event.restype = ctypes.c_int
    lib.collectived_cuda_wait_sidecar_event.argtypes = [
        ctypes.c_int, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_char_p,
        ctypes.c_uint64]


def _library():
    """The CUDA half of the native library, opened on first use. Raises ValueError when this
    client was built without CUDA or the machine has no CUDA runtime."""
    try:
        lib = native.load(native.CUDA, _declare)
    except native.LoadError as error:
        raise ValueError(f"CUDA tensors need the CUDA runtime (libcudart), which this machine "
                         f"does not provide: {error}") from None
    if lib is None:
        raise ValueError("this Python client was built without CUDA (libcollectived_cuda.so is "
                         "absent): it cannot pass CUDA tensors")
    return lib


def built():
    """Whether this client was built with CUDA, without loading anything of CUDA."""
    return native.built(native.CUDA)


@functools.lru_cache(maxsize=None)
def available():
    """Whether this client can pass CUDA tensors: built with CUDA, and the CUDA runtime loads.
    Loads the CUDA half: call it only where CUDA is about to be used."""
    try:
        return _library().collectived_cuda_available() == 1
    except ValueError:
        return False


def export(ptr, nbytes, device, stream):
    """A CudaIpcRef for ``nbytes`` bytes at device pointer ``ptr`` of CUDA device ``device``,
    ordered after the work queued on ``stream`` (a cudaStream_t as an integer). Raises
    ValueError with the reason when the memory cannot be shared."""
    lib = _library()
    memory = ctypes.create_string_buffer(64)
    event = ctypes.create_string_buffer(64)
    offset = ctypes.c_uint64(0)
    error = ctypes.create_string_buffer(512)
    if lib.collectived_cuda_export(ptr, nbytes, device, stream, memory, event,
                                   ctypes.byref(offset), error, len(error)) != 0:
        raise ValueError(error.value.decode(errors="replace") or "CUDA export failed")
    return common_pb2.CudaIpcRef(mem_handle=memory.raw, offset=offset.value, length=nbytes,
                                 device=device, event_handle=event.raw)


def export_tensor(tensor):
    """A CudaIpcRef for a contiguous torch CUDA tensor, ordered after its device's current
    stream."""
    import torch
    device = tensor.device.index if tensor.device.index is not None else \
        torch.cuda.current_device()
    stream = torch.cuda.current_stream(device).cuda_stream
    return export(tensor.data_ptr(), tensor.numel() * tensor.element_size(), device, stream)


def wait_sidecar_event(device, stream, event_handle):
    """Makes ``stream`` (a cudaStream_t as an integer) of CUDA device ``device`` wait, with no
    CPU wait, for the work the sidecar enqueued before recording ``event_handle`` (an op's
    CollectiveResponse.completion_event). Raises ValueError with the reason when it cannot."""
    lib = _library()
    error = ctypes.create_string_buffer(512)
    if lib.collectived_cuda_wait_sidecar_event(device, stream, event_handle, len(event_handle),
                                               error, len(error)) != 0:
        raise ValueError(error.value.decode(errors="replace") or "waiting on a CUDA event failed")
