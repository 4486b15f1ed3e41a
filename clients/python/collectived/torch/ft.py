"""Step-consistent training on a shrinking group, and replacements that grow it back.

``collectived.torch.ft.DistributedDataParallel(model, optimizer)`` in place of torch's wrapper
(docs/fault-tolerance.md). It averages the gradients over the live ranks when the optimizer
steps (it wraps ``optimizer.step`` in place), and ends each step with one small allreduce, the
commit, which tells every rank two things alike:

- whether every op of the step ran in one membership epoch (the commit op's epoch began at or
  before the step's first op). If not, the step is skipped on every survivor: the optimizer does
  not step, so every committed step is one the same members computed;
- which lost ranks have a replacement waiting (each rank's sidecar says which it saw). The live
  ranks admit them when the next step's optimizer step begins, and the lowest live rank (the
  donor) hands them the model's and the optimizer's state and the step through the sidecars:
  the replacement's parameters are bit-identical to the survivors', and its first step is that
  next step (the survivors' forward and backward of it are theirs; its gradient is its own).

A replacement is the same script started again with the lost rank's ``RANK`` (a restarted pod,
a relaunched worker): its ``init_process_group`` joins the running group, its wrapper receives
the state, and ``start_step`` is the step the survivors are at::

    ddp = ft.DistributedDataParallel(model, optimizer)
    for step in range(ddp.start_step, steps):
        optimizer.zero_grad()
        loss_fn(ddp(inputs(step)), targets(step)).backward()
        optimizer.step()          # averaged, committed or skipped on every rank alike

The group must shrink (``COLLECTIVED_FAULT_TOLERANCE=shrink``). Torch's own DDP constructor runs
collectives that the survivors would not run again for a replacement: this wrapper does not use
it. Gradients are averaged after the backward pass, in buckets, not overlapped with it.
"""

import io
import logging
import time

import torch
import torch.distributed as dist

from collectived.torch.backend import ProcessGroupCollectived

_log = logging.getLogger("collectived.torch.ft")

_BUCKET_BYTES = 25 << 20  # as torch DDP's bucket_cap_mb default


def _root_options(root):
    options = dist.BroadcastOptions()
    options.rootRank = root
    options.rootTensor = 0
    return options


