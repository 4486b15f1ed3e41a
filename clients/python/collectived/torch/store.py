"""collectived.torch.Store: a torch.distributed.Store backed by a collectived store."""

import datetime

import torch.distributed as dist

from collectived.store import StoreClient, _to_bytes

class Store(dist.Store):
    """A torch.distributed.Store whose keys live in a collectived store.

    ``address``: the sidecar (default: $COLLECTIVED_ADDRESS, else the default socket).
    ``timeout``: the store's default timeout (timedelta; torch's default of 300 s).
    ``prefix``: namespace of every key. Works with torch 1.13 (whose C++ side calls set, get,
    add, compare_set and wait) and torch 2.x (which also calls check, delete_key, num_keys,
    multi_get, multi_set and append).
    """

    def __init__(self, address=None, timeout=datetime.timedelta(seconds=300), prefix=""):
        super().__init__()
        self.address = address  # as given (None: the local sidecar's)
        self._client = StoreClient(address, timeout=None, prefix=prefix)
        self.set_timeout(timeout)

    def _ms(self, timeout=None):
        timeout = self.timeout if timeout is None else timeout
        return int(timeout.total_seconds() * 1000)

    def set(self, key, value):
        self._client.set(key, _to_bytes(value))

    def get(self, key):
        return self._client.get(key, timeout=self._ms() / 1000.0)

    def add(self, key, value):
        return self._client.add(key, value)

    def compare_set(self, key, expected_value, desired_value):
        return self._client.compare_set(key, _to_bytes(expected_value), _to_bytes(desired_value))

    def wait(self, keys, timeout=None):
        self._client.wait(keys, timeout=self._ms(timeout) / 1000.0)

    def check(self, keys):
        return self._client.check(keys)

    def delete_key(self, key):
        return self._client.delete_key(key)

    def num_keys(self):
        return self._client.num_keys()

    def multi_get(self, keys):
        return self._client.multi_get(keys, timeout=self._ms() / 1000.0)

    def multi_set(self, keys, values):
        self._client.multi_set(keys, [_to_bytes(v) for v in values])

    def append(self, key, value):
        self._client.append(key, _to_bytes(value))
