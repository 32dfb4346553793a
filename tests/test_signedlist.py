"""The swarm list that updates itself (swarm/signedlist.py), fetched from a real HTTPS server on
loopback with its own certificate: good, unsigned, wrongly signed, altered, oversized, malformed
and replayed lists, and the maintainer's commands."""

from __future__ import annotations

import base64
import ssl
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sapo_core.cli import main as cli_main
from sapo_core.config import ConfigError, SwarmConfig
from sapo_core.swarm.signedlist import MAX_LIST_BYTES, SIGNATURE_PREFIX, parse_keys
from sapo_core.swarm.signedlist import load_last_good as _load_last_good
from sapo_core.swarm.swarmlist import load_swarms, parse_swarms
from sapo_core.swarm.swarmlist import sign_swarm_list as sign_list
from sapo_core.swarm.swarmlist import update_swarm_list as update


def load_last_good(path, keys):
    return _load_last_good(path, keys, check=parse_swarms)


PEER = "/dns/seed.example.org/tcp/31330/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"


def _list(version: int, name: str = "public-a", peers: tuple[str, ...] = (PEER,)) -> str:
    boot = ", ".join(f'"{p}"' for p in peers)
    return (
        f'# the project\'s swarms\nversion = {version}\n\n[[swarm]]\nname = "{name}"\n'
        f'description = "a test swarm"\nbootstrap = [{boot}]\nwindow_seconds = 300.0\nshards = 16\n'
    )


def _publish(server, name: str, data: str | bytes) -> str:
    (server["root"] / name).write_bytes(data.encode() if isinstance(data, str) else data)
    return f"{server['url']}/{name}"


def test_a_signed_list_is_accepted_kept_and_used_then_a_bad_one_changes_nothing(
    server, key, keys, tmp_path, monkeypatch
):
    monkeypatch.setattr("sapo_core.swarm.signedlist.shipped_keys", lambda: keys)  # a release that ships our key
    stored = tmp_path / "swarms.signed.toml"
    good = _publish(server, "v2.toml", sign_list(_list(2), key))
    result = update([good], keys, stored, context=server["context"])
    assert result.accepted is not None and result.accepted.version == 2 and not result.refused
    assert [e.name for e in result.accepted.entries] == ["public-a"]
    assert load_last_good(stored, keys).version == 2
    kept = stored.read_bytes()
    names = {e.name: e for e in load_swarms(user_path=tmp_path / "none.toml", signed_path=stored)}
    assert names["public-a"].bootstrap == [PEER] and "local-example" in names  # the shipped one too

    signed = sign_list(_list(3, name="public-b"), key)
    body, line = signed.rstrip("\n").rsplit("\n", 1)
    other = Ed25519PrivateKey.generate()
    cases = {
        "unsigned": (_list(3), "is not signed"),
        "unknown-key": (sign_list(_list(3), other), "not one this node trusts"),
        "altered": (signed.replace("public-b", "public-c"), "signature does not match"),
        "forged": (body + "\n" + line[:-8] + "AAAAAAA=\n", "signature does not match"),
        "oversized": (signed + "#" * MAX_LIST_BYTES, "larger than 256 KiB"),
        "replayed": (sign_list(_list(1), key), "older than the version 2"),
        "malformed": (_signed_anyway(key, 'version = 3\n[[swarm]]\nname = "bad name!"\n'), "name"),
        "no-version": (_signed_anyway(key, _list(3).replace("version = 3\n", "")), "has no version"),
        "not-utf8": (b"\xff\xfe" + signed.encode(), "not UTF-8"),
    }
    for case, (data, says) in cases.items():
        result = update([_publish(server, f"{case}.toml", data)], keys, stored, context=server["context"])
        assert result.accepted is None and len(result.refused) == 1 and says in result.refused[0], (case, result)
        assert result.kept.version == 2 and stored.read_bytes() == kept, case  # nothing changed
        assert result.lines()[-1] == "kept the swarm list of version 2"
    # unreachable, plain http, and a server whose certificate we do not trust: refused the same way
    for url, says in [
        (f"{server['url']}/missing.toml", "could not fetch"),
        ("http://127.0.0.1:9/list.toml", "only https"),
    ]:
        assert says in update([url], keys, stored, context=server["context"]).refused[0]
    untrusted = update([good], keys, stored, context=ssl.create_default_context())
    assert "could not fetch" in untrusted.refused[0] and "CERTIFICATE" in untrusted.refused[0].upper()
    # the first URL that serves a good list wins; a newer version replaces the kept one
    newer = _publish(server, "v3.toml", signed)
    result = update([f"{server['url']}/missing.toml", newer], keys, stored, context=server["context"])
    assert result.accepted.version == 3 and len(result.refused) == 1
    assert load_last_good(stored, keys).entries[0].name == "public-b"
    # the kept file altered on disk is not used
    stored.write_text(stored.read_text().replace("public-b", "public-x"))
    assert load_last_good(stored, keys) is None


def _signed_anyway(key, body: str) -> str:
    """A body signed without sign_list's checks: what a careless or hostile signer could publish."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    from sapo_core.swarm.signedlist import key_id

    raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    sig = base64.b64encode(key.sign(body.encode())).decode()
    return f"{body}{SIGNATURE_PREFIX}{key_id(raw)} {sig}\n"


def test_the_shipped_keys_file_names_no_key_yet():
    """Honest until a maintainer holds a key: no fetched list can be accepted by this release."""
    from sapo_core.swarm.signedlist import shipped_keys

    assert shipped_keys() == {}
    with pytest.raises(ValueError, match="line 1"):
        parse_keys("ed25519 not-base64!")


def test_the_maintainers_commands_make_a_key_and_sign_a_list(tmp_path, capsys):
    key_file, listed = tmp_path / "list.key", tmp_path / "swarms.toml"
    assert cli_main(["swarms", "keygen", "--key", str(key_file)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("ed25519 ") and oct(key_file.stat().st_mode)[-3:] == "600"
    assert cli_main(["swarms", "keygen", "--key", str(key_file)]) == 2  # never overwritten
    listed.write_text(_list(5))
    assert cli_main(["swarms", "sign", str(listed), "--key", str(key_file)]) == 0
    assert cli_main(["swarms", "sign", str(listed), "--key", str(key_file)]) == 0  # re-signing replaces it
    text = listed.read_text()
    assert text.count(SIGNATURE_PREFIX) == 1
    from sapo_core.swarm.signedlist import verify_list

    assert verify_list(text.encode(), parse_keys(line), "list", parse_swarms).version == 5
    listed.write_text('[[swarm]]\nname = "x"\n')  # no version: refused before signing
    assert cli_main(["swarms", "sign", str(listed), "--key", str(key_file)]) == 2
    assert "has no version" in capsys.readouterr().err


def test_list_urls_must_be_https():
    with pytest.raises(ConfigError, match="https"):
        SwarmConfig(list_urls=["http://example.org/swarms.toml"])
    assert SwarmConfig(list_urls=["https://example.org/swarms.toml"]).list_urls


def test_update_without_a_url_says_what_to_set(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SAPO_DATA_DIR", str(tmp_path))
    assert cli_main(["swarms", "update"]) == 2
    assert "swarm.list_urls" in capsys.readouterr().err
    assert not Path(tmp_path / "swarms.signed.toml").exists()
