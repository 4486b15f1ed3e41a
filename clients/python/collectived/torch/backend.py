"""The torch.distributed backend "collectived": a ProcessGroup whose ops run in the local
collectived sidecar, every one through one native session of this process (the C++ client,
collectived.native_session): one call into it per op, completions taken without Python.

Where an op's tensors go (inline, zero-copy in their own storage moved into shared memory, a
staging pool, CUDA memory in place) is collectived.torch.tensors'. CUDA tensors go to a second
sidecar group of the same ranks, a CUDA (NCCL) group that joins on the group's first CUDA op,
as NCCL's communicators do: the sidecar opens their memory through CUDA IPC and orders its work
after the tensors' current stream. The Work, its ``wait()`` (on CUDA: the current stream waits,
as ProcessGroupNCCL's) and its future are collectived.torch.works'; the job's token and name,
collectived.torch.identity's.

Errors reach Python as exceptions raised from the call or from ``Work.wait()``; a failed group
(a lost peer, an abort, a timeout) raises from its next call.

torch 1.13 and 2.x: in both, the creator gets ``(store, group_rank, group_size, timeout)`` and a
plugin written in Python returns a ``ProcessGroup`` subclass. torch 2.x builds its groups from
C++ ``Backend`` objects, but that class has neither a Python constructor nor a trampoline, so a
Python ``Backend`` could not be called from C++ (DDP's reducer); torch 2.x keeps the path where
the creator's ``ProcessGroup`` becomes the group itself. What differs is detected, not assumed
from version numbers: ``register_backend(devices=...)`` (2.1+), the group name and description
torch 2.x sets on the group and later looks it up by, the C++ method names of newer torch
(``all_gather_single``, ``all_to_all_single``, ...), tensor coalescing and ``shutdown``/``abort``.
"""

import atexit
import datetime
import inspect
import itertools
import os
import threading

import torch
import torch.distributed as dist

from collectived import cuda as _cuda
from collectived import environment
from collectived import torch_names
from collectived.native_session import NativeSession
from collectived.torch.adoption import Adopter
from collectived.torch.identity import (current_fault_tolerance, current_job_name,
                                        current_job_token)
from collectived.torch.op_options import reduce_op as _reduce_op
from collectived.torch.op_options import root as _root
from collectived.torch.op_options import seconds as _seconds
from collectived.torch.sparse import sparse_allreduce
from collectived.torch.staging import StagingPool
from collectived.torch.tensors import OpTensors, dense_device, inline_bytes
from collectived.torch.works import AllOf, FutureStreams, KeepAlive, Work

BACKEND_NAME = "collectived"

_session = None
_session_lock = threading.Lock()
# This process's groups in creation order (c10d creates them in the same order on every rank).
_group_index = itertools.count()


def shared_session():
    """This process's native session with its sidecar ($COLLECTIVED_ADDRESS), shared by every
    group: with its staging pool (``.staging``) and its adopted storages (``.adopter``)."""
    global _session
    with _session_lock:
        if _session is None:
            session = NativeSession(environment.get("COLLECTIVED_ADDRESS"),
                                    name=f"torch rank pid {os.getpid()}")
            session.staging = StagingPool(session)
            session.adopter = Adopter(session)
            _session = session
        return _session


@atexit.register
def _close_shared_session():
    # Pending ops fail and the sidecar forgets the session now, not when the process is gone.
    global _session
    with _session_lock:
        session, _session = _session, None
    if session is not None:
        session.close()


def _sidecars_store_address(store):
    """The TCP address of the sidecar store beneath torch's PrefixStores, if the job's store is a
    collectived.torch.Store reached over TCP (host:port); None otherwise."""
    from collectived.torch.store import Store as SidecarStore
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    address = getattr(store, "address", None) if isinstance(store, SidecarStore) else None
    return address if address and not address.startswith("unix:") else None


