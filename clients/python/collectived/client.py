"""Client: one session with a collectived sidecar, for Python programs (torch programs use the
backend, collectived.torch, which drives the same core).

The session is the C++ client's (clients/cpp, through libcollectived_native.so and
collectived.native_session): the same Attach stream, submission ring, fd channel and works as a
C++ program's. The session is a long-lived stream: the sidecar treats the client as gone the
moment it closes (exit, crash, kill -9) and fails its groups on every other rank.

Tensors are numpy arrays and torch tensors (contiguous; CPU or CUDA). Host tensors that live in
one of this client's shared-memory buffers (``Client.empty``, ``Buffer.array``,
``Buffer.tensor``, or memory registered with ``register_fd`` and its address) are passed
zero-copy: the sidecar works on them in place. Any other host tensor travels inline in the
request, and its result is written back when the op completes. CUDA tensors are shared with the
sidecar in place (CUDA IPC, or the VMM allocations they live in).

Memory reaches the sidecar only as a file descriptor (a sealed memfd, or a torch shared
storage's fd through ``Client.register_fd``), passed over the session's fd channel: it has no
name, and nothing is left in /dev/shm when a process dies.
"""

import numbers
import os
import threading

import grpc
import numpy as np

from collectived.address import resolve_address
from collectived.channel import open_channel
from collectived.errors import CollectivedError, from_rpc_error
from collectived.native_session import NativeSession
from collectived.store import StoreClient
from collectived.v1 import admin_pb2, admin_pb2_grpc

# Recv's ``src`` that takes the first matching send from any rank (the proto's -1).
ANY_SOURCE = -1


class Work:
    """An op submitted to the sidecar: wait(), wait_stream(), is_completed(), exception(),
    done callbacks, and once it completed its sequence number and (a recv) its sender."""

    __slots__ = ("_native", "op", "group", "_callbacks_done")

    def __init__(self, native, op, group):
        self._native = native
        self.op, self.group = op, group
        self._callbacks_done = None  # an Event once a callback was added: set once they ran

    @property
    def sequence_number(self):
        """The op's sequence number in its group (the sidecar's); 0 until it completed, and for
        point-to-point ops."""
        return self._native.sequence_number()

    @property
    def inline_result_bytes(self):
        """The bytes of results that came back in the sidecar's response once the op completed
        (copied into inline tensors); 0 when every result was written in place."""
        return self._native.inline_result_bytes()

    @property
    def source_rank(self):
        """The group rank a completed recv took its message from; -1 otherwise."""
        return self._native.source_rank()

    def is_completed(self):
        return self._native.is_completed()

    def exception(self):
        """The op's error once it failed, else None."""
        return self._native.exception()

    def wait(self, timeout=None):
        """Blocks until the op completes (its results written back); raises its error, or
        TimeoutError after ``timeout`` seconds (the op goes on: a later wait may succeed).
        The op's done callbacks have run when it returns."""
        self._native.wait(timeout)
        if self._callbacks_done is not None:
            self._callbacks_done.wait()  # the reader thread runs them as the op completes
        return True

    def wait_stream(self, stream, timeout=None):
        """c10d's ``Work.wait()`` on CUDA: makes ``stream`` (a cudaStream_t as an integer, of
        the op's device) wait for the op's results without waiting for them on the CPU; raises
        the op's error when it failed before that. Host ops wait as wait()."""
        return self._native.wait_stream(stream, timeout)

    def add_done_callback(self, callback):
        """Runs ``callback(work)`` once the op completes (at once if it has), on the C++
        client's reader thread: it must not wait for another op."""
        done = threading.Event()
        self._callbacks_done = done  # wait() waits for the last one added, which runs last

        def run(_):
            try:
                callback(self)
            finally:
                done.set()
        self._native.add_done_callback(run)


class Region:
    """Memory registered with the sidecar as a file descriptor (``Client.register_fd``): its
    buffer id, and where this process maps it."""

    def __init__(self, client, native, address, size):
        self._client = client
        self._native = native
        self.address, self.size = address, size

    @property
    def id(self):
        """The sidecar's id of the buffer in this session (ShmRef.buffer_id)."""
        return self._native.id

    def contains(self, ptr, nbytes):
        return self._native.holds_span(ptr, nbytes) is not None

    def close(self):
        """Unregisters it (ops already running keep the sidecar's mapping until they end)."""
        self._client._forget(self)
        self._native.free()


