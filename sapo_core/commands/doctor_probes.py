"""`sapo-node doctor`'s probes: each a Python snippet run in a child of this Python (so a native
crash or a hang is a failed check, not a dead doctor) that prints one JSON line, and the
`Check` a judge makes of what it saw (`doctor_judges.py`, `doctor_display.py`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

STATUSES = ("ok", "warn", "fail")


@dataclass(frozen=True)
class Check:
    """One line of the report. `fix` says what to do when status is not ok."""

    name: str
    status: str  # ok | warn | fail; only fail makes the doctor exit non-zero
    detail: str
    fix: str = ""
    seconds: float = 0.0

    def __post_init__(self) -> None:
        assert self.status in STATUSES, self.status


@dataclass(frozen=True)
class ProbeResult:
    """What a child Python did: its exit code (None if killed after the timeout) and output."""

    returncode: int | None
    stdout: str
    stderr: str
    seconds: float

    @property
    def payload(self) -> dict[str, Any] | None:
        """The JSON object on the child's last stdout line, if it got that far."""
        for line in reversed(self.stdout.strip().splitlines()):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            return value if isinstance(value, dict) else None
        return None

    def failure(self) -> str | None:
        """Why the child did not succeed, in words, or None if it did."""
        if self.returncode is None:
            return f"did not finish within {self.seconds:.0f} s (hung)"
        if self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = f"signal {-self.returncode}"
            return f"crashed with {name}"
        if self.returncode != 0 or self.payload is None:
            tail = [ln for ln in self.stderr.strip().splitlines() if ln.strip()]
            last = tail[-1].strip() if tail else f"exit code {self.returncode}"
            return f"failed: {last[:300]}"
        return None


def run_probe(code: str, args: list[str], timeout: float, env: dict[str, str] | None = None) -> ProbeResult:
    """Run `code` in a fresh child of this Python; never raises for what the child does."""
    start = time.perf_counter()
    child_env = dict(os.environ if env is None else env)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=child_env,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return ProbeResult(None, out, err, time.perf_counter() - start)
    return ProbeResult(proc.returncode, proc.stdout, proc.stderr, time.perf_counter() - start)


# --- probes: each runs in a child and prints one JSON line -------------------------------------

TORCH_PROBE = """
import json, math, torch
cuda = torch.cuda.is_available()
mps = bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()
device = "cuda" if cuda else ("mps" if mps else "cpu")
x = torch.randn(64, 64, device=device)
value = float((x @ x).abs().sum().item())
print(json.dumps({"version": torch.__version__, "cuda": torch.version.cuda, "cuda_available": cuda,
                  "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
                  "mps": mps, "device": device, "threads": torch.get_num_threads(),
                  "op_ok": math.isfinite(value)}))
"""

LLAMA_PROBE = """
import json, sys, time
import llama_cpp
t = time.perf_counter()
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=128, n_batch=32, n_threads=2, verbose=False)
loaded = time.perf_counter() - t
out = llm.create_completion("2+2=", max_tokens=1, temperature=0.0)
info = llama_cpp.llama_print_system_info().decode(errors="replace")
print(json.dumps({"version": llama_cpp.__version__, "text": out["choices"][0]["text"],
                  "load_s": loaded, "token_s": time.perf_counter() - t - loaded,
                  "gpu_offload": bool(llama_cpp.llama_supports_gpu_offload()), "system": info}))
"""

# What the node does first: the model de-quantized through the converted-model cache (a first
# start reads the cache the doctor fills; the installer runs the doctor), then one real step.
TRAINING_PROBE = """
import json, math, sys, time
from pathlib import Path
from sapo_core.policy import is_cached, load_base
gguf, cache = Path(sys.argv[1]), Path(sys.argv[2])
cached = is_cached(gguf, cache)
t = time.perf_counter()
model, tok = load_base(gguf, cache)
loaded = time.perf_counter() - t
t = time.perf_counter()
# gradients for the first block only: the backward still runs through every layer above it
first = [p for n, p in model.named_parameters() if ".layers.0." in n] or list(model.parameters())
model.requires_grad_(False)
for p in first:
    p.requires_grad_(True)
ids = tok("What is 2 + 2? The answer is 4.", return_tensors="pt").input_ids
loss = model(input_ids=ids, labels=ids).loss
loss.backward()
grad = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in first))
print(json.dumps({"cached": cached, "load_s": loaded, "step_s": time.perf_counter() - t,
                  "loss": float(loss), "grad_norm": grad}))
"""

DHT_PROBE = """
import json, time
import hivemind, hivemind.utils
t = time.perf_counter()
first = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
started = time.perf_counter() - t
maddrs = [str(m) for m in first.get_visible_maddrs()]
second = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=maddrs, start=True)
stored = first.store("sapo-doctor", b"ping", hivemind.utils.get_dht_time() + 30)
got = second.get("sapo-doctor", latest=True)
first.shutdown(); second.shutdown()
print(json.dumps({"version": hivemind.__version__, "start_s": started, "stored": bool(stored),
                  "read_back": got is not None and got.value == b"ping", "maddr": maddrs[0]}))
"""

# The two Qt checks are the app's own code (app/doctor_probe.py), run in the child like the rest:
# the engine's source never imports Qt.
QT_PROBE = "from app.doctor_probe import main; main('offscreen')"
DISPLAY_PROBE = "from app.doctor_probe import main; main('display')"
