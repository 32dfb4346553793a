"""The node identity: key file, peer id, readable name, export/import and `sapo-node identity`."""

from __future__ import annotations

import os
import stat

import pytest

from sapo_core.cli import main as sapo_node
from sapo_core.swarm.identity import (
    IdentityError,
    export_identity,
    import_identity,
    load_identity,
    load_or_create_identity,
    node_name,
)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_created_once_owner_only_and_stable(tmp_path):
    path = tmp_path / "id" / "node.key"
    first = load_or_create_identity(path)
    assert first.fresh and path.exists()
    if os.name == "posix":
        assert _mode(path) == 0o600
    again = load_or_create_identity(path)
    assert not again.fresh
    assert again.peer_id == first.peer_id and again.name == first.name
    assert first.peer_id.startswith("Qm")  # sha2-256 multihash in base58, as libp2p prints RSA ids


def test_peer_id_is_the_one_libp2p_derives(tmp_path):
    """p2pd reads this file as `-id`: our peer id must be the one it will announce."""
    from hivemind.p2p import PeerID

    identity = load_or_create_identity(tmp_path / "node.key")
    assert PeerID.from_identity(identity.path.read_bytes()).to_base58() == identity.peer_id


def test_hivemind_key_is_this_key_not_the_process_wide_one(tmp_path):
    from hivemind.utils.crypto import RSAPrivateKey

    from sapo_core.swarm.identity import peer_id_of_ssh_key

    a = load_or_create_identity(tmp_path / "a.key")
    b = load_or_create_identity(tmp_path / "b.key")
    ka, kb = a.hivemind_key(), b.hivemind_key()
    assert peer_id_of_ssh_key(ka.get_public_key().to_bytes()) == a.peer_id
    assert peer_id_of_ssh_key(kb.get_public_key().to_bytes()) == b.peer_id
    shared = RSAPrivateKey.process_wide().get_public_key().to_bytes()
    assert ka.get_public_key().to_bytes() != shared
    assert ka.get_public_key().verify(b"data", ka.sign(b"data"))
    assert not kb.get_public_key().verify(b"data", ka.sign(b"data"))


def test_names_are_stable_and_differ():
    assert node_name("QmA") == node_name("QmA")
    names = {node_name(f"Qm{i}") for i in range(200)}
    assert len(names) == 200
    assert all(len(n.split("-")) == 3 for n in names)


@pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")
def test_key_readable_by_others_is_refused(tmp_path):
    path = tmp_path / "node.key"
    load_or_create_identity(path)
    os.chmod(path, 0o644)
    with pytest.raises(IdentityError, match="chmod 600"):
        load_identity(path)


@pytest.mark.parametrize("blob", [b"", b"not a key at all", b"\x08\x01\x12\x03abc", b"\x08\x00\x12\x05ab"])
def test_junk_key_files_are_refused_with_a_reason(tmp_path, blob):
    path = tmp_path / "node.key"
    path.write_bytes(blob)
    os.chmod(path, 0o600)
    with pytest.raises(IdentityError):
        load_identity(path)


def test_missing_identity_says_how_to_make_one(tmp_path):
    with pytest.raises(IdentityError, match="identity import"):
        load_identity(tmp_path / "none.key")


def test_export_then_import_elsewhere_keeps_the_peer_id(tmp_path):
    original = load_or_create_identity(tmp_path / "a" / "node.key")
    backup = export_identity(original, tmp_path / "backup.key")
    if os.name == "posix":
        assert _mode(backup) == 0o600
    with pytest.raises(IdentityError, match="--force"):
        export_identity(original, backup)
    restored = import_identity(backup, tmp_path / "b" / "node.key")
    assert restored.peer_id == original.peer_id
    # importing the same key again is a no-op, a different one needs --force
    assert import_identity(backup, restored.path).peer_id == original.peer_id
    other = load_or_create_identity(tmp_path / "other.key")
    with pytest.raises(IdentityError, match="another identity"):
        import_identity(other.path, restored.path)
    assert import_identity(other.path, restored.path, overwrite=True).peer_id == other.peer_id


def test_import_checks_before_writing(tmp_path):
    bad = tmp_path / "bad.key"
    bad.write_bytes(b"junk")
    with pytest.raises(IdentityError):
        import_identity(bad, tmp_path / "node.key")
    assert not (tmp_path / "node.key").exists()


def test_command_show_export_import(tmp_path, capsys):
    key = tmp_path / "node.key"
    assert sapo_node(["identity", "--path", str(key)]) == 1
    assert "show --create" in capsys.readouterr().err
    assert sapo_node(["identity", "--path", str(key), "show", "--create", "--json"]) == 0
    shown = capsys.readouterr().out
    identity = load_identity(key)
    assert identity.peer_id in shown and identity.name in shown
    backup = tmp_path / "backup.key"
    assert sapo_node(["identity", "--path", str(key), "export", str(backup)]) == 0
    assert sapo_node(["identity", "--path", str(key), "export", str(backup)]) == 1
    assert "--force" in capsys.readouterr().err
    other = tmp_path / "other" / "node.key"
    assert sapo_node(["identity", "--path", str(other), "import", str(backup)]) == 0
    assert load_identity(other).peer_id == identity.peer_id


def test_command_reads_identity_path_from_config(tmp_path, capsys):
    key = tmp_path / "configured.key"
    config = tmp_path / "node.toml"
    config.write_text(f'[swarm]\nidentity_path = "{key}"\n')
    assert sapo_node(["identity", "--config", str(config), "show", "--create"]) == 0
    assert str(key) in capsys.readouterr().out and key.exists()