class Buffer(Region):
    """Anonymous shared memory (a memfd sealed against shrinking) registered with the sidecar.
    Its file descriptor was passed over the fd channel and closed: the memory has no name, so
    nothing is left behind whatever happens to the process. Arrays and tensors over it must not
    be used once it is closed (its mapping goes with it)."""

    def array(self, shape, dtype=np.float32, offset=0):
        """A numpy array living in this buffer at byte ``offset``."""
        dtype = np.dtype(dtype)
        count = int(np.prod(shape))
        if not count:
            return np.empty(shape, dtype=dtype)
        if offset < 0 or offset + count * dtype.itemsize > self.size:
            raise ValueError(f"collectived: {count * dtype.itemsize} bytes at offset {offset} do "
                             f"not fit in a buffer of {self.size}")
        return np.frombuffer(self._native._memory, dtype=dtype, count=count,
                             offset=offset).reshape(shape)

    def tensor(self, shape, dtype=None, offset=0):
        """A torch tensor living in this buffer at byte ``offset``."""
        import torch
        return self._native.tensor(tuple(shape), dtype or torch.float32, offset)


def _device_ordinal(device):
    """The CUDA ordinal of a group's ``device`` ("cpu", "cuda", "cuda:N"); None for the CPU."""
    kind, _, index = str(device).partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()) or \
            (kind == "cpu" and index):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    return int(index or 0) if kind == "cuda" else None