class DistributedDataParallel(torch.nn.Module):
    """Wraps ``module`` for step-consistent data-parallel training over a shrinking collectived
    group (the default group unless ``process_group`` names one), and ``optimizer.step`` in
    place. Attributes: ``start_step`` (0, or a replacement's first step), ``step`` (steps taken
    so far, committed or not), ``committed_steps`` and ``skipped_steps``, and ``last_step``
    (what the last step did: a dict with ``committed``, ``epoch``, ``admitted``); on a
    replacement, ``state_bytes`` and ``transfer_seconds`` of the state it received."""

    def __init__(self, module, optimizer, process_group=None, bucket_bytes=_BUCKET_BYTES):
        super().__init__()
        group = process_group or dist.distributed_c10d._get_default_group()
        if not isinstance(group, ProcessGroupCollectived):
            raise ValueError("collectived.torch.ft.DistributedDataParallel needs a process group "
                             "of the collectived backend, not " + type(group).__name__)
        if group._fault_tolerance != "shrink":
            raise ValueError("collectived.torch.ft.DistributedDataParallel needs a group that "
                             "shrinks: set COLLECTIVED_FAULT_TOLERANCE=shrink on every rank")
        self.module = module
        self._optimizer = optimizer
        self._pg = group
        self._session = group._session
        self._group = group._group
        self._rank = group.rank()
        self._size = group.size()
        self._bucket_bytes = int(bucket_bytes)
        self._params = [p for p in module.parameters() if p.requires_grad]
        self.step = 0  # a replacement's comes with its state
        self.committed_steps = 0
        self.skipped_steps = 0
        self.last_step = None
        self.state_bytes = 0
        self._pending_joiners = []
        self.transfer_seconds = 0.0
        self._session.replacements(self._group, "accept")
        if group.replacement:
            self.start_step = self._receive_state()
        else:
            # As torch's DDP: every rank starts from rank 0's parameters and buffers.
            works = [self._pg.broadcast([t], _root_options(0)) for t in self._state_tensors()]
            for work in works:
                work.wait()
            self._boundary = self._small_allreduce(torch.zeros(1, dtype=torch.int64))
            self.start_step = 0
        self.step = self.start_step
        self._inner_step = optimizer.step
        optimizer.step = self._step

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    # ---- one step --------------------------------------------------------------------------

    def _step(self, *args, **kwargs):
        admitted = self._pending_joiners
        if admitted:
            self._admit(admitted)
        self._average_gradients()
        waiting = self._session.replacements(self._group, "list")
        flags = torch.zeros(self._size, dtype=torch.int64)
        for rank in waiting:
            if 0 <= rank < self._size:
                flags[rank] = 1
        commit = self._session.allreduce(self._group, flags, op="MAX")
        commit.wait()
        epoch, epoch_first = commit.epoch()
        sequence = commit.sequence_number()
        commit = None
        committed = epoch_first <= self._boundary + 1
        result = None
        if committed:
            result = self._inner_step(*args, **kwargs)
            self.committed_steps += 1
        else:
            self.skipped_steps += 1
            _log.warning("step %d ran in more than one membership: skipped on every rank "
                         "(epoch %d began at op %d, the step at op %d)", self.step, epoch,
                         epoch_first, self._boundary + 1)
        self.step += 1
        self._boundary = sequence
        # Admitted when the next step's optimizer step begins, not now: the program may run ops
        # of its own after this step (a loss's allreduce, a checkpoint's barrier) that the
        # replacement, which starts at the top of the next step, must not be asked to run.
        self._pending_joiners = [rank for rank in range(self._size) if flags[rank] > 0]
        self.last_step = {"committed": committed, "epoch": epoch, "admitted": admitted}
        return result

    def _admit(self, joiners):
        """At the start of a step's optimizer step, on every live rank alike: one small op whose
        sequence number is the same everywhere, the admission after it, then the state's
        transfer in the new epoch."""
        self._pending_joiners = []
        sequence = self._small_allreduce(torch.zeros(1, dtype=torch.int64))
        try:
            self._session.replacements(self._group, "admit", after_sequence=sequence,
                                       joiners=joiners)
        except Exception as error:  # the ops below run on every live rank either way
            _log.warning("admitting replacements %s failed: %s", joiners, error)
        self._send_state()

    def _average_gradients(self):
        for p in self._params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        buckets, bucket, size = [], [], 0
        for p in self._params:
            bucket.append(p)
            size += p.numel() * p.element_size()
            if size >= self._bucket_bytes:
                buckets.append(bucket)
                bucket, size = [], 0
        if bucket:
            buckets.append(bucket)
        flats = [torch.cat([p.grad.reshape(-1) for p in b]) for b in buckets]
        # SUM over the live ranks, rescaled by size / live (docs/fault-tolerance.md): divided by
        # the size, as torch's DDP does, it is the mean over the live ranks.
        works = [self._pg.allreduce([flat]) for flat in flats]
        for bucket, flat, work in zip(buckets, flats, works):
            work.wait()
            flat.div_(self._size)
            offset = 0
            for p in bucket:
                n = p.numel()
                p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
                offset += n

    # ---- state for a replacement -----------------------------------------------------------

    def _state_tensors(self):
        state = list(self.module.parameters()) + list(self.module.buffers())
        return [t.data for t in state if t.numel() > 0]

    def _serialized_state(self):
        buffer = io.BytesIO()
        torch.save({"model": self.module.state_dict(), "optimizer": self._optimizer.state_dict(),
                    "step": self.step}, buffer)
        return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)

    def _transfer(self, survivor):
        """The ops of a state transfer, on every rank of the new epoch alike: the donor (the
        lowest live rank that is no replacement), the size of its state, the state. Returns the
        state's bytes (None on the survivors but the donor's own)."""
        candidate = torch.tensor([self._size - (self._rank if survivor else self._size)],
                                 dtype=torch.int64)
        self._small_allreduce(candidate)
        donor = self._size - int(candidate[0])
        if donor >= self._size:
            raise RuntimeError(f"group '{self._group.decode()}': no live rank to take the state "
                               f"from")
        state = self._serialized_state() if self._rank == donor else None
        header = torch.tensor([state.numel() if state is not None else 0, self.step],
                              dtype=torch.int64)
        header_sequence = self._small_allreduce(header)
        nbytes, step = int(header[0]), int(header[1])
        data = state if state is not None else torch.empty(nbytes, dtype=torch.uint8)
        self._pg.broadcast([data], _root_options(donor)).wait()
        self._boundary = header_sequence + 1
        return data, step, donor

    def _small_allreduce(self, tensor):
        """A MAX allreduce of a few int64s, in place; returns its sequence number."""
        work = self._session.allreduce(self._group, tensor, op="MAX")
        work.wait()
        return work.sequence_number()

    def _send_state(self):
        try:
            self._transfer(survivor=True)
        except Exception as error:  # a donor lost meanwhile: the replacement fails, not us
            _log.warning("handing the state to a replacement failed: %s", error)

    def _receive_state(self):
        self._boundary = 0
        started = time.monotonic()
        try:
            data, step, donor = self._transfer(survivor=False)
            self.transfer_seconds = time.monotonic() - started
            self.state_bytes = data.numel()
        except Exception as error:
            raise RuntimeError(f"group '{self._group.decode()}': the replacement for rank "
                               f"{self._rank} could not receive its state (was the donor lost "
                               f"during the transfer? start the replacement again): "
                               f"{error}") from error
        state = torch.load(io.BytesIO(data.numpy().tobytes()))
        try:
            self.module.load_state_dict(state["model"])
        except RuntimeError as error:
            raise RuntimeError(f"group '{self._group.decode()}': the replacement for rank "
                               f"{self._rank} does not run the survivors' model: {error}") \
                from error
        self._optimizer.load_state_dict(state["optimizer"])
        _log.info("replacement for rank %d joined at step %d with rank %d's state (%d bytes)",
                  self._rank, step, donor, data.numel())
        return step
