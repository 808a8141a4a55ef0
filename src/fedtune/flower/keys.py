"""SuperNode authentication keys: ECDSA P-384 key pairs in OpenSSH format (``cryptography``).

A client machine makes its pair once (``fedtune flower keygen``); the server registers the public
half with a SuperLink started with ``--auth`` (``FlowerConnection.register``).
"""

from __future__ import annotations

from pathlib import Path


def make_node_key(private: Path) -> Path:
    """An ECDSA P-384 key pair in OpenSSH format (``private`` and ``private.pub``); kept if present."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    public = private.with_name(private.name + ".pub")
    if private.is_file() and public.is_file():
        return public
    private.parent.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
    )
    private.chmod(0o600)
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    )
    return public


def make_node_keys(directory: Path, count: int) -> list[Path]:
    """Private key paths ``node0`` ... ``node<count-1>`` under ``directory`` (public: ``.pub``)."""
    keys = [directory / f"node{i}" for i in range(count)]
    for key in keys:
        make_node_key(key)
    return keys
