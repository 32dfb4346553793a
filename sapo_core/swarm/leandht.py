"""hivemind's DHT without torch, for a process that routes DHT traffic and trains nothing (the seed).

`from hivemind.dht.node import DHTNode` runs `hivemind/__init__.py` first, and that imports the
averager, the mixture-of-experts server and the optimizer, and torch with them: 280 MB of RSS
(146 MB of it torch's own heap) in a seed that only stores, returns and validates records. The DHT
node, its protocol, p2p and the validators need none of it; only two helpers of `hivemind.utils`
(`MPFuture`, `TensorDescriptor`, used by `hivemind.DHT` and the averager) import torch.

`use_dht_without_torch()` puts empty package modules for `hivemind`, `hivemind.utils` and
`hivemind.dht` in `sys.modules` (their `__init__` is not run), fills `hivemind.utils` with the
names of its torch-free submodules, and imports what the swarm code uses. Measured on hivemind
1.1.12: 38 MB instead of 281 MB for the same imports (docs/deploy.md, 'Memory').

It leans on hivemind's module layout, so it checks itself: anything that goes wrong undoes the
empty packages and says so, and the process imports hivemind the usual way (it works, only
heavier). `tests/test_seed.py` asserts a seed process never loads torch on the pinned hivemind.
"""

from __future__ import annotations

import importlib
import logging
import sys
import types

from sapo_core import leanimport

log = logging.getLogger(__name__)

_PACKAGES = ("hivemind", "hivemind.utils", "hivemind.dht")
# hivemind.utils' own __init__ exports these submodules' names (and MPFuture, TensorDescriptor: torch)
_UTILS_SUBMODULES = ("asyncio", "logging", "nested", "performance_ema", "serializer", "timed_storage")
# what sapo_core.swarm imports from hivemind (dht.py, joining.py, p2pd.py, netcheck.py, identity.py,
# validation.py)
_NEEDED = (
    "hivemind.dht.node",
    "hivemind.dht.routing",
    "hivemind.dht.validation",
    "hivemind.dht.crypto",
    "hivemind.p2p",
    "hivemind.proto.dht_pb2",
    "hivemind.utils.crypto",
    "hivemind.utils.multiaddr",
)


def is_lean() -> bool:
    """Whether this process's hivemind is the torch-free one."""
    return leanimport.is_lean("hivemind")


def use_dht_without_torch() -> bool:
    """Import hivemind's DHT without torch; call before anything imports hivemind.

    Returns whether the process now has the lean hivemind. False when hivemind was imported
    already (a node process: torch is there for training anyway) or when the lean import failed
    (logged; the usual import still works)."""
    if "hivemind" in sys.modules:
        return is_lean()
    root = leanimport.package_dir("hivemind")
    if root is None:
        return False  # not installed: the usual import says so where it is needed
    had_torch = "torch" in sys.modules
    try:
        leanimport.empty_packages("hivemind", root, _PACKAGES)
        utils = sys.modules["hivemind.utils"]
        for sub in _UTILS_SUBMODULES:
            module = importlib.import_module(f"hivemind.utils.{sub}")
            for attr in getattr(module, "__all__", None) or [a for a in vars(module) if not a.startswith("_")]:
                if not isinstance(getattr(module, attr), types.ModuleType):
                    setattr(utils, attr, getattr(module, attr))
        for name in _NEEDED:
            importlib.import_module(name)
        dht = sys.modules["hivemind.dht"]
        node, routing = sys.modules["hivemind.dht.node"], sys.modules["hivemind.dht.routing"]
        dht.DHTNode, dht.DHTID, dht.DHTValue = node.DHTNode, routing.DHTID, routing.DHTValue
        if not had_torch and "torch" in sys.modules:
            raise ImportError("torch was imported on the way (hivemind's layout changed)")
    except Exception as e:  # noqa: BLE001 (any failure: fall back to the usual import)
        leanimport.forget("hivemind")
        log.warning("the DHT without torch did not load (%s); importing all of hivemind instead", e)
        return False
    return True
