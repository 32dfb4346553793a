"""What several test modules share, apart from fixtures (those live in conftest.py): the light
node's config and environment, the swarm tests' recording hooks and made-up groups, raw records
sent the way an attacker would, and a run directory as a trained node leaves it.

Test modules import it as `from helpers import ...` (pytest puts tests/ on the path);
tests/nat_node.py, run as `python -m tests.nat_node`, imports `tests.helpers`. It imports only
light modules at the top, so an app test that imports it does not load torch, hivemind or
reasoning-gym.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
import weakref
from pathlib import Path

from sapo_core.config import NodeConfig, TaskConfig
from sapo_core.hooks import NullHooks
from sapo_core.logs import level_name
from sapo_core.rollouts import Completion, Group

# --- the light node: what the control and app tests start as a real process -----------------------


def light_config(run_dir: str | Path, max_new_tokens: int = 16, **changes) -> NodeConfig:
    """A real node process on the tiny-random test model (random weights, the transformers
    sampler), one group of two short completions per round, swarm off, so a round takes about a
    second and the tests exercise the process, not the model. `changes` are dotted config keys
    ("train.kl_beta")."""
    base = {
        "model.name": "tiny-random",
        "sampler.backend": "transformers",
        "swarm.enabled": False,
        "round.local_groups": 1,
        "round.external_groups": 0,
        "sampler.group_size": 2,
        "sampler.max_new_tokens": max_new_tokens,
        "round.auto_scale": False,
        "run_dir": str(run_dir),
        "eval.enabled": False,
    }  # a random model's held-out evaluation would only slow the process tests
    return NodeConfig().replace(**{**base, **changes})


def light_env(tmp_path: Path, tmp_path_factory) -> dict[str, str]:
    """A node process's environment: a fresh data directory per test, one converted-model cache
    for the whole session."""
    return {
        **os.environ,
        "SAPO_DATA_DIR": str(tmp_path / "data"),
        "SAPO_CACHE_DIR": str(tmp_path_factory.getbasetemp() / "sapo-cache"),
    }


# --- the swarm tests: hooks that keep the log, groups with signal, raw records ---------------------


class _Recorder(logging.Handler):
    """Hands sapo_core's log records to every RecordingHooks alive (the records do not say which
    node of this process wrote them)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.hooks: weakref.WeakSet[RecordingHooks] = weakref.WeakSet()

    def emit(self, record: logging.LogRecord) -> None:
        for hooks in list(self.hooks):
            hooks.lines.append((level_name(record.levelno), record.getMessage()))


_recorder = _Recorder()


class RecordingHooks(NullHooks):
    """Round hooks that also keep the log lines of this process's swarm nodes from now on."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []
        logger = logging.getLogger("sapo_core")
        if _recorder not in logger.handlers:
            logger.addHandler(_recorder)
        if logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)
        _recorder.hooks.add(self)

    def text(self) -> str:
        return "\n".join(m for _, m in self.lines)


def honest_groups(seed: int, round: int, n: int = 3) -> list[Group]:
    """n groups with signal: the right answer in some completions, a wrong one in the rest."""
    from sapo_core.tasks import TaskSet  # imports reasoning-gym: a second the app tests need not pay

    tasks = TaskSet(TaskConfig(), seed=seed)
    out = []
    for k, q in enumerate(tasks.sample_questions(round, n)):
        right = [f"Answer: {q.answer}", f"The answer is {q.answer}", f"answer = {q.answer}"]
        texts = right[: 1 + k % 3] + ["Answer: -98765", "The answer is -98765", "answer = -98765"]
        group = Group(q, [Completion(t, token_ids=[1, 2], reward=9.0) for t in texts], round=round)
        out.append(group)
    return out


def altered_groups(groups: list[Group]) -> list[Group]:
    """The same groups with each question's text changed: a signed record only a hostile node
    sends (refused as `text_mismatch`)."""
    out = []
    for g in groups:
        out.append(dataclasses.replace(g, question=dataclasses.replace(g.question, text=g.question.text + "?")))
    return out


def scrape_metrics(url: str) -> tuple[str, dict[str, dict[tuple, float]], str]:
    """A scrape of a page's /metrics on loopback, read by prometheus_client's own parser: (its
    content type, {sample name: {labels as a sorted tuple: value}}, its text)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=10) as r:
        kind, text = r.headers["Content-Type"], r.read().decode()
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return kind, samples, text


def attacker_store(attacker, targets, key: str, value: bytes, subkey: bytes, expiration: float) -> list:
    """Send raw (already signed or not) bytes straight to storage nodes, skipping every check
    an honest node would make before storing."""
    from hivemind.dht.routing import DHTID
    from hivemind.p2p import PeerID

    async def send():
        out = []
        for t in targets:
            out.append(
                await attacker.dht._node.protocol.call_store(
                    PeerID.from_base58(t.node_id),
                    keys=[DHTID.generate(source=key)],
                    values=[value],
                    expiration_time=[expiration],
                    subkeys=[subkey],
                )
            )
        return out

    return attacker.dht._call(send(), timeout=30)