class ProcessGroupCollectived(dist.ProcessGroup):
    """A process group served by the local collectived sidecar."""

    def __init__(self, store, rank, size, timeout=datetime.timedelta(minutes=30), session=None,
                 job_token=None):
        super().__init__(rank, size)
        self._session = session or shared_session()
        self._timeout = _seconds(timeout) or 1800.0
        self._sequence_number = 0
        self._failure = None
        self._failures_seen = 0  # the session's failure_count() when last read
        self._keep_alive = KeepAlive()
        self._future_streams = FutureStreams()
        self._inline_limit = inline_bytes(self._session)
        # Bootstrap from the store torch handed us (a PrefixStore unique to this group): rank 0
        # names the group and the store of the sidecars' own rendezvous: the job's, when that is
        # a sidecar's store reached over TCP (it outlives rank 0's node), else its own sidecar's.
        index = next(_group_index)
        self._fault_tolerance, self._min_ranks = current_fault_tolerance()
        # A replacement of rank 0 (a shrinking group's) finds the record its predecessor wrote:
        # it must join the same group, through the same store.
        # (torch 1.13's stores have no check(): the first rank 0 to count itself in writes it.)
        if rank == 0 and (self._fault_tolerance != "shrink" or
                          store.add(torch_names.BOOTSTRAP_KEY + "/writers", 1) == 1):
            store.set(torch_names.BOOTSTRAP_KEY, torch_names.bootstrap_record(
                torch_names.group_name(current_job_name(), index),
                _sidecars_store_address(store) or self._session.sidecar_address()))
        name, store_address = torch_names.parse_bootstrap_record(
            store.get(torch_names.BOOTSTRAP_KEY))
        self._name = name
        self._group = name.encode()
        # torch 2.x names each group ("0", "1", or a hash of its ranks), registers it under that
        # name and finds it again by it; the sidecar's name stays ours (unique per incarnation).
        self._torch_group_name = None
        self._group_desc = "undefined"
        self._destroyed = False
        self._store_address = store_address
        self._job_token = job_token if job_token is not None else current_job_token()
        self._cuda_group = None  # (sidecar group name as bytes, CUDA ordinal), on first use
        joined = self._session.create_group(name, rank, size, store_address=store_address,
                                            timeout=self._timeout, job_token=self._job_token,
                                            fault_tolerance=self._fault_tolerance,
                                            min_ranks=self._min_ranks)
        # The replacement of a lost rank of a running shrinking group (docs/fault-tolerance.md):
        # collectived.torch.ft hands it its state; torch's barrier must not wait for it.
        self.replacement = bool(joined.replacement)
        if self.replacement:
            _skip_next_init_barrier()

    def _sidecar_groups(self):
        """The sidecar groups this process group has joined (names as bytes)."""
        return [self._group] + ([self._cuda_group[0]] if self._cuda_group else [])

    def _group_for(self, ordinal):
        """The sidecar group of tensors on CUDA device ``ordinal`` (-1: CPU). The CUDA
        group joins the sidecars at the first CUDA op, which every rank issues at the same point
        (c10d's rule that ranks issue the same ops in the same order), as NCCL's process group
        creates its communicators."""
        if ordinal < 0:
            return self._group
        if self._cuda_group is None:
            name = f"{self._name}-cuda"
            self._session.create_group(name, self.rank(), self.size(),
                                       store_address=self._store_address, timeout=self._timeout,
                                       job_token=self._job_token, device=ordinal,
                                       fault_tolerance=self._fault_tolerance,
                                       min_ranks=self._min_ranks)
            self._cuda_group = (name.encode(), ordinal)
        group, joined = self._cuda_group
        if ordinal != joined:
            raise ValueError(f"collectived: this process group's CUDA tensors live on "
                             f"cuda:{joined} (where its first CUDA op ran), not on "
                             f"cuda:{ordinal}")
        return group

    # -- identity --------------------------------------------------------------------------

    def getBackendName(self):
        return BACKEND_NAME

    def _get_backend_name(self):
        return BACKEND_NAME

    def name(self):
        return BACKEND_NAME

    @property
    def sidecar_group(self):
        """The group's name in the sidecars (``collectivectl describe NAME``)."""
        return self._name

    @property
    def group_name(self):
        return self._torch_group_name or self._name

    def _set_group_name(self, name):
        self._torch_group_name = name

    # The C++ names, which newer torch lets a Python group override.
    def setGroupName(self, name):
        self._set_group_name(name)

    def getGroupName(self):
        return self.group_name

    @property
    def group_desc(self):
        return self._group_desc

    def _set_group_desc(self, desc):
        self._group_desc = desc

    def setGroupDesc(self, desc):
        self._set_group_desc(desc)

    def getGroupDesc(self):
        return self._group_desc

    @property
    def _device_types(self):
        # torch 2.x picks a group's device for object collectives and barrier from its
        # backends; this group registers none (it is its own backend).
        return [torch.device(kind) for kind in _served_device_types()]

    def _get_backend(self, device):
        """torch 2.x asks a group for its backend per device: this group serves CPU, and CUDA
        when the client can pass CUDA tensors, itself."""
        device = torch.device(device)
        if device.type not in _served_device_types():
            raise RuntimeError(f"collectived: no backend for device type {device.type} "
                               f"(this client serves {', '.join(_served_device_types())})")
        return self

    @property
    def supports_splitting(self):
        return False

    @property
    def supports_coalescing(self):
        return False

    # -- lifetime --------------------------------------------------------------------------

    def shutdown(self):
        """Leaves the group in the sidecars; the other ranks' pending ops fail naming this rank."""
        if self._destroyed:
            return
        self._destroyed = True
        for group in self._sidecar_groups():
            try:
                self._session.destroy_group(group.decode())
            except Exception:  # noqa: BLE001 - the sidecar or the session may already be gone
                pass

    def abort(self):
        self.shutdown()

    def _get_sequence_number_for_group(self):
        return self._sequence_number

    def __repr__(self):
        return (f"ProcessGroupCollectived(group={self._name}, rank={self.rank()}, "
                f"size={self.size()})")

    # -- plumbing --------------------------------------------------------------------------

    def _check_usable(self, what):
        """Raises when the group can take no more ops: it failed (its first failing op's error;
        the session counts its groups' failures, so which is asked only when that changed), or
        it was shut down."""
        failures = self._session.failure_count()
        if failures != self._failures_seen:
            for group in self._sidecar_groups():
                error = self._session.group_failure(group)
                if error is not None and self._failure is None:
                    self._failure = error
            self._failures_seen = failures
        if self._failure is not None:
            raise type(self._failure)(str(self._failure))
        if self._destroyed:
            raise RuntimeError(f"collectived: {what} on a process group that was shut "
                               f"down (group {self.group_name}, sidecar group {self._name})")

    def _work(self, nwork, result, tensors, ordinal, collective=True):
        """The torch Work of ``nwork``, kept alive (see works.KeepAlive). ``tensors``: the op's
        OpTensors, kept when they have copies to finish. Sends' and receives' futures complete
        once the op completed (completed at once, a stream would wait for a peer that may post
        its half later)."""
        if collective:
            self._sequence_number += 1
        return Work(nwork, result, tensors if tensors is not None and tensors.pending else None,
                    ordinal if ordinal >= 0 else None, self._keep_alive,
                    self._future_streams if collective else None)

    def _run(self, what, submit, result, collective=True):
        """The general path: ``submit(t)`` stages the op's tensors through ``t`` (an OpTensors)
        and submits the op with ``self._submit``."""
        self._check_usable(what)
        tensors = OpTensors(self._session, self._inline_limit)
        try:
            nwork = submit(tensors)
        except BaseException:
            tensors.finish(False)
            raise
        return self._work(nwork, result, tensors, tensors.ordinal, collective)

    def _submit(self, tensors, op, inputs=(), outputs=(), **kwargs):
        """Submits ``op`` on the sidecar group of the op's device (see _run)."""
        return self._session.submit(self._group_for(tensors.ordinal), op, inputs, outputs,
                                    buffers=tensors.buffers, **kwargs)

    def _dense(self, tensors):
        """The CUDA ordinal (-1: CPU) of an op whose tensors go as they are (dense, contiguous,
        one device; on CPU small enough to travel inline), else None: the general path."""
        return dense_device(tensors, self._inline_limit)

    def _one(self, tensors, what):
        if isinstance(tensors, torch.Tensor):  # the ProcessGroup overloads' single tensor
            return tensors
        if len(tensors) != 1:
            raise ValueError(f"collectived: {what} takes exactly one tensor per process "
                             f"(got {len(tensors)})")
        return tensors[0]

    # -- collectives -----------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        tensor = self._one(tensors, "allreduce")
        op, scale = _reduce_op(opts)
        if tensor.layout == torch.sparse_coo:
            return self._sparse_allreduce(tensor, op)
        ordinal = self._dense([tensor])
        if ordinal is not None:  # the common small op, and DDP's CUDA buckets
            self._check_usable("allreduce")
            return self._work(self._session.allreduce(self._group_for(ordinal), tensor, op=op,
                                                      scale=scale), [tensor], None, ordinal)
        return self._run("allreduce", lambda t: self._submit(
            t, "allreduce", [t.inout(tensor)], reduce_op=op, scale=scale), [tensor])

    def _sparse_allreduce(self, tensor, op):
        # Runs to completion here (three sidecar allgathers, as Gloo does it); raises on failure.
        # CPU tensors only, as Gloo's.
        self._check_usable("allreduce")

        def allgather(output, input):
            tensors = OpTensors(self._session, self._inline_limit)
            ok = False
            try:
                self._submit(tensors, "allgather_into_tensor", [tensors.input(input)],
                             [tensors.output(output)]).wait()
                ok = True
            finally:
                tensors.finish(ok)
        sparse_allreduce(allgather, self._name, tensor, op, self.size())
        return self._work(AllOf([]), [tensor], None, -1)  # nothing left to wait for

    def allreduce_coalesced(self, tensors, opts=None):
        op, scale = _reduce_op(opts)
        return self._run("allreduce_coalesced", lambda t: self._submit(
            t, "allreduce_coalesced", [t.inout(x) for x in tensors], reduce_op=op, scale=scale),
            tensors)

    def broadcast(self, tensors, opts=None):
        tensor = self._one(tensors, "broadcast")
        root = _root(opts)
        ordinal = self._dense([tensor])
        if ordinal is not None:
            self._check_usable("broadcast")
            return self._work(self._session.broadcast(self._group_for(ordinal), tensor, root),
                              [tensor], None, ordinal)
        return self._run("broadcast", lambda t: self._submit(
            t, "broadcast", [t.inout(tensor)], root=root), [tensor])

    def reduce(self, tensors, opts=None, op=None):
        tensor = self._one(tensors, "reduce")
        root = _root(opts)
        op, scale = _reduce_op(op if isinstance(opts, int) else opts)
        return self._run("reduce", lambda t: self._submit(
            t, "reduce", [t.inout(tensor)], reduce_op=op, scale=scale, root=root), [tensor])

    def allgather(self, output_tensors, input_tensors, opts=None):
        tensor = self._one(input_tensors, "allgather")
        if isinstance(input_tensors, torch.Tensor):  # allgather(outputs, tensor)
            output_tensors = [output_tensors]
        outputs = output_tensors[0]
        return self._run("allgather", lambda t: self._submit(
            t, "allgather", [t.input(tensor)], [t.output(x) for x in outputs]), output_tensors)

    def _allgather_base(self, output, input, opts=None):
        ordinal = self._dense([output, input]) if output.dtype == input.dtype else None
        if ordinal is not None:  # FSDP's parameters
            self._check_usable("allgather_into_tensor")
            return self._work(self._session.allgather_into_tensor(
                self._group_for(ordinal), output, input), [output], None, ordinal)
        return self._run("allgather_into_tensor", lambda t: self._submit(
            t, "allgather_into_tensor", [t.input(input)], [t.output(output)]), [output])

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        # torch lays outputs out as [rank][input]; the sidecar takes them by input, then rank.
        by_input = [output_lists[r][i] for i in range(len(input_list))
                    for r in range(len(output_lists))]
        return self._run("allgather_coalesced", lambda t: self._submit(
            t, "allgather_coalesced", [t.input(x) for x in input_list],
            [t.output(x) for x in by_input]), output_lists)

    def gather(self, output_tensors, input_tensors, opts=None):
        tensor = self._one(input_tensors, "gather")
        root = opts.rootRank if opts is not None else 0
        outputs = output_tensors[0] if output_tensors else []
        return self._run("gather", lambda t: self._submit(
            t, "gather", [t.input(tensor)], [t.output(x) for x in outputs], root=root),
            output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None):
        tensor = self._one(output_tensors, "scatter")
        root = opts.rootRank if opts is not None else 0
        inputs = input_tensors[0] if input_tensors else []
        return self._run("scatter", lambda t: self._submit(
            t, "scatter", [t.input(x) for x in inputs], [t.output(tensor)], root=root),
            output_tensors)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        tensor = self._one(output_tensors, "reduce_scatter")
        op, scale = _reduce_op(opts)
        return self._run("reduce_scatter", lambda t: self._submit(
            t, "reduce_scatter", [t.input(x) for x in input_tensors[0]], [t.output(tensor)],
            reduce_op=op, scale=scale), output_tensors)

    def _reduce_scatter_base(self, output, input, opts=None):
        op, scale = _reduce_op(opts)
        ordinal = self._dense([output, input]) if output.dtype == input.dtype else None
        if ordinal is not None:  # FSDP's gradients
            self._check_usable("reduce_scatter_tensor")
            return self._work(self._session.reduce_scatter_tensor(
                self._group_for(ordinal), output, input, op=op, scale=scale), [output], None,
                ordinal)
        return self._run("reduce_scatter_tensor", lambda t: self._submit(
            t, "reduce_scatter_tensor", [t.input(input)], [t.output(output)], reduce_op=op,
            scale=scale), [output])

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        def elements(tensor, splits):
            if not splits:
                return None
            row = tensor.numel() // tensor.shape[0] if tensor.dim() > 0 and tensor.shape[0] else 1
            return [int(split) * row for split in splits]
        return self._run("alltoall_single", lambda t: self._submit(
            t, "alltoall_single", [t.input(input)], [t.output(output)],
            output_splits=elements(output, output_split_sizes),
            input_splits=elements(input, input_split_sizes)), [output])

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        if len(outputs) != len(inputs):
            raise ValueError(f"collectived: allgather_into_tensor_coalesced got {len(outputs)} "
                             f"outputs for {len(inputs)} inputs")
        world = self.size()

        def per_rank(output):
            if not output.is_contiguous() or output.numel() % world:
                raise ValueError("collectived: allgather_into_tensor_coalesced needs contiguous "
                                 f"outputs of world size ({world}) times the input's elements")
            return list(output.view(world, -1).unbind(0))

        def submit(t):
            # Stage everything before submitting anything: a failure half-way must not leave
            # ops running on stand-ins that are given back.
            if len({x.dtype for x in inputs}) > 1:  # one sidecar op carries one dtype
                staged = [(t.output(o), t.input(i)) for o, i in zip(outputs, inputs)]
                return AllOf([self._submit(t, "allgather_into_tensor", [i], [o])
                              for o, i in staged])
            staged_outputs = [t.output(x) for o in outputs for x in per_rank(o)]
            staged_inputs = [t.input(x.reshape(-1)) for x in inputs]
            return self._submit(t, "allgather_coalesced", staged_inputs, staged_outputs)
        return self._run("allgather_into_tensor_coalesced", submit, outputs)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        if len(outputs) != len(inputs):
            raise ValueError(f"collectived: reduce_scatter_tensor_coalesced got {len(outputs)} "
                             f"outputs for {len(inputs)} inputs")
        op, scale = _reduce_op(opts)

        def submit(t):
            staged = [(t.output(o), t.input(i)) for o, i in zip(outputs, inputs)]
            return AllOf([self._submit(t, "reduce_scatter_tensor", [i], [o], reduce_op=op,
                                       scale=scale) for o, i in staged])
        return self._run("reduce_scatter_tensor_coalesced", submit, outputs)

    # The names newer torch's C++ calls these by (its Python API keeps the names above).
    def all_gather_single(self, output, input, opts=None):
        return self._allgather_base(output, input, opts)

    def reduce_scatter_single(self, output, input, opts=None):
        return self._reduce_scatter_base(output, input, opts)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes,
                          opts=None):
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        return self._run("alltoall", lambda t: self._submit(
            t, "alltoall", [t.input(x) for x in input_tensors],
            [t.output(x) for x in output_tensors]), output_tensors)

    def barrier(self, opts=None):
        return self._run("barrier", lambda t: self._submit(t, "barrier"), [])

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        seconds = _seconds(timeout) or self._timeout
        self._run("barrier", lambda t: self._submit(t, "barrier", timeout=seconds), []).wait()

    def send(self, tensors, dst, tag=0):
        tensor = self._one(tensors, "send")
        return self._run("send", lambda t: self._submit(
            t, "send", [t.input(tensor)], peer=dst, tag=tag), tensors, collective=False)

    def recv(self, tensors, src, tag=0):
        tensor = self._one(tensors, "recv")
        return self._run("recv", lambda t: self._submit(
            t, "recv", [], [t.output(tensor)], peer=src, tag=tag), tensors, collective=False)

    def recv_anysource(self, tensors, tag=0):
        # torch's dist.recv(t) without src: the work's _source_rank() names the sender.
        tensor = self._one(tensors, "recv")
        return self._run("recv", lambda t: self._submit(
            t, "recv", [], [t.output(tensor)], peer=-1, tag=tag), tensors, collective=False)


