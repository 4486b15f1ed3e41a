"""Stream signals: the words through which a session's CUDA collectives tell the trainer's
streams they are done (CollectiveRequest.stream_signal), so that ``Work.wait_stream`` enqueues a
wait on a word (cuStreamWaitValue32) instead of waiting on the CPU for the sidecar's response
that names an event. The twin of the C++ client's StreamSignalWords (the same rules):

- one buffer shared with the sidecar, a block of WORDS_PER_GROUP words per group; a group's ops
  take values 1, 2, 3, ... in issue order, op v the word v % WORDS_PER_GROUP;
- the sidecar writes an op's word when it succeeded (on its stream, after the op's work); the
  client writes it when the op completes, whatever the outcome, so that no stream waits forever;
- a word goes to a new op only once its previous op completed successfully, and a group that saw
  a failure takes no more words (an aborted stream may still write late): its ops wait on the
  CPU (the event path);
- a block returns once its group is forgotten with nothing in flight, and its next group goes on
  from the values it reached: a word only moves forward, so a wait still queued on an old value
  stays satisfied.
"""

import ctypes
import threading

WORDS_PER_GROUP = 256
BUFFER_BYTES = 64 * WORDS_PER_GROUP * 4  # 64 groups, as the C++ client


class Assigned:
    __slots__ = ("block", "offset", "value", "address")

    def __init__(self, block, offset, value, address):
        self.block, self.offset, self.value, self.address = block, offset, value, address


class _Block:
    __slots__ = ("next_value", "in_flight", "busy", "failed", "forgotten")

    def __init__(self):
        self.next_value = 1
        self.in_flight = 0
        self.busy = bytearray(WORDS_PER_GROUP)
        self.failed = False
        self.forgotten = False


class StreamSignalWords:
    """Words at ``address`` (``count`` of them, a multiple of WORDS_PER_GROUP, zeroed; memory
    the caller keeps mapped). Thread-safe."""

    def __init__(self, address, count):
        self._address = address
        self._lock = threading.Lock()
        self._blocks = [_Block() for _ in range(count // WORDS_PER_GROUP)]
        self._free = list(range(len(self._blocks) - 1, -1, -1))  # block 0 first
        self._groups = {}
        self._disabled = False

    def assign(self, group):
        """The word and value of ``group``'s next op (an Assigned), or None when it gets none."""
        with self._lock:
            if self._disabled:
                return None
            index = self._groups.get(group)
            if index is None:
                if not self._free:
                    return None
                index = self._free.pop()
                self._groups[group] = index
            block = self._blocks[index]
            value = block.next_value
            slot = value % WORDS_PER_GROUP
            if block.failed or block.busy[slot]:
                return None
            block.busy[slot] = 1
            block.in_flight += 1
            block.next_value = (value + 1) & 0xFFFFFFFF
            offset = (index * WORDS_PER_GROUP + slot) * 4
            return Assigned(index, offset, value, self._address + offset)

    def completed(self, assigned, succeeded):
        """An op that was assigned completed: its word is set to its value."""
        with self._lock:
            ctypes.c_uint32.from_address(assigned.address).value = assigned.value
            block = self._blocks[assigned.block]
            block.busy[assigned.value % WORDS_PER_GROUP] = 0
            block.in_flight -= 1
            block.failed = block.failed or not succeeded
            self._maybe_return(assigned.block)

    def forget(self, group):
        """The group is destroyed: its block returns once none of its ops is out."""
        with self._lock:
            index = self._groups.pop(group, None)
            if index is not None:
                self._blocks[index].forgotten = True
                self._maybe_return(index)

    def cancel(self, assigned):
        """An op that was assigned never reached the sidecar: its word is set and free again."""
        self.completed(assigned, True)

    def disable(self):
        """No op gets a word from now on (the driver refused to wait on one)."""
        with self._lock:
            self._disabled = True

    def free_blocks(self):
        with self._lock:
            return len(self._free)

    def _maybe_return(self, index):
        block = self._blocks[index]
        # A failed group's block never returns: a late write of an aborted stream could land in it.
        if not block.forgotten or block.in_flight or block.failed:
            return
        # The words keep their values and the next group goes on from next_value: a stream may
        # still have a wait on an old value queued, which a cleared word would never satisfy.
        block.forgotten = False
        self._free.append(index)
