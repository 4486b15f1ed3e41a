"""Hostile requests for every RPC of a collectived sidecar, and a runner that sends them.

Every service and method is read from the descriptors of the generated stubs (plus the standard
grpc.health.v1.Health, which the daemon serves too). For each method the generator makes:

- ``empty``: the empty message (zero bytes);
- ``absurd``: every field filled from the descriptor with extreme values of its type (int64
  -2^63 / 2^63-1, uint64 2^64-1, int32 min/max, unknown enum numbers, NaN/inf, 1 MiB and NUL
  strings, "../../etc/passwd", 100k-entry repeated fields, large bytes) and with ids that are
  real, unknown or absurd (session ids, buffer ids, group names, client op ids), sometimes with
  an invalid UTF-8 string appended on the wire;
- ``mutated``: a valid request of the method with bytes flipped, inserted, deleted or cut;
- ``random``: random bytes, most of which do not parse.

Session.Attach gets whole conversations: garbage first, a first message that is not ``open``,
``open`` followed by absurd submits, pings and garbage, then the close. Calls go through gRPC's
generic interface with raw bytes, so requests that do not parse reach the server as they are.
"""

import collections
import concurrent.futures
import contextlib
import logging
import math
import os
import random
import sys
import time
import warnings

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor as FD

from collectived.v1 import (admin_pb2, collectives_pb2, common_pb2, group_pb2, session_pb2,
                            store_pb2)

MiB = 1 << 20
MAX_MESSAGE_BYTES = 64 << 20

# Methods that may legitimately block until the caller's deadline (waits on keys, peers or ops).
MAY_BLOCK = {
    "/collectived.v1.Store/Get", "/collectived.v1.Store/Wait", "/collectived.v1.Store/MultiGet",
    "/collectived.v1.Groups/CreateGroup", "/collectived.v1.Collectives/Run",
    "/collectived.v1.Collectives/Wait", "/collectived.v1.Session/Attach",
    "/grpc.health.v1.Health/Watch",
}


def _health_module():
    """grpc.health.v1 messages and service, built from a descriptor (no grpcio-health needed)."""
    file = descriptor_pb2.FileDescriptorProto(name="grpc/health/v1/health.proto",
                                              package="grpc.health.v1", syntax="proto3")
    request = file.message_type.add(name="HealthCheckRequest")
    request.field.add(name="service", number=1, type=FD.TYPE_STRING, label=FD.LABEL_OPTIONAL)
    response = file.message_type.add(name="HealthCheckResponse")
    status = response.enum_type.add(name="ServingStatus")
    for number, name in enumerate(("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN")):
        status.value.add(name=name, number=number)
    response.field.add(name="status", number=1, type=FD.TYPE_ENUM, label=FD.LABEL_OPTIONAL,
                       type_name=".grpc.health.v1.HealthCheckResponse.ServingStatus")
    service = file.service.add(name="Health")
    service.method.add(name="Check", input_type=".grpc.health.v1.HealthCheckRequest",
                       output_type=".grpc.health.v1.HealthCheckResponse")
    service.method.add(name="Watch", input_type=".grpc.health.v1.HealthCheckRequest",
                       output_type=".grpc.health.v1.HealthCheckResponse", server_streaming=True)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return pool.FindFileByName(file.name)


HEALTH_FILE = _health_module()
_FACTORY = message_factory.MessageFactory()


def message_class(descriptor):
    return _FACTORY.GetPrototype(descriptor)


class Method:
    """One RPC: full path, request descriptor and shape (unary, server or bidi streaming)."""

    def __init__(self, service, method):
        self.path = f"/{service.full_name}/{method.name}"
        self.name = f"{service.name}.{method.name}"
        self.input = method.input_type
        self.output = method.output_type
        proto = descriptor_pb2.MethodDescriptorProto()
        method.CopyToProto(proto)
        self.client_streaming = proto.client_streaming
        self.server_streaming = proto.server_streaming

    def __repr__(self):
        return self.path