def signed_record(key: str, payload, owner_key, signer_key, expiration: float) -> tuple[bytes, bytes]:
    """(value, subkey) exactly as hivemind signs a record, but signed by `signer_key`."""
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord
    from hivemind.utils import MSGPackSerializer

    from sapo_core.swarm.validation import owner_tag

    subkey = owner_tag(owner_key.get_public_key().to_bytes())
    record = DHTRecord(
        DHTID.generate(source=key).to_bytes(),
        MSGPackSerializer.dumps(subkey),
        MSGPackSerializer.dumps(payload),
        expiration,
    )
    signature = signer_key.sign(MSGPackSerializer.dumps(dataclasses.astuple(record)))
    return record.value + b"[signature:" + signature + b"]", subkey


# --- a run directory as a trained node leaves it (export and Try it tests) --------------------------

RUN_MODEL_ID = "smollm2-135m-instruct"
RUN_ROUNDS = 3


def make_run(run_dir: Path, eval_figures: bool = True) -> None:
    """A run directory as the node leaves it after RUN_ROUNDS rounds, with a non-zero adapter."""
    import torch

    from sapo_core import paths
    from sapo_core.checkpoint import Checkpoints, CheckpointState
    from sapo_core.config import dump_config
    from sapo_core.modelfiles import embedded_gguf_path
    from sapo_core.policy import load_policy
    from sapo_core.store import STORE_NAME, RunStore

    cfg = NodeConfig().replace(**{"model.name": RUN_MODEL_ID, "run_dir": str(run_dir), "sampler.max_new_tokens": 64})
    policy = load_policy(cfg.model, embedded_gguf_path(), paths.converted_models_dir(), seed=1, model_id=RUN_MODEL_ID)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(dump_config(cfg), encoding="utf-8")
    Checkpoints(run_dir).save(
        CheckpointState(round=RUN_ROUNDS, model_id=RUN_MODEL_ID, lora_rank=policy.lora_rank, policy_version=RUN_ROUNDS),
        policy.trainable_state_dict(),
        {},
    )
    store = RunStore(run_dir / STORE_NAME)
    t = time.time() - 600
    for r in range(1, RUN_ROUNDS + 1):
        m = {
            "groups/local": 4.0,
            "groups/trained": 5.0,
            "groups/external": 2.0,
            "round/group_size": 8.0,
            "swarm/peers": 3.0,
            "cpu/seconds": 90.0,
        }
        if eval_figures and r in (1, RUN_ROUNDS):
            m.update(
                {
                    "eval/solve_rate": 0.1 if r == 1 else 0.27,
                    "eval/solve_rate_base": 0.1,
                    "eval/gain": 0.0 if r == 1 else 0.17,
                    "eval/gain_ci_low": 0.1,
                    "eval/gain_ci_high": 0.24,
                }
            )
        store.record_round(r, m, started=t + 100 * r, ended=t + 100 * r + 90)
    store.close()


def tiny_random_policy(seed: int = 0, cache_dir: Path | None = None):
    """The tiny-random model with a LoRA adapter and the embedded model's real tokenizer, loaded as
    the node loads a policy (`cache_dir`: where the tokenizer is cached; default the node's)."""
    from sapo_core import modelfiles, paths
    from sapo_core.config import ModelConfig
    from sapo_core.policy import load_policy

    return load_policy(
        ModelConfig(name="tiny-random"),
        None,
        cache_dir or paths.converted_models_dir(),
        seed=seed,
        tokenizer_gguf=modelfiles.embedded_gguf_path(),
    )


ATTENTION_AND_DOWN = ("q_proj", "k_proj", "v_proj", "o_proj", "down_proj")  # LoRA on both kinds of Linear


