"""Memory a client hands to the sidecar: the raw view of a tensor, and regions registered as
file descriptors (a sealed memfd Buffer, or memory the caller registered with
``Client.register_fd``)."""

import fcntl
import mmap
import os

import numpy as np

from collectived import dtypes
from collectived.errors import UnavailableError


class _Raw:
    """The memory behind a numpy array or torch tensor: address, bytes, dtype, count."""

    __slots__ = ("obj", "ptr", "nbytes", "dtype", "count", "shape", "cuda", "lease")

    def __init__(self, x):
        if isinstance(x, np.ndarray):
            if not x.flags["C_CONTIGUOUS"]:
                raise ValueError("collectived needs C-contiguous arrays")
            if x.dtype not in dtypes.NUMPY_TO_PROTO:
                raise ValueError(f"collectived does not support dtype {x.dtype}")
            self.dtype = dtypes.NUMPY_TO_PROTO[x.dtype]
            self.ptr, self.count, self.shape = x.ctypes.data, x.size, x.shape
        else:  # a torch tensor
            if x.device.type not in ("cpu", "cuda"):
                raise ValueError(f"collectived takes CPU and CUDA tensors, got one on {x.device}")
            if not x.is_contiguous():
                raise ValueError("collectived needs contiguous tensors")
            self.dtype = dtypes.torch_to_proto(x.dtype)
            self.ptr, self.count, self.shape = x.data_ptr(), x.numel(), tuple(x.shape)
        self.cuda = not isinstance(x, np.ndarray) and x.device.type == "cuda"
        self.obj = x
        self.lease = None  # a CUDA tensor's leased ready events ((device, slot) pairs), if any
        self.nbytes = self.count * dtypes.PROTO_SIZES[self.dtype]


class InRegion:
    """A tensor that the caller knows lives in ``region`` (registered memory it verified for this
    op): passed zero-copy without searching the client's buffers by address."""

    __slots__ = ("tensor", "region")

    def __init__(self, tensor, region):
        self.tensor = tensor
        self.region = region


class Region:
    """Memory registered with the sidecar as a file descriptor: its buffer id, and where this
    process maps it (None: not addressable, only raw requests can name it)."""

    def __init__(self, client, buffer_id, address, size, sealed):
        self._client = client
        self.id = buffer_id
        self.address = address
        self.size = size
        self.sealed = sealed

    def contains(self, ptr, nbytes):
        return self.address is not None and self.address <= ptr and \
            ptr + nbytes <= self.address + self.size

    def close(self):
        """Unregisters it (ops already running keep the sidecar's mapping until they end)."""
        if self in self._client._buffers:
            self._client._buffers.remove(self)
        self._client._unregister(self.id)


class Buffer(Region):
    """Anonymous shared memory (a memfd sealed against shrinking) registered with the sidecar.

    Its file descriptor was passed over the fd channel and closed here: the memory has no name,
    so nothing is left behind whatever happens to the process.
    """

    def __init__(self, client, nbytes):
        if nbytes <= 0:
            raise ValueError(f"buffer size must be positive, got {nbytes}")
        machine = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        if nbytes > machine:  # a memfd has no size limit: reserving it would exhaust memory
            raise UnavailableError(f"cannot create a shared-memory buffer of {nbytes} bytes: "
                                   f"this machine has {machine} bytes of memory")
        fd = os.memfd_create("collectived-buffer", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, nbytes)
            try:
                os.posix_fallocate(fd, 0, nbytes)  # a memory limit fails here, not as SIGBUS
            except OSError as error:
                if error.errno not in (95, 22):  # EOPNOTSUPP, EINVAL: nothing to reserve
                    raise
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            self._mmap = mmap.mmap(fd, nbytes)
            buffer_id, _, sealed = client._register_fd(fd, nbytes)
        except OSError as error:
            raise UnavailableError(f"cannot create a shared-memory buffer of {nbytes} bytes: "
                                   f"{error}") from None
        finally:
            os.close(fd)
        probe = np.frombuffer(self._mmap, dtype=np.uint8)
        super().__init__(client, buffer_id, probe.ctypes.data, nbytes, sealed)
        del probe

    def array(self, shape, dtype=np.float32, offset=0):
        """A numpy array living in this buffer at byte ``offset``."""
        dtype = np.dtype(dtype)
        count = int(np.prod(shape))
        return np.ndarray(shape, dtype=dtype, buffer=self._mmap, offset=offset)[...] if count else \
            np.empty(shape, dtype=dtype)

    def tensor(self, shape, dtype=None, offset=0):
        """A torch tensor living in this buffer at byte ``offset``."""
        import torch
        dtype = dtype or torch.float32
        count = int(np.prod(shape)) if len(shape) else 1
        return torch.frombuffer(self._mmap, dtype=dtype, count=count, offset=offset).view(shape)

    def close(self):
        try:
            super().close()
        finally:
            try:
                self._mmap.close()
            except BufferError:
                pass  # views are still alive; the mapping goes with them