def all_methods():
    """Every method of every service the daemon serves, from the descriptors."""
    methods = []
    for file in (session_pb2.DESCRIPTOR, group_pb2.DESCRIPTOR, collectives_pb2.DESCRIPTOR,
                 store_pb2.DESCRIPTOR, admin_pb2.DESCRIPTOR, HEALTH_FILE):
        for service in file.services_by_name.values():
            for method in service.methods:
                methods.append(Method(service, method))
    return methods


class Ids:
    """Real ids of a live session (so requests get past the first checks) and unknown ones."""

    def __init__(self, session_id="", group="", buffer_id=0, store_address="",
                 keys=(), client_op_ids=()):
        self.session_id = session_id
        self.group = group
        self.buffer_id = buffer_id
        self.store_address = store_address
        self.keys = list(keys) or ["hostile/key"]
        self.client_op_ids = list(client_op_ids) or [1]


HUGE_STRING = "x" * MiB
HUGE_BYTES = b"\xab" * MiB
STRINGS = ["", HUGE_STRING, "a\x00b", "\x00", "../../etc/passwd", "/../../../etc/shadow",
           "名前\u202e", "%s%n%x", "x" * 4097, " ", "\n", "*", "..", "/"]
INT64 = [-1, -(1 << 63), (1 << 63) - 1, 1 << 62, 0, 1, -(1 << 62)]
UINT64 = [0, 1, (1 << 64) - 1, 1 << 63, 1 << 62, 1 << 32, (1 << 64) - 2]
INT32 = [-(1 << 31), (1 << 31) - 1, -1, 0, 1, 1 << 20, 131073]
UINT32 = [0, 1, (1 << 32) - 1]
FLOATS = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e308, 5e-324, -1.0]
INVALID_UTF8 = [b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"ok\xfe\xfe", b"\xf8\x88\x80\x80\x80"]

# Cheap values for the entries of a 100k-long repeated field.
CHEAP = {
    FD.CPPTYPE_INT64: [-1, 0, 1 << 62], FD.CPPTYPE_UINT64: [0, (1 << 64) - 1],
    FD.CPPTYPE_INT32: [-1, 0, 7], FD.CPPTYPE_UINT32: [0, 1], FD.CPPTYPE_DOUBLE: [math.nan, 1.0],
    FD.CPPTYPE_FLOAT: [1.0], FD.CPPTYPE_BOOL: [True], FD.CPPTYPE_STRING: ["", "k"],
}


