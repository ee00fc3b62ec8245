"""Point-to-point messages of a group, through the rendezvous store (a host copy: TP code
rarely sends). Message k from rank a to rank b with tag t is the store key
`tpcheck/p2p/a>b/t/k`: [header length: 8 bytes][JSON header: shapes, dtypes, call
site][the tensors' bytes]. The receiver deletes the key once read.
"""

from __future__ import annotations

import json

import torch

from .checks import accept_all, call_site, dtype_label
from .engine import CollectiveEngine
from .protocol import EmulateError
from .work import LazyWork


def _header(tensors: list) -> dict:
    return {"shapes": [list(t.shape) for t in tensors],
            "dtypes": [dtype_label(t.dtype) for t in tensors]}


class PointToPoint:
    def __init__(self, engine: CollectiveEngine):
        self._eng = engine
        self._sent: dict[tuple[int, int], int] = {}  # (peer, tag) -> messages so far
        self._received: dict[tuple[int, int], int] = {}

    @staticmethod
    def _next(counts: dict, key: tuple[int, int]) -> int:
        n = counts.get(key, 0)
        counts[key] = n + 1
        return n

    def send(self, tensors: list, dst: int, tag: int) -> None:
        accept_all(tensors, "send tensor")
        n = self._next(self._sent, (dst, tag))
        head = json.dumps(dict(_header(tensors), at=call_site())).encode()
        body = b"".join(t.detach().contiguous().cpu().view(torch.uint8).reshape(-1).numpy()
                        .tobytes() for t in tensors)
        self._eng.store.set(f"tpcheck/p2p/{self._eng.rank}>{dst}/{tag}/{n}",
                            len(head).to_bytes(8, "little") + head + body)

    def recv(self, tensors: list, src: int, tag: int) -> LazyWork:
        """A Work that receives into `tensors` when waited on."""
        accept_all(tensors, "recv tensor")
        n = self._next(self._received, (src, tag))
        key = f"tpcheck/p2p/{src}>{self._eng.rank}/{tag}/{n}"
        at = call_site()
        return LazyWork(lambda: self._receive(tensors, src, tag, key, at), tensors)

    def _receive(self, tensors: list, src: int, tag: int, key: str, at: str) -> None:
        eng = self._eng
        eng.watch.wait_keys([key], f"recv from {eng.who(src)} (tag {tag}) at {at}")
        data = eng.store.get(key)
        eng.store.delete_key(key)
        hl = int.from_bytes(data[:8], "little")
        head = json.loads(data[8:8 + hl])
        mine = _header(tensors)
        if head["shapes"] != mine["shapes"] or head["dtypes"] != mine["dtypes"]:
            raise EmulateError(
                f"send/recv mismatch: {eng.who(src)} sent {head['dtypes']} {head['shapes']} at "
                f"{head['at']}, {eng.who(eng.rank)} receives {mine['dtypes']} {mine['shapes']} "
                f"at {at}")
        off = 8 + hl
        for t in tensors:
            nb = t.numel() * t.element_size()
            buf = (torch.frombuffer(bytearray(data[off:off + nb]), dtype=torch.uint8) if nb
                   else torch.empty(0, dtype=torch.uint8))
            t.copy_(buf.view(t.dtype).view(t.shape))
            off += nb
