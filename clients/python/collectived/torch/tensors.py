"""One op's tensors as the native session takes them, and what is left to do once it completed.

A CPU tensor goes, by the first rule that fits:
- inline, inside the op's request and response, when it is contiguous and at most
  INLINE_BYTES (one copy each way inside the message: cheaper than any bookkeeping);
- zero-copy in its own storage, moved into shared memory in place on first use and registered
  once (collectived.torch.adoption), when it is contiguous and at least the adoption bound;
- through a stand-in of the session's staging pool (collectived.torch.staging), copied in
  before the op and back once it completed.
A CUDA tensor goes as it is (the sidecar opens its memory through CUDA IPC), or through a
contiguous copy, copied back on the op's stream once it completed. Every tensor of an op lives
on one device.
"""

import torch

# Contiguous CPU tensors up to this size travel inline in the op's request and response.
INLINE_BYTES = 16 << 10


def inline_bytes(session):
    """The largest CPU tensor that travels inline: INLINE_BYTES, or less where adoption is set to
    take smaller tensors (COLLECTIVED_TORCH_ADOPT_MIN_BYTES): adoption then comes first."""
    adopter = session.adopter
    if adopter.max_bytes <= 0:
        return INLINE_BYTES
    return min(INLINE_BYTES, adopter.min_bytes - 1)


def is_inline(tensor, limit):
    """Whether ``tensor`` is a small dense contiguous CPU tensor (at most ``limit`` bytes)."""
    return (tensor.layout == torch.strided and tensor.is_cpu and  # no torch.device made
            tensor.numel() * tensor.element_size() <= limit and tensor.is_contiguous())


def dense_device(tensors, inline_limit):
    """The CUDA ordinal (-1 for CPU) shared by ``tensors`` where each is dense and contiguous
    and, on CPU, at most ``inline_limit`` bytes (it travels inline), else None: such an op needs
    no staging and no copies, the common case of every op. Each attribute costs a pybind11 call:
    the cheapest that can decide come first."""
    device = None
    for tensor in tensors:
        ordinal = tensor.get_device()  # -1 on CPU, without making a torch.device
        if ordinal < 0 and (not tensor.is_cpu or
                            tensor.numel() * tensor.element_size() > inline_limit):
            return None  # staged, adopted, or a device the general path refuses by name
        if device is None:
            device = ordinal
        elif ordinal != device:
            return None
        if tensor.layout != torch.strided or not tensor.is_contiguous():
            return None
    return device


class OpTensors:
    """The tensors of one op: ``input``, ``output`` and ``inout`` give each user tensor's
    stand-in for the op (the tensor itself where it can go as it is), ``buffers`` the shared
    memory they lie in, and ``finish(ok)`` copies results back and gives the stand-ins back."""

    def __init__(self, session, inline_limit):
        self._session = session
        self._inline = inline_limit  # inline_bytes(session), which the process group keeps
        self.buffers = []
        self.device = None  # torch.device of the op's tensors; None until one is seen
        self._copies = []  # (user tensor, stand-in, staging handle or None, copy back)
        self._stream = None  # CUDA copies: the current stream when the op was issued

    @property
    def ordinal(self):
        """The CUDA device of the op's tensors, -1 for CPU (or an op with none)."""
        device = self.device
        return device.index if device is not None and device.type == "cuda" else -1

    @property
    def pending(self):
        """Whether finish() has anything to do: results to copy back, stand-ins to give back."""
        return bool(self._copies)

    def _note_device(self, tensor):
        device = tensor.device
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"collectived: expected a CPU or CUDA tensor, got one on {device}")
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if self.device is None:
            self.device = device
        elif self.device != device:
            raise ValueError(f"collectived: one op's tensors must live on one device; got "
                             f"tensors on {self.device} and on {device}")

    def _stage(self, tensor, copy_in, copy_back):
        if tensor.layout != torch.strided:
            raise ValueError(f"collectived: dense tensors only here, not {tensor.layout}")
        self._note_device(tensor)
        if tensor.is_cuda or tensor.numel() == 0 or \
                tensor.numel() * tensor.element_size() <= self._inline:
            # In place on the device, or inline; a non-contiguous one through a dense copy.
            if tensor.is_contiguous():
                return tensor
            if tensor.is_cuda and self._stream is None:
                self._stream = torch.cuda.current_stream(tensor.device)
            dense = tensor.contiguous() if copy_in else torch.empty_like(
                tensor, memory_format=torch.contiguous_format)
            self._copies.append((tensor, dense, None, copy_back))
            return dense
        region = self._session.adopter.region_for(tensor)
        if region is not None:  # its own storage, now shared: nothing to copy
            self.buffers.append(region)
            return tensor
        stand_in, handle = self._session.staging.tensor(tensor)
        if copy_in:
            stand_in.copy_(tensor)
        self.buffers.append(handle[0].buffer)
        self._copies.append((tensor, stand_in, handle, copy_back))
        return stand_in

    def input(self, tensor):
        return self._stage(tensor, True, False)

    def output(self, tensor):
        return self._stage(tensor, False, True)

    def inout(self, tensor):
        return self._stage(tensor, True, True)

    def finish(self, ok):
        """Copies the results back (when ``ok``) and gives the stand-ins back; once."""
        copies, self._copies = self._copies, []
        on_device = []
        try:
            for user, stand_in, handle, copy_back in copies:
                if ok and copy_back:
                    if stand_in.is_cuda:
                        on_device.append((user, stand_in))
                    else:
                        user.copy_(stand_in)
        finally:
            for _, _, handle, _ in copies:
                if handle is not None:
                    self._session.staging.release(handle)
        if on_device:
            self._copy_back_on_device(on_device)

    def _copy_back_on_device(self, copies):
        """Copies CUDA results from their stand-ins on the stream the op was issued from (where
        the stand-ins were made), not on this (completion) thread's default stream, which a side
        stream of the trainer's does not wait for; with the device made current for it alone (a
        thread with none would make GPU 0's context). The op completes once they are in place,
        for wait() and the future's callbacks on any stream."""
        done = torch.cuda.Event()
        with torch.cuda.device(self._stream.device), torch.cuda.stream(self._stream):
            for user, stand_in in copies:
                user.copy_(stand_in)
            done.record(self._stream)
        done.synchronize()
