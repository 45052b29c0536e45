#!/usr/bin/python3
"""Writes a VeraCrypt AES-XTS / PBKDF2 header (VeraCrypt's documented volume format) with
Python's hashlib and the `cryptography` package (Debian python3-cryptography): a maker of
VeraCrypt volumes that shares no code with sealdisk. cryptsetup then opens the result in
the kernel oracle and writes the data (make-golden.sh).

usage: make-veracrypt.py IMAGE SIZE PASSPHRASE [--hash sha512|sha256] [--pim N]
           [--keyfile F]... [--hidden SIZE HIDDEN_PASSPHRASE] [--system]
The image gets the normal header at 0 and its backup at size-128 KiB (and with --hidden
the hidden volume's at 64 KiB and size-64 KiB); with --system a boot header in sector 62
of a whole-disk image (flags bit 0, the boot iteration count 2048*PIM or 200000).
Keys and salts are random: nothing but the layout is fixed."""
import hashlib, os, struct, sys, zlib
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

def crc32(b): return zlib.crc32(b) & 0xffffffff

def pool(passphrase, keyfiles):
    if not keyfiles: return passphrase
    n = 128 if len(passphrase) > 64 else 64
    p = bytearray(n)
    for kf in keyfiles:
        data = open(kf, 'rb').read()[:1 << 20]
        crc, j = 0xffffffff, 0
        for byte in data:
            crc = ~zlib.crc32(bytes([byte]), ~crc & 0xffffffff) & 0xffffffff
            for s in (24, 16, 8, 0):
                p[j] = (p[j] + ((crc >> s) & 0xff)) & 0xff
                j += 1
            j %= n
    for i, c in enumerate(passphrase): p[i] = (p[i] + c) & 0xff
    return bytes(p)

def iterations(hash_, pim, system):
    if system:
        return 2048 * pim if pim else 200000
    if pim: return 15000 + 1000 * pim
    return 500000

def header(password, hash_, iters, keys, volume_size, hidden_size, mk_offset, flags):
    salt = os.urandom(64)
    hk = hashlib.pbkdf2_hmac(hash_, password, salt, iters, 192)
    body = bytearray(448)
    body[0:4] = b'VERA'
    struct.pack_into('>HH', body, 4, 5, 0x010b)
    body[192:448] = keys
    struct.pack_into('>I', body, 8, crc32(bytes(body[192:448])))
    struct.pack_into('>QQQQII', body, 28, hidden_size, volume_size, mk_offset, volume_size, flags, 512)
    struct.pack_into('>I', body, 188, crc32(bytes(body[0:188])))
    enc = Cipher(algorithms.AES(hk[0:32] + hk[32:64]), modes.XTS(b'\0' * 16)).encryptor()
    return salt + enc.update(bytes(body)) + enc.finalize()

def main(a):
    img, size, pw = a[0], int(a[1]), a[2].encode()
    hash_, pim, kfs, hidden, system = 'sha512', None, [], None, False
    i = 3
    while i < len(a):
        if a[i] == '--hash': hash_ = a[i + 1]; i += 2
        elif a[i] == '--pim': pim = int(a[i + 1]); i += 2
        elif a[i] == '--keyfile': kfs.append(a[i + 1]); i += 2
        elif a[i] == '--hidden': hidden = (int(a[i + 1]), a[i + 2].encode()); i += 3
        elif a[i] == '--system': system = True; i += 1
        else: sys.exit('unknown option ' + a[i])
    with open(img, 'wb') as f: f.truncate(size)
    f = open(img, 'r+b')
    keys = os.urandom(64) + bytes(192)  # AES-XTS: data key, tweak key; the rest zero
    it = iterations(hash_, pim, system)
    if system:
        # Whole-disk image: the boot header in sector 62, the encrypted area after 1 MiB.
        mk = 1 << 20
        h = header(pool(pw, kfs), hash_, it, keys, size - mk, 0, mk, 1)
        f.seek(31744); f.write(h)
        return
    mk = 131072
    data = size - 2 * 131072
    hidden_size = hidden[0] if hidden else 0
    h = header(pool(pw, kfs), hash_, it, keys, data, hidden_size, mk, 0)
    f.seek(0); f.write(h)
    f.seek(size - 131072); f.write(header(pool(pw, kfs), hash_, it, keys, data, hidden_size, mk, 0))
    if hidden:
        hkeys = os.urandom(64) + bytes(192)
        hmk = mk + data - hidden[0]
        hh = lambda: header(pool(hidden[1], kfs), hash_, it, hkeys, hidden[0], hidden[0], hmk, 0)
        f.seek(65536); f.write(hh())
        f.seek(size - 65536); f.write(hh())

main(sys.argv[1:])
