"""StoreClient: the rendezvous store of a collectived sidecar, with c10d Store semantics."""

import datetime

import grpc

from collectived.address import resolve_address
from collectived.channel import open_channel
from collectived.errors import from_rpc_error
from collectived.v1 import store_pb2, store_pb2_grpc

# Extra time given to an RPC beyond the store timeout, so that an expired wait is reported by
# the sidecar (whose message names the keys) rather than by gRPC's deadline.
_DEADLINE_SLACK_S = 5.0
# Deadline of the calls that never wait (set, add, ...).
_CALL_DEADLINE_S = 60.0


def _to_bytes(value):
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (list, tuple)):  # torch 1.13 passes std::vector<uint8_t> as a list
        return bytes(value)
    raise TypeError(f"store values are bytes or str, got {type(value).__name__}")


def _to_millis(timeout):
    """None -> None (the store's default); timedelta or seconds -> int milliseconds."""
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        return int(timeout.total_seconds() * 1000)
    return int(float(timeout) * 1000)


class StoreClient:
    """A client of a collectived store. Thread-safe.

    ``address``: ``unix:///path`` or ``host:port`` (default: $COLLECTIVED_ADDRESS, else the
    default socket). ``timeout``: default timeout of blocking calls (timedelta or seconds;
    None = the sidecar's default; 0 = wait forever). ``prefix``: namespace for every key,
    joined with "/" as in c10d's PrefixStore. ``tls``: a ``TlsOptions`` for a TCP address
    (None: from $COLLECTIVED_TLS_*, see collectived.channel).
    """

    def __init__(self, address=None, timeout=None, prefix="", channel=None, tls=None):
        self.address = resolve_address(address)
        if channel is None:
            channel = open_channel(self.address, tls)
        self._channel = channel
        self._stub = store_pb2_grpc.StoreStub(channel)
        self._timeout_ms = _to_millis(timeout)
        self.prefix = prefix

    def with_prefix(self, prefix):
        """A view of the same store whose keys live under ``prefix``."""
        joined = f"{self.prefix}/{prefix}" if self.prefix else prefix
        view = StoreClient(self.address, None, joined, channel=self._channel)
        view._timeout_ms = self._timeout_ms
        return view

    def close(self):
        self._channel.close()

    # -- helpers ---------------------------------------------------------------------------

    def _key(self, key):
        if isinstance(key, bytes):
            key = key.decode()
        return f"{self.prefix}/{key}" if self.prefix else key

    def _timeout(self, timeout):
        ms = _to_millis(timeout)
        return self._timeout_ms if ms is None else ms

    def _call(self, method, request, what, timeout_ms=None, waits=False):
        if waits:
            deadline = None if timeout_ms == 0 else (
                (timeout_ms / 1000.0 + _DEADLINE_SLACK_S) if timeout_ms is not None else None)
        else:
            deadline = _CALL_DEADLINE_S
        try:
            return method(request, timeout=deadline)
        except grpc.RpcError as error:
            raise from_rpc_error(error, what) from None

    # -- c10d Store API ----------------------------------------------------------------------

    def set(self, key, value):
        self._call(self._stub.Set, store_pb2.StoreSetRequest(key=self._key(key),
                                                             value=_to_bytes(value)), "set")

    def get(self, key, timeout=None):
        """Returns the value of ``key`` (bytes), waiting until it exists."""
        ms = self._timeout(timeout)
        request = store_pb2.StoreGetRequest(key=self._key(key))
        if ms is not None:
            request.timeout_ms = ms
        return self._call(self._stub.Get, request, "get", ms, waits=True).value

    def add(self, key, amount):
        request = store_pb2.StoreAddRequest(key=self._key(key), delta=int(amount))
        return self._call(self._stub.Add, request, "add").value

    def compare_set(self, key, expected_value, desired_value):
        request = store_pb2.StoreCompareSetRequest(key=self._key(key),
                                                   expected=_to_bytes(expected_value),
                                                   desired=_to_bytes(desired_value))
        return self._call(self._stub.CompareSet, request, "compare_set").value

    def wait(self, keys, timeout=None):
        ms = self._timeout(timeout)
        request = store_pb2.StoreWaitRequest(keys=[self._key(k) for k in keys])
        if ms is not None:
            request.timeout_ms = ms
        self._call(self._stub.Wait, request, "wait", ms, waits=True)

    def check(self, keys):
        request = store_pb2.StoreCheckRequest(keys=[self._key(k) for k in keys])
        return self._call(self._stub.Check, request, "check").all_present

    def delete_key(self, key):
        request = store_pb2.StoreDeleteKeyRequest(key=self._key(key))
        return self._call(self._stub.DeleteKey, request, "delete_key").deleted

    def num_keys(self):
        """Number of keys in the whole store (every prefix), as c10d's PrefixStore reports."""
        return self._call(self._stub.NumKeys, store_pb2.StoreNumKeysRequest(), "num_keys").num_keys

    def multi_get(self, keys, timeout=None):
        ms = self._timeout(timeout)
        request = store_pb2.StoreMultiGetRequest(keys=[self._key(k) for k in keys])
        if ms is not None:
            request.timeout_ms = ms
        return list(self._call(self._stub.MultiGet, request, "multi_get", ms, waits=True).values)

    def multi_set(self, keys, values):
        if len(keys) != len(values):
            raise ValueError(f"multi_set: {len(keys)} keys but {len(values)} values")
        request = store_pb2.StoreMultiSetRequest(keys=[self._key(k) for k in keys],
                                                 values=[_to_bytes(v) for v in values])
        self._call(self._stub.MultiSet, request, "multi_set")

    def append(self, key, value):
        request = store_pb2.StoreAppendRequest(key=self._key(key), value=_to_bytes(value))
        self._call(self._stub.Append, request, "append")
