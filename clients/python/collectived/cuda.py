"""CUDA tensors: how the Python client hands a torch CUDA tensor to its sidecar, and orders a
stream after the sidecar's work on it.

The allocation the tensor lies in is shared through CUDA IPC (its handle and the tensor's offset
in it) together with an interprocess event recorded on the tensor's device's current stream, so
that the sidecar's stream waits for the work that produces the tensor, without a CPU
synchronisation. The export is the C++ client's own (libcollectived_cuda.so, opened with ctypes
when the first CUDA tensor is passed, so that nothing of CUDA is loaded before),
not torch's ``storage._share_cuda_()``: torch's ties a storage's release to a reference counter
in a named /dev/shm file that the receiver must decrement, and a sidecar takes no memory by name.

Memory of the CUDA VMM API (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``) has no legacy
IPC handle: a tensor there is sent as the physical allocations it spans, each exported once per
session as a POSIX file descriptor over the session's fd channel (VmmRegistrations, the twin of
the C++ client's CudaVmmRegistrar), and the tensor's offset from the first (a CudaVmmRef).
"""

import ctypes
import functools
import os
import threading

from collectived import native, wire
from collectived.v1 import common_pb2


def _declare(lib):
    """The signatures of the export functions this module calls."""
    lib.collectived_cuda_available.restype = ctypes.c_int
    lib.collectived_cuda_export.restype = ctypes.c_int
    lib.collectived_cuda_export.argtypes = [
        ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int, ctypes.c_uint64, ctypes.c_int,
        ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64),
        ctypes.POINTER(ctypes.c_int64), ctypes.c_char_p, ctypes.c_uint64]
    lib.collectived_cuda_release_ready.restype = None
    lib.collectived_cuda_release_ready.argtypes = [ctypes.c_int, ctypes.c_int64]
    u64 = ctypes.c_uint64
    lib.collectived_cuda_is_vmm.restype = ctypes.c_int
    lib.collectived_cuda_is_vmm.argtypes = [u64, ctypes.c_int, ctypes.c_char_p, u64]
    lib.collectived_cuda_vmm_chunks.restype = ctypes.c_int
    lib.collectived_cuda_vmm_chunks.argtypes = [
        u64, u64, ctypes.c_int, ctypes.POINTER(u64), ctypes.POINTER(u64), ctypes.POINTER(u64),
        u64, ctypes.c_char_p, u64]
    lib.collectived_cuda_vmm_export.restype = ctypes.c_int
    lib.collectived_cuda_vmm_export.argtypes = [u64, u64, u64, ctypes.c_int, ctypes.c_char_p,
                                                u64]
    lib.collectived_cuda_vmm_mapped.restype = ctypes.c_int
    lib.collectived_cuda_vmm_mapped.argtypes = [u64, u64, ctypes.c_int]
    lib.collectived_cuda_vmm_release.restype = None
    lib.collectived_cuda_vmm_release.argtypes = [u64, ctypes.c_int]
    lib.collectived_cuda_record_event.restype = ctypes.c_int
    lib.collectived_cuda_record_event.argtypes = [ctypes.c_int, u64, ctypes.c_char_p,
                                                  ctypes.POINTER(ctypes.c_int64),
                                                  ctypes.c_char_p, u64]
    lib.collectived_cuda_register_signal_words.restype = ctypes.c_int
    lib.collectived_cuda_register_signal_words.argtypes = [u64, u64, ctypes.c_int,
                                                           ctypes.c_char_p, u64]
    lib.collectived_cuda_wait_signal.restype = ctypes.c_int
    lib.collectived_cuda_wait_signal.argtypes = [ctypes.c_int, u64, u64, ctypes.c_uint32,
                                                 ctypes.c_char_p, u64]
    lib.collectived_cuda_wait_sidecar_event.restype = ctypes.c_int
    lib.collectived_cuda_wait_sidecar_event.argtypes = [
        ctypes.c_int, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_char_p,
        ctypes.c_uint64]


