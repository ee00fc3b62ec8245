"""`python -m tpcheck run ...` — the tpcheck command line (same options, same exit codes).
`python -m tpcheck emulate -n N -- CMD ...` — torchrun-like launch on the `tpcheck`
torch.distributed backend (tpcheck/emulate/launcher.py, docs/EMULATE.md).

Under `torchrun --nproc_per_node=N -m tpcheck run --tp N --backend cuda ...` each process
is one rank: the NCCL id is shared through torch.distributed's store first.
"""

import sys

from . import _tpcheck
from ._launch import share_nccl_id_if_torchrun


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["emulate"]:  # the launcher (emulate/launcher.py, docs/EMULATE.md)
        from .emulate.launcher import main as emulate

        return emulate(args[1:])
    backend = "auto"
    for i, a in enumerate(args):
        if a == "--backend" and i + 1 < len(args):
            backend = args[i + 1]
        elif a.startswith("--backend="):
            backend = a.split("=", 1)[1]
    if args[:1] in ([], ["run"]) and backend in ("auto", "cuda"):
        share_nccl_id_if_torchrun()
    sys.stdout.flush()
    return _tpcheck.main(["tpcheck", *args])


if __name__ == "__main__":
    sys.exit(main())