class Generator:
    """Requests for one method: empty, absurd, mutated and random, all from one seeded RNG."""

    def __init__(self, rng, ids):
        self.rng = rng
        self.ids = ids

    # -- absurd --------------------------------------------------------------------------------

    def _named(self, field):
        """Values for fields that name things (ids): real, unknown or absurd."""
        r, ids = self.rng, self.ids
        name = field.name
        if name == "session_id":
            return [ids.session_id] * 3 + ["s-unknown-0123456789", "", HUGE_STRING, "../x"]
        if name in ("group", "name") and field.containing_type.name != "OpenSession":
            others = ["no-such-group", "", "x" * 4097, "a/b", "\x00"]
            if field.containing_type.name in ("AbortGroupRequest", "DestroyGroupRequest"):
                return others  # keep the real group alive for the requests that follow
            return [ids.group] * 3 + others
        if name == "buffer_id":
            return [ids.buffer_id] * 3 + [0, (1 << 64) - 1, r.getrandbits(64)]
        if name == "client_op_id":
            return ids.client_op_ids + [0, (1 << 64) - 1, r.getrandbits(64)]
        if name == "store_address":
            return ["", ids.store_address, "127.0.0.1:1", "unix:///no/such.sock",
                    "[::1]:99999", "host:-1", "x" * 5000, "unix:"]
        if name in ("key", "keys"):
            return ids.keys + ["", "k", "x" * 4097, "a\x00b", "../../etc/passwd"]
        return None

    def _scalar(self, field, cheap=False):
        r = self.rng
        if cheap:
            if field.cpp_type == FD.CPPTYPE_ENUM:
                return r.choice([0, 99])
            if field.type == FD.TYPE_BYTES:
                return b""
            return r.choice(CHEAP[field.cpp_type])
        named = self._named(field)
        if named is not None:
            return r.choice(named)
        t = field.cpp_type
        if t == FD.CPPTYPE_INT64:
            return r.choice(INT64)
        if t == FD.CPPTYPE_UINT64:
            return r.choice(UINT64)
        if t == FD.CPPTYPE_INT32:
            return r.choice(INT32)
        if t == FD.CPPTYPE_UINT32:
            return r.choice(UINT32)
        if t in (FD.CPPTYPE_DOUBLE, FD.CPPTYPE_FLOAT):
            return r.choice(FLOATS)
        if t == FD.CPPTYPE_BOOL:
            return r.choice([True, False])
        if t == FD.CPPTYPE_ENUM:
            top = max(v.number for v in field.enum_type.values)
            valid = r.choice(field.enum_type.values).number
            return r.choice([valid, valid, top + 1, -1, (1 << 31) - 1, -(1 << 31), 12345])
        if field.type == FD.TYPE_BYTES:
            return r.choice([b"", HUGE_BYTES, r.randbytes(r.randint(1, 64)), b"\x00" * 4096,
                             r.randbytes(4)])
        return r.choice(STRINGS)

    def fill(self, message, depth=0):
        """Fills `message` with absurd values; one member per oneof."""
        r = self.rng
        chosen = {o.name: r.choice(o.fields) for o in message.DESCRIPTOR.oneofs}
        for field in message.DESCRIPTOR.fields:
            oneof = field.containing_oneof
            if oneof is not None and chosen[oneof.name] is not field:
                continue
            if oneof is None and r.random() < 0.25:
                continue  # leave some fields unset
            if field.label == FD.LABEL_REPEATED:
                many = r.random() < 0.04
                count = 100_000 if many else r.choice([0, 1, 2, 3, 5, 17])
                target = getattr(message, field.name)
                if field.cpp_type == FD.CPPTYPE_MESSAGE:
                    for _ in range(count):
                        item = target.add()
                        if not many and depth < 3:
                            self.fill(item, depth + 1)
                else:
                    target.extend(self._scalar(field, cheap=many) for _ in range(count))
            elif field.cpp_type == FD.CPPTYPE_MESSAGE:
                sub = getattr(message, field.name)
                sub.SetInParent()
                if depth < 4:
                    self.fill(sub, depth + 1)
            else:
                setattr(message, field.name, self._scalar(field))
        return message

    def absurd(self, method):
        message = self.fill(message_class(method.input)())
        data = message.SerializeToString()
        strings = [f for f in method.input.fields if f.type == FD.TYPE_STRING]
        if strings and self.rng.random() < 0.2:
            data += _length_delimited(self.rng.choice(strings).number,
                                      self.rng.choice(INVALID_UTF8))
        return data

    # -- mutated and random ---------------------------------------------------------------------

    def mutate(self, data):
        r = self.rng
        data = bytearray(data or b"\x00")
        for _ in range(r.randint(1, 8)):
            what = r.randrange(7)
            at = r.randrange(len(data) + 1)
            if what == 0 and data:
                data[min(at, len(data) - 1)] ^= 1 << r.randrange(8)
            elif what == 1 and data:
                data[min(at, len(data) - 1)] = r.choice([0x00, 0xff, 0x80, 0x7f, r.randrange(256)])
            elif what == 2:
                data[at:at] = r.randbytes(r.randint(1, 16))
            elif what == 3 and data:
                del data[at:at + r.randint(1, 8)]
            elif what == 4:
                data = data[:at]
            elif what == 5:
                data[at:at] = b"\xff" * r.randint(1, 11)  # an overlong varint
            else:
                chunk = data[at:at + r.randint(1, 32)]
                data[at:at] = chunk * r.randint(1, 64)
        return bytes(data)

    def random_bytes(self):
        return self.rng.randbytes(self.rng.choice([1, 2, 5, 16, 100, 4096]))