def _library(keep_gil=False):
    """The CUDA half of the native library, opened on first use. Raises ValueError when this
    client was built without CUDA or the machine has no CUDA runtime. With ``keep_gil``, the
    view whose calls keep the GIL (see native): for the calls of every op, which never wait
    (a driver query, an event recorded, a wait enqueued on a stream, a lease given back)."""
    try:
        lib = native.load(native.CUDA, _declare, keep_gil)
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


# The most physical allocations one tensor may span (the sidecar's bound as well).
MAX_VMM_CHUNKS = 64


class VmmRegistrations:
    """A session's CUDA VMM allocations registered with its sidecar, by (device, mapped base):
    each is exported (one file descriptor, handed to ``send(fd, nbytes, device)``, which returns
    the registration id) once per session. The reference the export took on an allocation is
    kept while it is registered, so its handle names it alone; new memory at an address makes
    the entries it overlaps go (their references given back, their ids handed to ``forget``,
    best effort, so that the sidecar lets the old memory go), and so do, checked every few new
    registrations, the entries the process no longer maps (torch's empty_cache). Thread-safe."""

    _SWEEP_EVERY = 8  # as CudaVmmRegistrar: a full check once per entries/8 new registrations

    def __init__(self, send, forget=None):
        self._send = send
        self._forget = forget
        self._misses = 0
        self._lock = threading.Lock()
        self._entries = {}  # (device, base) -> (size, handle, registration id)
        self.exports = 0

    def register(self, lib, chunks, device):
        """The registration ids of ``chunks`` ((base, size, handle) with the handle retained,
        taken here), registering those not registered yet. Raises ValueError (the export's
        refusal) or the sidecar's error."""
        ids = []
        failure = None
        with self._lock:
            for base, size, handle in chunks:
                if failure is not None:
                    lib.collectived_cuda_vmm_release(handle, device)
                    continue
                known = self._entries.get((device, base))
                if known is not None and known[0] == size and known[1] == handle:
                    ids.append(known[2])
                    lib.collectived_cuda_vmm_release(handle, device)  # the entry holds one
                    continue
                self._drop_stale(lib, device, base, size)
                error = ctypes.create_string_buffer(512)
                fd = lib.collectived_cuda_vmm_export(base, size, handle, device, error, len(error))
                if fd < 0:
                    lib.collectived_cuda_vmm_release(handle, device)
                    failure = ValueError(error.value.decode(errors="replace") or
                                         "exporting a CUDA VMM allocation failed")
                    continue
                self.exports += 1
                try:
                    registration = self._send(fd, size, device)
                except Exception as error:  # the sidecar's refusal, raised after the loop
                    lib.collectived_cuda_vmm_release(handle, device)
                    failure = error
                    continue
                finally:
                    os.close(fd)
                self._entries[(device, base)] = (size, handle, registration)
                ids.append(registration)
        if failure is not None:
            raise failure
        return ids

    def _drop_stale(self, lib, device, base, size):
        self._misses += 1
        sweep = self._misses * self._SWEEP_EVERY >= len(self._entries)
        if sweep:
            self._misses = 0
        for key, (old_size, old_handle, old_id) in list(self._entries.items()):
            overlaps = key[0] == device and key[1] < base + size and key[1] + old_size > base
            if overlaps or (sweep and
                            lib.collectived_cuda_vmm_mapped(key[1], old_handle, key[0]) == 0):
                lib.collectived_cuda_vmm_release(old_handle, key[0])
                del self._entries[key]
                if self._forget is not None:
                    try:
                        self._forget(old_id)
                    except Exception:  # noqa: BLE001 - best effort: the session end frees it
                        pass

    def __len__(self):
        with self._lock:
            return len(self._entries)

    def close(self):
        """Gives back every reference (the session ended)."""
        with self._lock:
            entries, self._entries = self._entries, {}
        if entries:
            lib = _library()
            for (device, _), (_, handle, _) in entries.items():
                lib.collectived_cuda_vmm_release(handle, device)


