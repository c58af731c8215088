"""WeCom's callback encryption, as pure functions: the msg_signature over the Token, the
timestamp, the nonce and the encrypted text (SHA-1 of the four, sorted and joined), and
AES-256-CBC with the EncodingAESKey (43 characters of base64 without its "="; the IV is
the key's first 16 bytes; PKCS#7 padding to 32 bytes). A plaintext is 16 random bytes,
the message's length (4 bytes, network order), the message, and the receiver's id (the
corp id), which must be ours. The XML of a callback is read with the standard library,
refusing any document type declaration (no entities, no external references)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import struct
import xml.etree.ElementTree as ET

BLOCK = 32


class Refused(Exception):
    """A callback request that fails a check: `status` is the HTTP answer."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


def aes_key(encoding_aes_key: str) -> bytes:
    """The 32-byte key an EncodingAESKey stands for; ValueError if it is not one."""
    try:
        key = base64.b64decode(encoding_aes_key + "=", validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("the EncodingAESKey is not base64") from exc
    if len(encoding_aes_key) != 43 or len(key) != 32:
        raise ValueError("the EncodingAESKey must be 43 characters (32 bytes)")
    return key


def signature(token: str, timestamp: str, nonce: str, encrypted: str) -> str:
    return hashlib.sha1("".join(sorted([token, timestamp, nonce, encrypted])).encode()).hexdigest()


def check_signature(token: str, timestamp: str, nonce: str, encrypted: str, given: str) -> None:
    if not hmac.compare_digest(signature(token, timestamp, nonce, encrypted), given or ""):
        raise Refused(401, "bad msg_signature")


def decrypt(key: bytes, encrypted: str, receiver: str) -> str:
    """The message an encrypted text holds, checked to be addressed to `receiver`."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    try:
        raw = base64.b64decode(encrypted, validate=True)
        if not raw or len(raw) % 16:
            raise ValueError("not whole AES blocks")
        cipher = Cipher(algorithms.AES(key), modes.CBC(key[:16])).decryptor()
        plain = cipher.update(raw) + cipher.finalize()
        pad = plain[-1]
        if not 1 <= pad <= BLOCK or plain[-pad:] != bytes([pad]) * pad:
            raise ValueError("bad padding")
        plain = plain[:-pad]
        (length,) = struct.unpack(">I", plain[16:20])
        message, rest = plain[20 : 20 + length], plain[20 + length :]
        if len(message) != length:
            raise ValueError("short message")
        text = message.decode("utf-8")
    except (binascii.Error, ValueError, struct.error, UnicodeDecodeError) as exc:
        raise Refused(400, f"cannot decrypt the callback ({exc})") from exc
    if rest.decode("utf-8", "replace") != receiver:
        raise Refused(403, "the callback is addressed to another corp")
    return text


def xml_fields(text: str | bytes) -> dict[str, str]:
    """The child elements of a callback's <xml> root, by tag, as text."""
    whole = (text if isinstance(text, str) else text.decode("utf-8", "replace")).upper()
    if "<!DOCTYPE" in whole or "<!ENTITY" in whole:
        raise Refused(400, "a document type declaration is not accepted")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise Refused(400, f"not XML ({exc})") from exc
    return {child.tag: (child.text or "") for child in root}
