"""cosign's encrypted key file, read and written without ingot: scrypt from Python's hashlib,
NaCl's secretbox from PyNaCl (libsodium), the PKCS#8 and PKIX encodings from python3-cryptography.

    keyfile.py check KEY PUB   decrypts KEY (password: COSIGN_PASSWORD) and checks it is PUB's
    keyfile.py write KEY PUB   writes a new key pair as cosign generate-key-pair does
"""
import base64
import hashlib
import json
import os
import sys

import nacl.secret
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

LABEL = "ENCRYPTED SIGSTORE PRIVATE KEY"
S = serialization


def kek(password, salt, n, r, p):
    return hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, maxmem=256 << 20, dklen=32)


def unarmour(text):
    lines = text.strip().splitlines()
    assert lines[0] == f"-----BEGIN {LABEL}-----", lines[0]
    assert lines[-1] == f"-----END {LABEL}-----", lines[-1]
    return base64.b64decode("".join(lines[1:-1]))


def check(key_path, pub_path, password):
    doc = json.loads(unarmour(open(key_path).read()))
    assert doc["kdf"]["name"] == "scrypt" and doc["cipher"]["name"] == "nacl/secretbox", doc
    params = doc["kdf"]["params"]
    assert (params["N"], params["r"], params["p"]) == (32768, 8, 1), params
    key = kek(password, base64.b64decode(doc["kdf"]["salt"]), params["N"], params["r"], params["p"])
    der = nacl.secret.SecretBox(key).decrypt(
        base64.b64decode(doc["ciphertext"]), base64.b64decode(doc["cipher"]["nonce"]))
    private = S.load_der_private_key(der, None)
    public = S.load_pem_public_key(open(pub_path, "rb").read())
    assert isinstance(private.curve, ec.SECP256R1), private.curve
    assert private.public_key().public_numbers() == public.public_numbers()
    print("ok")


def write(key_path, pub_path, password):
    private = ec.generate_private_key(ec.SECP256R1())
    der = private.private_bytes(S.Encoding.DER, S.PrivateFormat.PKCS8, S.NoEncryption())
    salt, nonce = os.urandom(32), os.urandom(24)
    sealed = nacl.secret.SecretBox(kek(password, salt, 32768, 8, 1)).encrypt(der, nonce)
    b64 = lambda b: base64.b64encode(b).decode()
    doc = {"kdf": {"name": "scrypt", "params": {"N": 32768, "r": 8, "p": 1}, "salt": b64(salt)},
           "cipher": {"name": "nacl/secretbox", "nonce": b64(nonce)},
           "ciphertext": b64(sealed.ciphertext)}
    body = b64(json.dumps(doc).encode())
    lines = [body[i:i + 64] for i in range(0, len(body), 64)]
    pem = "\n".join([f"-----BEGIN {LABEL}-----", *lines, f"-----END {LABEL}-----", ""])
    open(key_path, "w").write(pem)
    public = private.public_key().public_bytes(S.Encoding.PEM, S.PublicFormat.SubjectPublicKeyInfo)
    open(pub_path, "wb").write(public)


if __name__ == "__main__":
    mode, key_path, pub_path = sys.argv[1:4]
    {"check": check, "write": write}[mode](key_path, pub_path, os.environb[b"COSIGN_PASSWORD"])