def _export_vmm(lib, ptr, nbytes, device, stream, vmm, leases=None):
    """A Tensor's data field (wire.cuda_vmm) for VMM memory, its allocations registered through
    ``vmm`` (its ready event leased into ``leases``, as export's)."""
    error = ctypes.create_string_buffer(512)
    bases = (ctypes.c_uint64 * MAX_VMM_CHUNKS)()
    sizes = (ctypes.c_uint64 * MAX_VMM_CHUNKS)()
    handles = (ctypes.c_uint64 * MAX_VMM_CHUNKS)()
    count = lib.collectived_cuda_vmm_chunks(ptr, nbytes, device, bases, sizes, handles,
                                            MAX_VMM_CHUNKS, error, len(error))
    if count < 0:
        raise ValueError(error.value.decode(errors="replace") or "finding VMM allocations failed")
    chunks = [(bases[i], sizes[i], handles[i]) for i in range(count)]
    ids = vmm.register(lib, chunks, device)
    event = ctypes.create_string_buffer(64)
    slot = ctypes.c_int64(_lease_of(leases, device))
    if lib.collectived_cuda_record_event(device, stream, event,
                                         ctypes.byref(slot) if leases is not None else None,
                                         error, len(error)) != 0:
        raise ValueError(error.value.decode(errors="replace") or "recording a CUDA event failed")
    _note_lease(leases, device, slot.value)
    return wire.cuda_vmm(common_pb2.CudaVmmRef(registration_ids=ids, offset=ptr - chunks[0][0],
                                               length=nbytes, device=device,
                                               event_handle=event.raw))


class _Scratch(threading.local):
    """The buffers an export or a wait fills, one set per thread: made once, not per op."""

    def __init__(self):
        self.error = ctypes.create_string_buffer(512)
        self.memory = ctypes.create_string_buffer(64)
        self.event = ctypes.create_string_buffer(64)
        self.offset = ctypes.c_uint64(0)
        self.lease = ctypes.c_int64(-1)

    def reason(self, default):
        return self.error.value.decode(errors="replace") or default


_scratch = _Scratch()


def _lease_of(leases, device):
    """The slot of ``device`` in ``leases`` ((device, slot) pairs), or -1."""
    for leased_device, slot in leases or ():
        if leased_device == device:
            return slot
    return -1


def _note_lease(leases, device, slot):
    """After a leased call (which leaves the op's own slot of ``device`` as it was, or returns the
    slot it took, -1 for none): keeps a slot it took."""
    if leases is not None and slot >= 0 and _lease_of(leases, device) < 0:
        leases.append((device, slot))


def export(ptr, nbytes, device, stream, vmm=None, leases=None):
    """The Tensor data field (collectived.wire) of ``nbytes`` bytes at device pointer ``ptr`` of
    CUDA device ``device``, ordered after the work queued on ``stream`` (a cudaStream_t as an
    integer): a CudaIpcRef; for VMM memory a CudaVmmRef, its allocations registered through
    ``vmm`` (a VmmRegistrations; without one VMM memory is refused). Raises ValueError with
    the reason when the memory cannot be shared. One call into the library per op for IPC
    memory (one driver query; the allocation's IPC handle is cached there). With ``leases`` (a
    list of the op's ``(device, slot)`` pairs), the ready event is leased (see the C++ client's
    ReadyEventLease): the op's lease of ``device`` if it has one (one per device and op: its
    tensors share the device's current stream), else a new one, appended, to give back with
    release_ready once the sidecar waited on it or never will."""
    lib = _library(keep_gil=True)
    scratch = _scratch
    scratch.error[0] = b"\0"
    scratch.lease.value = _lease_of(leases, device)
    result = lib.collectived_cuda_export(ptr, nbytes, device, stream, 0 if vmm is None else 1,
                                         scratch.memory, scratch.event,
                                         ctypes.byref(scratch.offset),
                                         ctypes.byref(scratch.lease) if leases is not None
                                         else None, scratch.error, len(scratch.error))
    if result == 1:
        return _export_vmm(_library(), ptr, nbytes, device, stream, vmm, leases)
    if result != 0:
        raise ValueError(scratch.reason("CUDA export failed"))
    _note_lease(leases, device, scratch.lease.value)
    return wire.cuda_ipc(scratch.memory.raw, scratch.offset.value, nbytes, device,
                         scratch.event.raw)