def _varint(value):
    out = bytearray()
    while True:
        byte = value & 0x7f
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _length_delimited(number, payload):
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def parses(method, data):
    """Whether `data` is a valid serialized request of `method`, checked as strictly as the C++
    parser does (Python only warns about a stray end-group tag). Not thread-safe (warnings)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            message_class(method.input)().ParseFromString(data)
        except Exception:  # noqa: BLE001 - DecodeError and friends
            return False
    return not caught


def valid_request(method, ids):
    """A well-formed request of `method` against the real ids (the mutation templates)."""
    four = common_pb2.Tensor(dtype=common_pb2.FLOAT32, count=4, inline=b"\x00\x00\x80\x3f" * 4)
    collective = collectives_pb2.CollectiveRequest(
        session_id=ids.session_id, group=ids.group, client_op_id=ids.client_op_ids[0],
        timeout_ms=1000)
    collective.allreduce.tensor.CopyFrom(four)
    key = ids.keys[0]
    build = {
        "Session.RegisterBuffer": lambda: session_pb2.RegisterBufferRequest(
            session_id=ids.session_id, size=4096),
        "Session.UnregisterBuffer": lambda: session_pb2.UnregisterBufferRequest(
            session_id=ids.session_id, buffer_id=ids.buffer_id),
        "Session.Attach": lambda: session_pb2.SessionRequest(
            open=session_pb2.OpenSession(client_name="hostile", pid=1)),
        "Groups.CreateGroup": lambda: group_pb2.CreateGroupRequest(
            session_id=ids.session_id, name=ids.group, rank=0, world_size=1,
            store_address=ids.store_address, timeout_ms=1000),
        "Groups.Replacements": lambda: group_pb2.ReplacementsRequest(
            session_id=ids.session_id, group=ids.group, action=group_pb2.ReplacementsRequest.LIST),
        "Groups.DestroyGroup": lambda: group_pb2.DestroyGroupRequest(
            session_id=ids.session_id, group="no-such-group"),
        "Collectives.Run": lambda: collective,
        "Collectives.Submit": lambda: collective,
        "Collectives.Wait": lambda: collectives_pb2.WaitRequest(
            session_id=ids.session_id, client_op_id=ids.client_op_ids[0], timeout_ms=100),
        "Store.Set": lambda: store_pb2.StoreSetRequest(key=key, value=b"v"),
        "Store.Get": lambda: store_pb2.StoreGetRequest(key=key, timeout_ms=100),
        "Store.Add": lambda: store_pb2.StoreAddRequest(key=key + "/n", delta=1),
        "Store.CompareSet": lambda: store_pb2.StoreCompareSetRequest(key=key, expected=b"v",
                                                                     desired=b"w"),
        "Store.Wait": lambda: store_pb2.StoreWaitRequest(keys=[key], timeout_ms=100),
        "Store.Check": lambda: store_pb2.StoreCheckRequest(keys=[key, "other"]),
        "Store.DeleteKey": lambda: store_pb2.StoreDeleteKeyRequest(key="hostile/scratch"),
        "Store.DeletePrefix": lambda: store_pb2.StoreDeletePrefixRequest(
            prefix="hostile/collectived/groups/g/1/"),
        "Store.NumKeys": lambda: store_pb2.StoreNumKeysRequest(),
        "Store.MultiGet": lambda: store_pb2.StoreMultiGetRequest(keys=[key], timeout_ms=100),
        "Store.MultiSet": lambda: store_pb2.StoreMultiSetRequest(keys=[key, key + "2"],
                                                                 values=[b"v", b"2"]),
        "Store.Append": lambda: store_pb2.StoreAppendRequest(key="hostile/appended", value=b"+"),
        "Admin.GetInfo": lambda: admin_pb2.GetInfoRequest(),
        "Admin.ListGroups": lambda: admin_pb2.ListGroupsRequest(),
        "Admin.DescribeGroup": lambda: admin_pb2.DescribeGroupRequest(group=ids.group),
        "Admin.GetFlightRecorder": lambda: admin_pb2.GetFlightRecorderRequest(group=ids.group,
                                                                              limit=4),
        "Admin.AbortGroup": lambda: admin_pb2.AbortGroupRequest(group="no-such-group",
                                                                reason="hostile"),
    }
    if method.name in build:
        return build[method.name]().SerializeToString()
    if method.name in ("Health.Check", "Health.Watch"):
        return b""  # service "" is the whole server
    raise KeyError(f"no valid request for {method.path}: add one to valid_request")


class Outcome:
    """What one call (or one Attach conversation) came back with."""

    __slots__ = ("listener", "method", "kind", "code", "details", "elapsed", "parsed",
                 "deadline_s", "bad_responses")

    def __init__(self, listener, method, kind, code, details, elapsed, parsed, deadline_s,
                 bad_responses=0):
        self.listener = listener
        self.method = method
        self.kind = kind
        self.code = code
        self.details = details
        self.elapsed = elapsed
        self.parsed = parsed
        self.deadline_s = deadline_s
        self.bad_responses = bad_responses  # answers that do not parse as the output type

    @property
    def blocked(self):
        """Ran into the caller's deadline (and only after the deadline had passed)."""
        return self.code == grpc.StatusCode.DEADLINE_EXCEEDED and \
            self.elapsed >= 0.9 * self.deadline_s

    @property
    def server_timeout(self):
        """The server's own answer to a wait that timed out (the request's timeout_ms)."""
        return self.code == grpc.StatusCode.DEADLINE_EXCEEDED and not self.blocked and \
            self.details.startswith("Timeout")

    def problem(self):
        """Why this outcome is not acceptable, or None."""
        if self.bad_responses:
            return f"{self.bad_responses} responses that do not parse as {self.method.output.name}"
        if self.code == grpc.StatusCode.UNKNOWN:
            return "UNKNOWN status (an unhandled exception in the handler?)"
        if self.code == grpc.StatusCode.INTERNAL and self.parsed:
            return "INTERNAL status for a request that parses"
        if self.code == grpc.StatusCode.DEADLINE_EXCEEDED:
            if self.server_timeout:
                return None
            if not self.blocked:
                return "DEADLINE_EXCEEDED before the deadline had passed"
            if self.method.path not in MAY_BLOCK:
                return "blocked until the deadline on a method that must answer at once"
        if self.code == grpc.StatusCode.UNAVAILABLE:
            # A request may name a store address where nothing listens: the sidecar says so.
            if self.method.path == "/collectived.v1.Groups/CreateGroup" and \
                    "joining group" in self.details and "to connect" in self.details:
                return None
            return "UNAVAILABLE (the daemon went away or refused the connection?)"
        return None

    def describe(self):
        return (f"{self.listener} {self.method.name} [{self.kind}] -> {self.code.name} after "
                f"{self.elapsed:.2f} s: {self.details[:300]!r}")