def _create(store, rank, world_size, timeout):
    return ProcessGroupCollectived(store, rank, world_size, timeout)


_barrier_skips = threading.local()


def _skip_next_init_barrier():
    """torch 1.13's init_process_group and new_group end with a barrier in the job's store that
    counts every rank in once: for a replacement the count already equals the world size, so its
    own check-in would wait forever. The group was formed in the sidecars, so the replacement
    skips that barrier (the one that follows its creation, on this thread)."""
    _barrier_skips.pending = True


def _install_barrier_skip():
    c10d = dist.distributed_c10d
    barrier = getattr(c10d, "_store_based_barrier", None)
    if barrier is None or getattr(barrier, "_collectived", False):
        return

    def store_based_barrier(*args, **kwargs):
        if getattr(_barrier_skips, "pending", False):
            _barrier_skips.pending = False
            return None
        return barrier(*args, **kwargs)

    store_based_barrier._collectived = True
    c10d._store_based_barrier = store_based_barrier


def _served_device_types():
    """CPU, and CUDA when this client was built with CUDA (without loading CUDA: that waits for
    the first CUDA tensor); whether the sidecar has a GPU is its to say, when the CUDA group is
    created."""
    return ["cpu", "cuda"] if _cuda.built() else ["cpu"]


def _registration_options():
    """torch 2.1+ asks which devices a plugin serves, so that "collectived" alone (or
    "cuda:collectived") picks it for CUDA tensors too. torch sends a Python process group the
    tensors of every device (the group is the whole ProcessGroup, not one device's Backend):
    OpTensors refuses the others."""
    parameters = inspect.signature(dist.Backend.register_backend).parameters
    return {"devices": _served_device_types()} if "devices" in parameters else {}


def register():
    """Registers the backend "collectived" with torch.distributed (idempotent)."""
    if hasattr(dist.Backend, BACKEND_NAME.upper()):
        return
    _install_barrier_skip()
    dist.Backend.register_backend(BACKEND_NAME, _create, **_registration_options())