_current_raw_stream = None  # torch's accessor of a device's current stream, found on first use


def current_stream(device):
    """The current stream of ``device`` as an integer; torch's raw accessor where it has one
    (no Stream object per op)."""
    global _current_raw_stream
    if _current_raw_stream is None:
        import torch
        _current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
            lambda ordinal: torch.cuda.current_stream(ordinal).cuda_stream)
    return _current_raw_stream(device)


def export_tensor(tensor, vmm=None, leases=None):
    """export's Tensor data field (a CudaIpcRef, or for VMM memory registered through ``vmm`` a
    CudaVmmRef) for a contiguous torch CUDA tensor, ordered after its device's current stream;
    ``leases`` as export's."""
    import torch
    device = tensor.device.index if tensor.device.index is not None else \
        torch.cuda.current_device()
    return export(tensor.data_ptr(), tensor.numel() * tensor.element_size(), device,
                  current_stream(device), vmm, leases)


def release_ready(leases):
    """Gives back the ready events of ``leases`` ((device, slot) pairs that export appended)."""
    if leases:
        lib = _library(keep_gil=True)
        for device, slot in leases:
            lib.collectived_cuda_release_ready(device, slot)


def wait_sidecar_event(device, stream, event_handle):
    """Makes ``stream`` (a cudaStream_t as an integer) of CUDA device ``device`` wait, with no
    CPU wait, for the work the sidecar enqueued before recording ``event_handle`` (an op's
    CollectiveResponse.completion_event). Raises ValueError with the reason when it cannot."""
    lib = _library()
    error = ctypes.create_string_buffer(512)
    if lib.collectived_cuda_wait_sidecar_event(device, stream, event_handle, len(event_handle),
                                               error, len(error)) != 0:
        raise ValueError(error.value.decode(errors="replace") or "waiting on a CUDA event failed")


class SignalWaitUnavailable(ValueError):
    """The driver cannot make a stream wait on a word: wait on the CPU instead."""


def register_signal_words(address, nbytes, device):
    """Registers the stream-signal words at ``address`` (``nbytes`` of page-aligned host memory
    shared with the sidecar) with CUDA, with ``device`` current. Raises ValueError with the
    reason when it cannot."""
    lib = _library()
    error = ctypes.create_string_buffer(512)
    if lib.collectived_cuda_register_signal_words(address, nbytes, device, error,
                                                  len(error)) != 0:
        raise ValueError(error.value.decode(errors="replace") or "cudaHostRegister failed")


def wait_signal(device, stream, address, value):
    """Makes ``stream`` (a cudaStream_t as an integer) of CUDA device ``device`` wait, with no
    CPU wait, until the word at ``address`` (in registered signal words) reaches ``value``.
    Raises SignalWaitUnavailable when the driver cannot, ValueError for other failures."""
    lib = _library(keep_gil=True)
    error = _scratch.error
    error[0] = b"\0"
    result = lib.collectived_cuda_wait_signal(device, stream, address, value, error, len(error))
    if result == 1:
        raise SignalWaitUnavailable(_scratch.reason("the driver cannot wait on a word"))
    if result != 0:
        raise ValueError(_scratch.reason("waiting on a word failed"))
