"""collectived.cuda.VmmRegistrations (the Python twin of the C++ CudaVmmRegistrar) with a
made-up native library, so no GPU is needed: each VMM allocation is exported and sent once per
session, memory mapped again at the same addresses or no longer mapped is given back, every
descriptor is closed after sending, and no reference on an allocation leaks on a refusal."""

import os

import pytest

from collectived import cuda
from collectived.errors import InvalidArgumentError


class FakeLib:
    def __init__(self):
        self.retained = []   # handles with a reference held (as collectived_cuda_vmm_chunks takes)
        self.unmapped = set()
        self.fds = []

    def found(self, *chunks):
        self.retained.extend(handle for _, _, handle in chunks)
        return list(chunks)

    def collectived_cuda_vmm_export(self, base, size, handle, device, error, capacity):
        fd = os.open("/dev/null", os.O_RDONLY)
        self.fds.append(fd)
        return fd

    def collectived_cuda_vmm_release(self, handle, device):
        self.retained.remove(handle)

    def collectived_cuda_vmm_mapped(self, base, handle, device):
        return 0 if handle in self.unmapped else 1


def closed(fd):
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def test_each_allocation_is_sent_once_and_given_back_when_replaced_or_unmapped():
    lib = FakeLib()
    sent, forgotten = [], []
    registrations = cuda.VmmRegistrations(lambda fd, n, d: sent.append((n, d)) or len(sent),
                                          forgotten.append)
    seg = 20 << 20
    assert registrations.register(lib, lib.found((0x1000_0000, seg, 7), (0x1000_0000 + seg, seg, 8)),
                                  0) == [1, 2]
    for _ in range(3):
        assert registrations.register(lib, lib.found((0x1000_0000 + seg, seg, 8)), 0) == [2]
    assert sent == [(seg, 0), (seg, 0)]
    assert all(closed(fd) for fd in lib.fds)
    assert sorted(lib.retained) == [7, 8]
    # New memory at the first segment's addresses: a new allocation, the old one given back.
    assert registrations.register(lib, lib.found((0x1000_0000, seg, 9)), 0) == [3]
    assert forgotten == [1] and sorted(lib.retained) == [8, 9]
    # An allocation the process no longer maps goes at a later registration.
    lib.unmapped.add(8)
    assert registrations.register(lib, lib.found((0x9000_0000, seg, 10)), 0) == [4]
    assert forgotten == [1, 2] and sorted(lib.retained) == [9, 10]
    assert len(registrations) == 2


def test_a_refusal_is_raised_and_no_reference_or_descriptor_leaks():
    lib = FakeLib()

    def refuse(fd, nbytes, device):
        raise InvalidArgumentError("CUDA tensors need a GPU")

    registrations = cuda.VmmRegistrations(refuse)
    with pytest.raises(InvalidArgumentError, match="need a GPU"):
        registrations.register(lib, lib.found((0x1000, 0x2000, 7), (0x3000, 0x2000, 8)), 0)
    assert lib.retained == [] and len(registrations) == 0
    assert all(closed(fd) for fd in lib.fds)