def tiny_llama(
    seed=0, vocab=97, lora_modules=("q_proj", "v_proj"), init_lora_weights=False, use_rslora=False, **config
):
    """A real transformers Llama, 2 layers of width 32, drawn from `seed`; with a peft LoRA adapter
    (r 4, alpha 8) on `lora_modules` unless that is empty. `config` overrides LlamaConfig's fields."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        **config,
    )
    model = LlamaForCausalLM(cfg)
    if not lora_modules:
        return model
    lora = LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=list(lora_modules),
        init_lora_weights=init_lora_weights,
        use_rslora=use_rslora,
    )
    return get_peft_model(model, lora)


def sequences():
    """Train sequences for the small policy: two groups sharing their prompts (3 and 2 completions)
    and one alone, of mixed lengths (tests/test_trainer.py, tests/test_trained_layers.py)."""
    import torch

    from sapo_core.microbatch import TrainSequence

    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 97, (n,), generator=g).tolist() for n in (4, 3, 5)]
    out = []
    for i, (group, adv) in enumerate(zip([0, 0, 0, 1, 1, 2], [1.5, -0.5, -0.5, -0.5, 0.7, 0.3])):
        c = torch.randint(1, 97, (2 + i,), generator=g).tolist()
        out.append(TrainSequence(prompts[group], c, adv))
    return out


def small_policy(seed=0, vocab=97):
    """A real transformers LlamaForCausalLM with a peft LoRA adapter, only small; the tokenizer
    is reduced to the one attribute the trainer reads (pad_token_id)."""
    from types import SimpleNamespace

    from sapo_core.policy import Policy

    return Policy(
        model=tiny_llama(seed, vocab),
        tokenizer=SimpleNamespace(pad_token_id=0),
        model_id="small",
        gguf_path=None,
        lora=True,
        lora_rank=4,
        lora_alpha=8,
    )


def self_signed_tls(where: Path, host: str = "127.0.0.1") -> tuple[Path, Path]:
    """A self-signed certificate for an IP address and its key, written to `where`:
    (cert.pem, key.pem), for the HTTPS servers tests serve signed swarm lists from."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    pkey = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(pkey.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(pkey, hashes.SHA256())
    )
    cert_path, key_path = Path(where) / "cert.pem", Path(where) / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem, pkcs8 = serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8
    key_path.write_bytes(pkey.private_bytes(pem, pkcs8, serialization.NoEncryption()))
    return cert_path, key_path


@contextlib.contextmanager
def https_files(root: Path, tls_dir: Path):
    """An HTTPS server on 127.0.0.1 serving the files in `root` with a certificate made in
    `tls_dir`: yields (base URL, a client SSL context that trusts that certificate and nothing else)."""
    import http.server
    import ssl
    import threading

    self_signed_tls(tls_dir)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(root), **kw)

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tls_dir / "cert.pem", tls_dir / "key.pem")
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield (
            f"https://127.0.0.1:{httpd.server_address[1]}",
            ssl.create_default_context(cafile=str(tls_dir / "cert.pem")),
        )
    finally:
        httpd.shutdown()
        httpd.server_close()


def release_tarball(version: str, launcher: bool = True, extra: dict[str, bytes] | None = None) -> bytes:
    """A release package as the build writes it: one top folder with the launcher in it
    (sapo_core/updates.py), and `extra` files by their paths in the archive."""
    import io
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        files = {f"sapo-swarm-{version}/lib/core.txt": f"core {version}\n".encode(), **(extra or {})}
        if launcher:
            files[f"sapo-swarm-{version}/sapo-swarm"] = b"#!/bin/sh\necho " + version.encode() + b"\n"
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


UPDATE_KEYS = ("root1", "root2", "root3", "targets", "snapshot", "timestamp", "timestamp2")


def update_keys(folder: Path) -> dict:
    """Signers for an update repository, from key files `update_repo.generate_key` writes in
    `folder`: three root keys, one per online role, and a second timestamp key to rotate to."""
    from sapo_core.update_repo import generate_key, load_signer

    for name in UPDATE_KEYS:
        generate_key(folder / f"{name}.pem")
    return {name: load_signer(folder / f"{name}.pem") for name in UPDATE_KEYS}


def update_repository(folder: Path, keys: dict, **options):
    """A TUF update repository in `folder` as the project makes one (root version 1: three root
    keys, two of them signing; one key for each online role) and the root a copy ships:
    (Repository, root bytes). `options`: Repository's clock and lifetimes."""
    from sapo_core.update_repo import ONLINE, Repository

    repo = Repository(folder, **options)
    roots = [keys[f"root{i}"].public_key for i in (1, 2, 3)]
    repo.init(roots, 2, {role: keys[role].public_key for role in ONLINE}, [keys["root1"], keys["root2"]])
    return repo, (repo.metadata / "1.root.json").read_bytes()


def publish_release(repo, keys: dict, version: str, notes: str = "Faster rounds.", served=None) -> Path:
    """Release `version` (a tarball as release_tarball makes it) in `repo`, signed by `keys`'
    online roles. `served(package) -> bytes`: what the server then holds instead (a package
    damaged on the wire). Returns the served file."""
    import hashlib

    from sapo_core.update_repo import ONLINE

    package = release_tarball(version)
    file = repo.folder.parent / f"upload-{repo.folder.name}" / f"sapo-swarm-{version}-linux-x86_64.tar.gz"
    file.parent.mkdir(exist_ok=True)
    file.write_bytes(package)
    repo.release(version, notes, {"linux-x86_64-tar": file}, {role: keys[role] for role in ONLINE})
    on_server = repo.targets / f"{hashlib.sha256(package).hexdigest()}.{file.name}"
    if served is not None:
        on_server.write_bytes(served(package))
    return on_server
