"""Start-up hook of `python -m tpcheck emulate` (its folder is put first on PYTHONPATH).

Python imports `sitecustomize` at start-up. This one imports nothing heavy: it installs an
import hook that, when (and only when) the program imports torch, patches it so that an
unchanged torchrun program runs on the `tpcheck` backend with several ranks per GPU
(docs/EMULATE.md lists every mapping):
  * once torch is imported, the backend is registered (tpcheck.emulate.register_backend()),
    so that `"tpcheck" in torch.distributed.Backend.backend_list` holds before the program
    makes a group;
  * init_process_group / new_group: the backend "nccl" (also inside "cuda:nccl,cpu:gloo"
    style strings) and the default (None) become "tpcheck"; "gloo" stays gloo.
    device_id=cuda:i becomes cuda:(i mod G), and is dropped without GPUs.
  * the GPUs a rank sees: with G GPUs present and N = LOCAL_WORLD_SIZE ranks, G < N,
    torch.cuda.device_count() answers N, and every GPU index i the program passes to
    set_device, get_device_properties (hence get_device_capability / _name),
    torch.cuda.device(i) and device_id= is GPU i mod G; with G >= N (or no GPU) the count
    is torch's own (logical_count, physical_index below).
After init_process_group it marks the rank initialized (a file of the launch), so that
the launcher can say at exit which ranks never initialized the process group.
A `sitecustomize` of the user's own further down sys.path is run afterwards.
"""

import os
import sys

# Tests only (machines without a GPU): the number of GPUs the hook takes as present.
PHYSICAL_GPUS_ENV = "TPCHECK_EMULATE_PHYSICAL_GPUS"
_count_gpus = None  # torch.cuda's own device_count, kept once the hook replaces it


def logical_count(physical: int, local_world: int) -> int:
    """torch.cuda.device_count() in a rank: N ranks of this host on G GPUs see max(G, N)
    (so a program that wants a GPU per local rank runs, each index mapping to i mod G);
    without GPUs, 0 (CPU ranks)."""
    return max(physical, local_world) if physical > 0 else 0


def physical_index(index: int, physical: int) -> int:
    """The GPU that GPU index `index` of the program runs on (physical > 0)."""
    return index % physical


def _local_world() -> int:
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def _gpus() -> int:
    """G: the GPUs present (torch's own count)."""
    text = os.environ.get(PHYSICAL_GPUS_ENV)
    if text:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{PHYSICAL_GPUS_ENV}={text!r}: expected a number of GPUs "
                             f"(it stands in for the GPUs present, in tests)") from None
    count = _count_gpus
    if count is None:
        import torch

        count = torch.cuda.device_count
    try:
        return count()
    except Exception:  # noqa: BLE001 - no driver
        return 0


def _map_backend(backend):
    if backend is None:
        return "tpcheck"
    b = str(backend)
    parts = []
    for p in b.split(","):
        if ":" in p:
            dev, name = p.split(":", 1)
            parts.append(f"{dev}:{'tpcheck' if name.strip().lower() == 'nccl' else name}")
        else:
            parts.append("tpcheck" if p.strip().lower() in ("nccl", "undefined") else p)
    return ",".join(parts)


def _map_device(dev):
    import torch

    if dev is None:
        return None
    d = torch.device(dev) if not isinstance(dev, int) else torch.device("cuda", dev)
    if d.type != "cuda":
        return d
    n = _gpus()
    if n == 0:
        return None
    return torch.device("cuda", physical_index(d.index or 0, n))


def _map_index(device):
    """A device argument of torch.cuda's per-GPU queries with its index mapped; None (the
    current GPU), other device types and negative indices pass unchanged."""
    import torch

    idx = None
    if isinstance(device, int) and not isinstance(device, bool):
        idx = device
    elif isinstance(device, (str, torch.device)):
        d = torch.device(device)
        idx = d.index if d.type == "cuda" else None
    n = _gpus()
    if idx is None or idx < 0 or n == 0:
        return device
    return physical_index(idx, n)


def _register():
    import tpcheck.emulate

    tpcheck.emulate.register_backend()


def _patch_torch(_m):
    """torch has finished importing: register the backend (init_process_group registers it
    again and reports what fails there, so a failure here is not fatal)."""
    try:
        _register()
    except Exception:  # noqa: BLE001 - reported by the patched init_process_group
        pass


def _patch_c10d(m):
    import functools

    orig_init, orig_new = m.init_process_group, m.new_group

    @functools.wraps(orig_init)
    def init_process_group(backend=None, *args, **kwargs):
        _register()
        if "device_id" in kwargs:
            kwargs["device_id"] = _map_device(kwargs["device_id"])
        out = orig_init(_map_backend(backend), *args, **kwargs)
        try:
            from tpcheck.emulate.protocol import mark_initialized

            mark_initialized(m.get_rank())
        except Exception:  # noqa: BLE001 - the mark is only for the launcher's message
            pass
        return out

    @functools.wraps(orig_new)
    def new_group(*args, **kwargs):
        _register()
        if kwargs.get("device_id") is not None:
            kwargs["device_id"] = _map_device(kwargs["device_id"])
        if len(args) >= 3:
            args = list(args)
            args[2] = _map_backend(args[2]) if args[2] is not None else None
        elif kwargs.get("backend") is not None:
            kwargs["backend"] = _map_backend(kwargs["backend"])
        return orig_new(*args, **kwargs)

    m.init_process_group, m.new_group = init_process_group, new_group


def _patch_cuda(m):
    """torch.cuda: the rank's view of the GPUs (the module's docstring)."""
    import functools

    global _count_gpus
    _count_gpus = m.device_count
    orig_set, orig_props, orig_device_init = m.set_device, m.get_device_properties, m.device.__init__

    @functools.wraps(_count_gpus)
    def device_count():
        return logical_count(_gpus(), _local_world())

    @functools.wraps(orig_set)
    def set_device(device):
        import torch

        d = _map_device(device if not isinstance(device, str) else torch.device(device))
        if d is None:
            return None
        return orig_set(d)

    # get_device_capability and get_device_name call this one (torch.cuda's own global), as
    # does torch's first CUDA initialisation, for every index below device_count().
    @functools.wraps(orig_props)
    def get_device_properties(device=None):
        return orig_props(_map_index(device))

    @functools.wraps(orig_device_init)
    def device_init(self, device):
        orig_device_init(self, device)
        n = _gpus()
        if n > 0 and isinstance(self.idx, int) and self.idx >= 0:
            self.idx = physical_index(self.idx, n)

    m.device_count, m.set_device, m.get_device_properties = device_count, set_device, get_device_properties
    m.device.__init__ = device_init


_PATCHES = {"torch": _patch_torch, "torch.distributed.distributed_c10d": _patch_c10d,
            "torch.cuda": _patch_cuda}


class _Hook:
    """A meta-path finder that runs a patch right after a module's code has run."""

    def find_spec(self, name, path=None, target=None):
        if name not in _PATCHES:
            return None
        import importlib.util

        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module
        patch = _PATCHES[name]

        def run(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = run
        return spec


if os.environ.get("TPCHECK_EMULATE") == "1":
    sys.meta_path.insert(0, _Hook())


def _chain():
    """Runs the next `sitecustomize` on sys.path (the user's), if there is one."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.origin and os.path.dirname(spec.origin) != here:
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)


_chain()
