"""collectived.torch.Store: a torch.distributed.Store backed by a collectived store, or by an
ordered list of them that outlives any one."""

import datetime
import threading
import time

import torch.distributed as dist

from collectived.errors import UnavailableError
from collectived.store import StoreClient, _to_bytes

# Between the two probes of a store that failed a call (as the sidecars probe a group's store).
_PROBE_INTERVAL_S = 0.05
_PROBE_KEY = "collectived/probe"


class Store(dist.Store):
    """A torch.distributed.Store whose keys live in a collectived store.

    ``address``: the sidecar (default: $COLLECTIVED_ADDRESS, else the default socket), or
    several sidecars' TCP addresses, comma-separated ("store-0:7490,node-1:7490,node-2:7490"):
    every write goes to each of them that answers and reads come from the first that answers,
    so the job's keys outlive the loss of any but the last; the same list given to every rank
    (and to a replacement) is also the group's store list, where the sidecars meet and where a
    shrinking group's store moves (docs/fault-tolerance.md). A store that fails a call as
    unreachable, and two probes 50 ms apart, is left for good.
    ``timeout``: the store's default timeout (timedelta; torch's default of 300 s).
    ``prefix``: namespace of every key. Works with torch 1.13 (whose C++ side calls set, get,
    add, compare_set and wait) and torch 2.x (which also calls check, delete_key, num_keys,
    multi_get, multi_set and append).
    """

    def __init__(self, address=None, timeout=datetime.timedelta(seconds=300), prefix=""):
        super().__init__()
        self.address = address  # as given (None: the local sidecar's)
        addresses = address.split(",") if address and "," in address else [address]
        if any(not a for a in addresses) or len(set(addresses)) != len(addresses):
            raise ValueError(f"collectived.torch.Store: store address list {address!r} has an "
                             "empty or repeated entry")
        self._clients = [StoreClient(a, timeout=None, prefix=prefix) for a in addresses]
        self._live = list(range(len(self._clients)))  # those not left, in order
        self._lock = threading.Lock()
        self.set_timeout(timeout)

    def _ms(self, timeout=None):
        timeout = self.timeout if timeout is None else timeout
        return int(timeout.total_seconds() * 1000)

    # -- the list: reads from the first live store, writes to every one --------------------

    def _answers(self, client):
        try:
            client.check([_PROBE_KEY])
            return True
        except UnavailableError:
            return False

    def _leave_if_lost(self, index):
        """Store ``index`` failed a call as unreachable: left unless a probe finds it answering
        after all."""
        client = self._clients[index]
        if self._answers(client):
            return
        time.sleep(_PROBE_INTERVAL_S)
        if self._answers(client):
            return
        with self._lock:
            if index in self._live:
                self._live.remove(index)

    def _read(self, call):
        if len(self._clients) == 1:
            return call(self._clients[0])
        last_error = None
        while True:
            with self._lock:
                index = self._live[0] if self._live else None
            if index is None:
                raise last_error or self._none_answers()
            try:
                return call(self._clients[index])
            except UnavailableError as error:
                last_error = error
                self._leave_if_lost(index)

    def _write(self, call):
        """``call`` on every live store; the first one's result."""
        if len(self._clients) == 1:
            return call(self._clients[0])
        with self._lock:
            live = list(self._live)
        results, last_error = [], None
        for index in live:
            try:
                results.append(call(self._clients[index]))
            except UnavailableError as error:
                last_error = error
                self._leave_if_lost(index)
        if not results:
            raise last_error or self._none_answers()
        return results[0]

    def _none_answers(self):
        return UnavailableError(f"collectived.torch.Store: no store of {self.address!r} answers")

    # -- torch.distributed.Store ------------------------------------------------------------

    def set(self, key, value):
        value = _to_bytes(value)
        self._write(lambda c: c.set(key, value))

    def get(self, key):
        return self._read(lambda c: c.get(key, timeout=self._ms() / 1000.0))

    def add(self, key, value):
        return self._write(lambda c: c.add(key, value))

    def compare_set(self, key, expected_value, desired_value):
        expected, desired = _to_bytes(expected_value), _to_bytes(desired_value)
        return self._write(lambda c: c.compare_set(key, expected, desired))

    def wait(self, keys, timeout=None):
        self._read(lambda c: c.wait(keys, timeout=self._ms(timeout) / 1000.0))

    def check(self, keys):
        return self._read(lambda c: c.check(keys))

    def delete_key(self, key):
        return self._write(lambda c: c.delete_key(key))

    def num_keys(self):
        return self._read(lambda c: c.num_keys())

    def multi_get(self, keys):
        return self._read(lambda c: c.multi_get(keys, timeout=self._ms() / 1000.0))

    def multi_set(self, keys, values):
        values = [_to_bytes(v) for v in values]
        self._write(lambda c: c.multi_set(keys, values))

    def append(self, key, value):
        value = _to_bytes(value)
        self._write(lambda c: c.append(key, value))
