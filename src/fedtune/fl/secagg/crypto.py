"""Secure aggregation's cryptography: key pairs and key agreement (P-384 ECDH), the mask generator
(AES-256 in counter mode), Shamir sharing and the authenticated encryption of shares.

The primitives are maintained ones: elliptic-curve key agreement and AES from ``cryptography``; Shamir
sharing and the share encryption (HKDF + Fernet) from Flower (``flwr.common.secure_aggregation``).
Flower's own mask generator is not used: it folds its seed to 32 bits.
"""

from __future__ import annotations

import base64
from collections.abc import Callable

import numpy as np
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes


def shamir() -> tuple[Callable[[bytes, int, int], list[bytes]], Callable[[list[bytes]], bytes]]:
    """Flower's ``(create_shares(secret, threshold, count), combine_shares(shares))``."""
    from flwr.common.secure_aggregation.crypto.shamir import combine_shares, create_shares

    return create_shares, combine_shares


def share_cipher() -> tuple[Callable[..., bytes], Callable[..., bytes], Callable[..., bytes]]:
    """Flower's ``(generate_shared_key, encrypt, decrypt)``: HKDF over ECDH, then Fernet."""
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import (
        decrypt,
        encrypt,
        generate_shared_key,
    )

    return generate_shared_key, encrypt, decrypt


def new_key_pair() -> tuple[bytes, bytes]:
    """A P-384 key pair as ``(private PKCS8 DER, public SubjectPublicKeyInfo DER)``."""
    private = ec.generate_private_key(ec.SECP384R1())
    return (
        private.private_bytes(
            serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
        private.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )


def agreed_key(private_der: bytes, public_der: bytes) -> bytes:
    """The 32-byte key two parties agree on (ECDH, then HKDF-SHA256; urlsafe base64 as Fernet wants)."""
    generate_shared_key, _, _ = share_cipher()
    private = serialization.load_der_private_key(private_der, password=None)
    public = serialization.load_der_public_key(public_der)
    if not isinstance(private, ec.EllipticCurvePrivateKey) or not isinstance(
        public, ec.EllipticCurvePublicKey
    ):
        raise ValueError("secure aggregation: not an elliptic-curve key")
    return bytes(generate_shared_key(private, public))


def prg(seed: bytes, size: int) -> np.ndarray:
    """``size`` pseudo-random uint32 words from a 32-byte seed: AES-256 in counter mode over zeros (each
    seed masks one vector of one round, so the fixed nonce is never reused with a key)."""
    key = base64.urlsafe_b64decode(seed) if len(seed) == 44 else seed
    if len(key) != 32:
        raise ValueError(f"a mask seed has {len(key)} bytes, expected 32")
    encryptor = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
    stream = encryptor.update(bytes(4 * size)) + encryptor.finalize()
    return np.frombuffer(stream, dtype="<u4").astype(np.uint32)


def frame(*parts: bytes) -> bytes:
    """Length-prefixed concatenation (a share message's plaintext layout, not a cipher)."""
    return b"".join(len(part).to_bytes(4, "little") + part for part in parts)


def unframe(data: bytes) -> list[bytes]:
    """The parts ``frame`` joined."""
    parts, at = [], 0
    while at < len(data):
        size = int.from_bytes(data[at : at + 4], "little")
        parts.append(data[at + 4 : at + 4 + size])
        at += 4 + size
    return parts


def is_bytes(value: object) -> bool:
    """Bytes travel as uint8 arrays (a payload holds arrays and scalars only)."""
    return isinstance(value, np.ndarray) and value.dtype == np.uint8


def payload_bytes(value: object, what: str) -> bytes:
    """The bytes a payload carries as a uint8 array; anything else is an error naming ``what``."""
    if not isinstance(value, np.ndarray) or value.dtype != np.uint8:
        raise ValueError(f"secure aggregation: {what} must be a uint8 array")
    return value.tobytes()


def bytes_array(data: bytes) -> np.ndarray:
    """``data`` as the uint8 array a payload carries."""
    return np.frombuffer(data, dtype=np.uint8).copy()