@contextlib.contextmanager
def _quiet_stderr():
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _response_parses(method, data):
    """Whether a response is a valid message (strings valid UTF-8 included): a client with
    stubs would fail on one that is not, and lose the call or the whole session stream."""
    try:
        message_class(method.output)().ParseFromString(data)
        return True
    except Exception:  # noqa: BLE001 - DecodeError
        return False


class BadStatusMessages(logging.Handler):
    """Collects what grpcio logs when a status message (grpc-message) is not valid UTF-8."""

    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        text = record.getMessage()
        if "Invalid encoding" in text:
            self.messages.append(text[:300])


def _code_of(error):
    return error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN


class Runner:
    """Sends hostile requests to one sidecar over its channels and records the outcomes."""

    def __init__(self, channels, ids, seed, deadline_s=5.0, workers=96):
        self.channels = channels  # {"unix": channel, "tcp": channel}
        self.ids = ids
        self.rng = random.Random(seed)
        self.generator = Generator(self.rng, ids)
        self.deadline_s = deadline_s
        self.workers = workers
        self.methods = all_methods()
        self.outcomes = []
        self.templates = {m.path: valid_request(m, ids) for m in self.methods}

    # -- building one job ----------------------------------------------------------------------

    def _payload(self, method):
        g, r = self.generator, self.rng
        kind = r.choices(["empty", "absurd", "mutated", "random"], weights=[1, 8, 8, 2])[0]
        if kind == "empty":
            return kind, b""
        if kind == "absurd":
            return kind, g.absurd(method)
        if kind == "mutated":
            return kind, g.mutate(self.templates[method.path])
        return kind, g.random_bytes()

    def _conversation(self):
        """The messages of one hostile Attach stream (each raw bytes), and its name."""
        g, r = self.generator, self.rng
        attach = next(m for m in self.methods if m.name == "Session.Attach")
        submit_method = next(m for m in self.methods if m.name == "Collectives.Submit")
        open_message = session_pb2.SessionRequest()
        g.fill(open_message.open)
        opening = open_message.SerializeToString()
        kind = r.choice(["garbage-first", "not-open-first", "open-then-absurd",
                         "open-then-close", "open-then-mutated", "empty-stream"])
        if kind == "garbage-first":
            return kind, [g.random_bytes(), opening]
        if kind == "not-open-first":
            first = session_pb2.SessionRequest()
            if r.random() < 0.5:
                first.ping = r.choice(UINT64)
            else:
                g.fill(first.submit)
            return kind, [first.SerializeToString(), opening]
        if kind == "open-then-close":
            return kind, [opening]
        if kind == "empty-stream":
            return kind, []
        messages = [opening]
        for _ in range(r.randint(1, 12)):
            roll = r.random()
            if roll < 0.6:
                # Built on the wire: the absurd submit may carry invalid UTF-8.
                data = _length_delimited(2, g.absurd(submit_method) if r.random() < 0.9 else b"")
            elif roll < 0.75:
                data = session_pb2.SessionRequest(ping=r.choice(UINT64)).SerializeToString()
            elif kind == "open-then-mutated":
                data = g.mutate(self.templates[attach.path])
            else:
                data = r.choice([b"", g.random_bytes(), g.absurd(attach)])
            messages.append(data)
        return kind, messages

    # -- calling ---------------------------------------------------------------------------------

    def _unary(self, listener, method, kind, data, parsed):
        channel = self.channels[listener]
        start = time.monotonic()
        bad = 0
        try:
            if method.server_streaming:
                call = channel.unary_stream(method.path)(data, timeout=self.deadline_s)
                for response in call:
                    bad += not _response_parses(method, response)
                code, details = call.code(), call.details() or ""
            else:
                response = channel.unary_unary(method.path)(data, timeout=self.deadline_s)
                bad += not _response_parses(method, response)
                code, details = grpc.StatusCode.OK, ""
        except grpc.RpcError as error:
            code, details = _code_of(error), error.details() if isinstance(error, grpc.Call) \
                else repr(error)
        return Outcome(listener, method, kind, code, details or "", time.monotonic() - start,
                       parsed, self.deadline_s, bad)

    def _stream(self, listener, method, kind, messages, parsed):
        channel = self.channels[listener]
        start = time.monotonic()
        events = bad = 0
        try:
            call = channel.stream_stream(method.path)(iter(messages), timeout=self.deadline_s)
            for event in call:
                events += 1
                bad += not _response_parses(method, event)
            code, details = call.code(), call.details() or ""
        except grpc.RpcError as error:
            code, details = _code_of(error), error.details() or ""
        return Outcome(listener, method, f"stream:{kind}", code, f"{details} ({events} events)",
                       time.monotonic() - start, parsed, self.deadline_s, bad)

    def jobs(self, count):
        """`count` calls spread evenly over the methods and listeners (generated up front)."""
        with _quiet_stderr():  # protobuf's C++ parser logs every invalid UTF-8 string it sees
            return self._jobs(count)

    def _jobs(self, count):
        out = []
        listeners = sorted(self.channels)
        for i in range(count):
            method = self.methods[i % len(self.methods)]
            listener = listeners[(i // len(self.methods)) % len(listeners)]
            if method.client_streaming:
                kind, messages = self._conversation()
                parsed = all(parses(method, m) for m in messages)
                out.append((self._stream, listener, method, kind, messages, parsed))
            else:
                kind, data = self._payload(method)
                out.append((self._unary, listener, method, kind, data, parses(method, data)))
        self.rng.shuffle(out)
        return out

    def run(self, jobs, every=None, between=None):
        """Runs `jobs` concurrently, `self.workers` at a time; returns their outcomes in job order
        (also kept in self.outcomes). With `between`, calls ``between(done)`` from this thread
        after each `every` completed calls, while the others go on: a call blocked until its
        deadline holds one worker, not a whole batch."""
        with concurrent.futures.ThreadPoolExecutor(self.workers) as pool:
            futures = [pool.submit(fn, *args) for fn, *args in jobs]
            done = 0
            for _ in concurrent.futures.as_completed(futures):
                done += 1
                if between is not None and done % every == 0:
                    between(done)
            outcomes = [f.result() for f in futures]
        self.outcomes.extend(outcomes)
        return outcomes

    # -- reporting -------------------------------------------------------------------------------

    def table(self):
        """Counts per method, status code and listener, as printable text."""
        per_method = collections.defaultdict(collections.Counter)
        per_listener = collections.defaultdict(collections.Counter)
        per_kind = collections.Counter()
        for o in self.outcomes:
            per_method[o.method.name][o.code.name] += 1
            per_listener[o.listener][o.code.name] += 1
            per_kind[o.kind.split(":")[0] if ":" not in o.kind else o.kind] += 1
        codes = sorted({c for counter in per_method.values() for c in counter})
        width = max(len(n) for n in per_method) + 2
        lines = ["method".ljust(width) + "total  " + "  ".join(codes)]
        for name in sorted(per_method):
            counter = per_method[name]
            lines.append(name.ljust(width) + f"{sum(counter.values()):5d}  " +
                         "  ".join(f"{counter[c]:{len(c)}d}" for c in codes))
        for listener in sorted(per_listener):
            counter = per_listener[listener]
            lines.append(f"listener {listener}".ljust(width) + f"{sum(counter.values()):5d}  " +
                         "  ".join(f"{counter[c]:{len(c)}d}" for c in codes))
        lines.append("by kind: " + ", ".join(f"{k} {v}" for k, v in sorted(per_kind.items())))
        timeouts = collections.Counter(o.method.name for o in self.outcomes if o.server_timeout)
        lines.append("DEADLINE_EXCEEDED from the request's own timeout: " +
                     (", ".join(f"{k} {v}" for k, v in sorted(timeouts.items())) or "none"))
        blocked = collections.Counter(o.method.name for o in self.outcomes if o.blocked)
        lines.append("blocked until the deadline (allowed for waits): " +
                     (", ".join(f"{k} {v}" for k, v in sorted(blocked.items())) or "none"))
        unparsed = collections.defaultdict(collections.Counter)
        for o in self.outcomes:
            if not o.parsed and not o.method.client_streaming:
                unparsed[o.code.name][o.method.path.split("/")[1]] += 1
        for code in sorted(unparsed):
            lines.append(f"{code} for requests that do not parse: " +
                         ", ".join(f"{k} {v}" for k, v in sorted(unparsed[code].items())))
        return "\n".join(lines)
