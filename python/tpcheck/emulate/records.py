"""The records of a group's collectives, exchanged through shared memory (/dev/shm).

Every collective starts with each rank publishing a record (kind, signature, the location
of its contribution, call site; engine.py) and reading every other rank's record of the same
call. Through the rendezvous store that would be several polled round trips per call, about
a millisecond, more than the GPU work of a large all-reduce. Instead each rank owns one
small file with two record slots (call s uses slot s % 2) and flags (the second rounds:
FLAG_REDUCED of a split all-reduce, FLAG_DONE of a zero-copy collective; each kind two, for
s % 2); peers map it read-only and poll it, which costs microseconds.

Slot layout: [seq: int64][length: int64][payload: a marshal-encoded dict, at most
SLOT_BYTES]; the writer writes the payload and length first, then seq. marshal, not JSON:
every rank decodes every rank's record of every call, and JSON's parsing is a visible part
of a call's host time at TP 8. The records hold only Python's built-in types, and every rank
runs the same interpreter (the launcher starts one command). The payload repeats seq, and a
reader only accepts a payload that decodes and names the call it waits for, so a torn read
(a writer still writing) is retried rather than trusted, whatever the CPU's memory order. A
record longer than a slot (a coalesced call over thousands of tensors) goes through the
store and the slot names its key.
Why two slots suffice: a rank writes slot s % 2 at call s only after it read every rank's
record of call s - 1, which each rank wrote after reading every record of call s - 2.
The ranks' file names are exchanged once through the store (the group's first collective).
"""

from __future__ import annotations

import marshal
import mmap
import os
import struct
import uuid

from . import protocol

SLOT_BYTES = 60 * 1024
_HEADER = 16
_SLOT = _HEADER + SLOT_BYTES
_FLAGS = 2 * _SLOT  # the int64 flags after the slots: kind k, call s at 2 k + s % 2
FLAG_REDUCED, FLAG_DONE = 0, 1
_SIZE = _FLAGS + 4 * 8


def encode_record(rec: dict) -> bytes:
    return marshal.dumps(rec, 4)  # format 4: read by every Python since 3.4


def decode_record(payload: bytes) -> dict:
    return marshal.loads(payload)


class RecordFile:
    """This rank's record slots and flags, and read access to every peer's."""

    def __init__(self, group_tag: str):
        self.path = protocol.group_file(group_tag, f"records-{uuid.uuid4().hex[:8]}")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, _SIZE)
            self._mm = mmap.mmap(fd, _SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        struct.pack_into("qqqq", self._mm, _FLAGS, -1, -1, -1, -1)
        for which in range(2):
            struct.pack_into("qq", self._mm, which * _SLOT, -1, 0)
        self._peers: list = []

    def close(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def open_peers(self, paths: list[str], me: int) -> None:
        self._peers = []
        for r, p in enumerate(paths):
            if r == me:
                self._peers.append(self._mm)
                continue
            fd = os.open(p, os.O_RDONLY)
            try:
                self._peers.append(mmap.mmap(fd, _SIZE, mmap.MAP_SHARED, mmap.PROT_READ))
            finally:
                os.close(fd)

    def fits(self, payload: bytes) -> bool:
        return len(payload) <= SLOT_BYTES

    def publish(self, seq: int, payload: bytes) -> None:
        """Writes this rank's record of call `seq` (encode_record of a dict holding "seq")."""
        off = (seq % 2) * _SLOT
        self._mm[off + _HEADER:off + _HEADER + len(payload)] = payload
        struct.pack_into("q", self._mm, off + 8, len(payload))
        struct.pack_into("q", self._mm, off, seq)

    def read(self, rank: int, seq: int):
        """Rank `rank`'s record of call `seq` (a dict), or None while it is not there."""
        mm = self._peers[rank]
        off = (seq % 2) * _SLOT
        if struct.unpack_from("q", mm, off)[0] != seq:
            return None
        n = struct.unpack_from("q", mm, off + 8)[0]
        if not 0 < n <= SLOT_BYTES:
            return None
        try:
            rec = decode_record(mm[off + _HEADER:off + _HEADER + n])
        except (ValueError, EOFError, TypeError):  # torn: the writer is still writing
            return None
        return rec if isinstance(rec, dict) and rec.get("seq") == seq else None

    def set_flag(self, kind: int, seq: int) -> None:
        struct.pack_into("q", self._mm, _FLAGS + (2 * kind + seq % 2) * 8, seq)

    def flag(self, kind: int, rank: int, seq: int) -> bool:
        at = _FLAGS + (2 * kind + seq % 2) * 8
        return struct.unpack_from("q", self._peers[rank], at)[0] == seq


class Records:
    """A group's record exchange: every rank's record of each call, and the second rounds.
    The record file is made, and the peers' mapped, at the group's first collective."""

    def __init__(self, store, rank: int, size: int, group_tag: str, watch):
        self._store, self._rank, self._size = store, rank, size
        self._tag, self._watch = group_tag, watch
        self._file = None

    def _record_file(self) -> RecordFile:
        if self._file is None:
            rf = RecordFile(self._tag)
            self._store.set(f"tpcheck/records/{self._rank}", rf.path)
            keys = [f"tpcheck/records/{r}" for r in range(self._size)]
            self._watch.wait_keys(keys, "the group's first collective (exchanging record files)")
            rf.open_peers([b.decode() for b in self._store.multi_get(keys)], self._rank)
            self._file = rf
        return self._file

    def exchange(self, seq: int, rec: dict, what: str) -> list[dict]:
        """Publishes this rank's record of call `seq`; returns every rank's."""
        rf = self._record_file()
        payload = encode_record(rec)
        if not rf.fits(payload):
            key = f"tpcheck/big/{seq}/{self._rank}"
            self._store.set(key, payload)
            payload = encode_record({"seq": seq, "store": key})
        rf.publish(seq, payload)
        recs: list = [None] * self._size

        def all_there() -> bool:
            for r in range(self._size):
                if recs[r] is None:
                    recs[r] = rf.read(r, seq)
                    if recs[r] is None:
                        return False
            return True

        self._watch.poll(all_there, what, lambda: self._watch.who_of(
            r for r in range(self._size) if recs[r] is None))
        for r, got in enumerate(recs):
            if "store" in got:
                recs[r] = decode_record(self._store.get(got["store"]))
        return recs

    def second_round(self, kind: int, seq: int, what: str) -> None:
        """Sets flag `kind` (FLAG_*) of call `seq` and waits until every rank has."""
        rf = self._record_file()
        rf.set_flag(kind, seq)
        self._watch.poll(lambda: all(rf.flag(kind, r, seq) for r in range(self._size)),
                         f"{what} (call #{seq} of the group, its second round)",
                         lambda: self._watch.who_of(
                             r for r in range(self._size) if not rf.flag(kind, r, seq)))

    def close(self) -> None:
        """Outside the launcher this rank removes its record file at exit."""
        if self._file is not None and not protocol.in_launch():
            self._file.close()