class Client:
    """A session with a collectived sidecar. Thread-safe."""

    def __init__(self, address=None, name=None, connect_timeout=10.0, tls=None,
                 stream_signals=None):
        """``tls``: a ``TlsOptions`` for a TCP address (None: from $COLLECTIVED_TLS_*).
        ``stream_signals``: CUDA collectives' ``Work.wait_stream`` makes the stream wait on a word
        the sidecar's stream writes instead of first waiting on the CPU for the response naming
        the sidecar's event; None = $COLLECTIVED_STREAM_WAIT ("signal" or "event"; default
        "event", see docs/gpu.md)."""
        self.address = resolve_address(address)
        self._session = NativeSession(self.address, name or f"python pid {os.getpid()}",
                                      stream_signals, connect_timeout, tls)
        # The session id is a secret (whoever holds it could use this session through this
        # connection): show session_label, the public name the sidecar's logs use, instead.
        self.session_id = self._session.info("id")
        self.session_label = self._session.info("label")
        self.sidecar_id = self._session.info("sidecar_id")
        # The API beyond the session (the sidecar's admin calls, its store) on a channel of its
        # own: those calls name no session.
        self._channel = open_channel(self.address, tls)
        self._admin_stub = admin_pb2_grpc.AdminStub(self._channel)
        self._buffers = []  # Regions whose tensors travel zero-copy
        self._natives = ()  # their NativeBuffers, as submit searches them
        self._groups = {}  # name -> its bytes, for the groups this client joined
        self._closed = False

    @property
    def ring_error(self):
        """Why collectives travel on the session stream only (None while the session has a
        submission ring)."""
        return self._session.info("ring_error")

    def _call(self, method, request, what, timeout=None, metadata=None):
        try:
            return method(request, timeout=timeout, metadata=metadata or None)
        except grpc.RpcError as error:
            raise from_rpc_error(error, what) from None

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self):
        """Ends the session: pending ops fail, buffers are released."""
        if self._closed:
            return
        self._closed = True
        # Leaving the groups first tells the sidecar this is a clean exit, not a lost rank.
        for name in list(self._groups):
            try:
                self.destroy_group(name)
            except CollectivedError:
                pass
        for region in list(self._buffers):
            try:
                region.close()
            except CollectivedError:
                pass
        self._session.close()
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- memory ------------------------------------------------------------------------------

    def _keep(self, region):
        self._buffers.append(region)
        self._natives = tuple(r._native for r in self._buffers)
        return region

    def _forget(self, region):
        if region in self._buffers:
            self._buffers.remove(region)
            self._natives = tuple(r._native for r in self._buffers)

    def register_fd(self, fd, nbytes, address=None):
        """Registers memory the caller already shares as a file descriptor (a memfd, or the fd
        of a torch shared storage: ``storage._share_fd_cpu_()``); the fd is not taken. With
        ``address``, where the caller maps the same bytes, tensors inside
        [address, address + nbytes) are passed zero-copy from then on. Returns a ``Region``
        (``.id``, ``.close()``). A file not sealed against shrinking is checked on every use:
        truncating it fails ops, never the sidecar."""
        native = self._session.register_fd(fd, nbytes, address)
        region = Region(self, native, native.address, nbytes)
        return self._keep(region) if address is not None else region

    def allocate(self, nbytes):
        """A new shared-memory Buffer of ``nbytes`` registered with the sidecar."""
        if nbytes <= 0:
            raise ValueError(f"buffer size must be positive, got {nbytes}")
        native = self._session.allocate(nbytes)
        return self._keep(Buffer(self, native, native.address, nbytes))

    def free(self, buffer):
        buffer.close()

    def empty(self, shape, dtype=np.float32):
        """A zero-copy numpy array in a buffer of its own."""
        dtype = np.dtype(dtype)
        nbytes = max(1, int(np.prod(shape)) * dtype.itemsize)
        return self.allocate(nbytes).array(shape, dtype)

    def empty_tensor(self, shape, dtype=None):
        """A zero-copy torch tensor in a buffer of its own."""
        import torch
        dtype = dtype or torch.float32
        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = max(1, int(np.prod(shape)) * itemsize)
        return self.allocate(nbytes).tensor(shape, dtype)

    # -- groups and store --------------------------------------------------------------------

    def create_group(self, name, rank, world_size, members=None, store_address="",
                     store_prefix="", timeout=1800.0, job_token="", device="cpu",
                     fault_tolerance="fail-fast", min_ranks=1):
        """Joins a group; returns the CreateGroupResponse (group_rank, group_size, members, ...).

        Blocks until every member has joined through its own sidecar. ``device`` is where the
        group's tensors live: "cpu" (Gloo), or "cuda" / "cuda:N" (NCCL on GPU N of the sidecar;
        refused, with the reason, by a sidecar that has no GPU backend or sees no GPU).
        ``fault_tolerance``: "fail-fast" (a lost rank fails every op), or "shrink" (the group
        goes on among its live ranks, down to ``min_ranks``; docs/fault-tolerance.md).
        """
        ordinal = _device_ordinal(device)
        response = self._session.create_group(
            name, rank, world_size, store_address=store_address, timeout=timeout,
            job_token=job_token, device=ordinal, members=members, store_prefix=store_prefix,
            fault_tolerance=fault_tolerance, min_ranks=min_ranks)
        self._groups[name] = name.encode()
        return response

    def destroy_group(self, name):
        self._groups.pop(name, None)
        self._session.destroy_group(name)

    def sidecar_info(self):
        return self._call(self._admin_stub.GetInfo, admin_pb2.GetInfoRequest(), "sidecar info")

    def list_groups(self):
        """The live groups this client's sidecar takes part in (GroupSummary messages)."""
        return list(self._call(self._admin_stub.ListGroups, admin_pb2.ListGroupsRequest(),
                               "list groups").groups)

    def flight_recorder(self, group="", limit=0):
        """The flight records (OpRecord messages) of this client's sidecar: the most recent
        ``limit`` ops (0: all it holds) of group ``group`` (empty: of every group), in flight ones
        included; each with its arrival, its ranks' arrivals and, on CUDA groups, when its device
        work was enqueued and done. NotFoundError for an unknown group."""
        request = admin_pb2.GetFlightRecorderRequest(group=group, limit=limit)
        return list(self._call(self._admin_stub.GetFlightRecorder, request,
                               f"flight recorder of group '{group}'" if group else
                               "flight recorder").ops)

    def abort_group(self, name, reason="", admin_token=None, job_token=None, timeout=30.0):
        """Aborts group ``name`` on this client's sidecar: its ops fail on every rank with
        AbortedError ("aborted by an operator: <reason>"). Returns how many ops were in flight.

        Needs a credential: ``admin_token`` (the content of the sidecar's --admin-token-file),
        or ``job_token`` (the token the group was created with: a job may abort itself); over
        TCP a client certificate named in the sidecar's --admin-names serves as well. Raises
        UnauthenticatedError without one, PermissionDeniedError with a wrong one, NotFoundError
        for an unknown group. Tokens travel as gRPC metadata, never in an error message.
        """
        metadata = []
        if admin_token:
            metadata.append(("authorization", f"Bearer {admin_token}"))
        if job_token:
            metadata.append(("collectived-job-token", job_token))
        response = self._call(self._admin_stub.AbortGroup,
                              admin_pb2.AbortGroupRequest(group=name, reason=reason),
                              f"abort group '{name}'", timeout=timeout, metadata=metadata)
        return response.failed_ops

    def store(self, prefix=""):
        """The rendezvous store of this client's sidecar."""
        return StoreClient(self.address, prefix=prefix, channel=self._channel)

    # -- collectives -------------------------------------------------------------------------

    def _op(self, group, op, inputs=(), outputs=(), root=0, reduce_op="SUM", scale=None,
            peer=-1, tag=0, input_splits=None, output_splits=None, timeout=None, async_op=False):
        """Submits ``op`` with its tensors in the layout of the op table (op_table.py):
        in-place tensors send their bytes and receive the result, inputs send theirs, outputs
        only receive. Blocks until it completes unless ``async_op``."""
        name = self._groups.get(group) or str(group).encode()
        native = self._session.submit(name, op, inputs, outputs, reduce_op=reduce_op,
                                      scale=scale, root=root, peer=peer, tag=tag,
                                      input_splits=input_splits, output_splits=output_splits,
                                      timeout=timeout, buffers=self._natives)
        work = Work(native, op, group)
        if not async_op:
            work.wait()
        return work

    def allreduce(self, group, tensor, op="SUM", scale=None, async_op=False, timeout=None):
        return self._op(group, "allreduce", [tensor], reduce_op=op, scale=scale,
                        timeout=timeout, async_op=async_op)

    def allreduce_coalesced(self, group, tensors, op="SUM", scale=None, async_op=False,
                            timeout=None):
        return self._op(group, "allreduce_coalesced", list(tensors), reduce_op=op, scale=scale,
                        timeout=timeout, async_op=async_op)

    def broadcast(self, group, tensor, root, async_op=False, timeout=None):
        return self._op(group, "broadcast", [tensor], root=root, timeout=timeout,
                        async_op=async_op)

    def reduce(self, group, tensor, root, op="SUM", scale=None, async_op=False, timeout=None):
        return self._op(group, "reduce", [tensor], root=root, reduce_op=op, scale=scale,
                        timeout=timeout, async_op=async_op)

    def allgather(self, group, outputs, input, async_op=False, timeout=None):
        return self._op(group, "allgather", [input], list(outputs), timeout=timeout,
                        async_op=async_op)

    def allgather_into_tensor(self, group, output, input, async_op=False, timeout=None):
        return self._op(group, "allgather_into_tensor", [input], [output], timeout=timeout,
                        async_op=async_op)

    def allgather_coalesced(self, group, output_lists, inputs, async_op=False, timeout=None):
        """output_lists[i][r] receives rank r's inputs[i]."""
        return self._op(group, "allgather_coalesced", list(inputs),
                        [t for outputs in output_lists for t in outputs], timeout=timeout,
                        async_op=async_op)

    def reduce_scatter(self, group, output, inputs, op="SUM", scale=None, async_op=False,
                       timeout=None):
        return self._op(group, "reduce_scatter", list(inputs), [output], reduce_op=op,
                        scale=scale, timeout=timeout, async_op=async_op)

    def reduce_scatter_tensor(self, group, output, input, op="SUM", scale=None, async_op=False,
                              timeout=None):
        return self._op(group, "reduce_scatter_tensor", [input], [output], reduce_op=op,
                        scale=scale, timeout=timeout, async_op=async_op)

    def alltoall(self, group, outputs, inputs, async_op=False, timeout=None):
        return self._op(group, "alltoall", list(inputs), list(outputs), timeout=timeout,
                        async_op=async_op)

    def alltoall_single(self, group, output, input, output_splits=None, input_splits=None,
                        async_op=False, timeout=None):
        """Splits are in elements; None means equal splits."""
        return self._op(group, "alltoall_single", [input], [output], input_splits=input_splits,
                        output_splits=output_splits, timeout=timeout, async_op=async_op)

    def gather(self, group, input, outputs=None, root=0, async_op=False, timeout=None):
        return self._op(group, "gather", [input], list(outputs or []), root=root,
                        timeout=timeout, async_op=async_op)

    def scatter(self, group, output, inputs=None, root=0, async_op=False, timeout=None):
        return self._op(group, "scatter", list(inputs or []), [output], root=root,
                        timeout=timeout, async_op=async_op)

    def barrier(self, group, async_op=False, timeout=None):
        return self._op(group, "barrier", timeout=timeout, async_op=async_op)

    def send(self, group, tensor, dst, tag=0, async_op=False, timeout=None):
        return self._op(group, "send", [tensor], peer=dst, tag=_tag(tag, "send", group),
                        timeout=timeout, async_op=async_op)

    def recv(self, group, tensor, src=None, tag=0, async_op=False, timeout=None):
        """Receives into ``tensor`` from group rank ``src``, or from whichever rank sends first
        with ``tag`` when ``src`` is None (or -1); the work's ``source_rank`` names the sender."""
        if src is None:
            src = ANY_SOURCE
        source = "any rank" if src == ANY_SOURCE else f"rank {src}"
        where = f"recv (from {source}, tag {tag!r}) on group '{group}'"
        tag = _tag(tag, where)
        try:
            return self._op(group, "recv", outputs=[tensor], peer=src, tag=tag, timeout=timeout,
                            async_op=async_op)
        except (ValueError, TypeError, AttributeError) as error:  # not a tensor it can take
            if isinstance(error, CollectivedError):
                raise
            raise ValueError(f"{where}: {error}") from None


def _tag(tag, where, group=None):
    """``tag`` checked: an integer of 64 bits (ValueError naming the op otherwise)."""
    if isinstance(tag, bool) or not isinstance(tag, numbers.Integral) \
            or not -2**63 <= tag < 2**63:
        what = f"{where} on group '{group}'" if group is not None else where
        raise ValueError(f"{what}: the tag must be an integer of 64 bits")
    return int(tag)
