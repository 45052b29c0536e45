"""The sealdisk Python module against the real tools: volumes cryptsetup made, keyslots
cryptsetup opens, metadata cryptsetup dumps, data decrypted independently (AES-XTS from the
`cryptography` package with the key cryptsetup dumps), and a BitLocker image Windows made.

Run: pip install ./bindings/python pytest && python3 -m pytest bindings/python/tests
Needs cryptsetup and xz (.ci/run installs them)."""

import json
import lzma
import os
import pathlib
import re
import shutil
import subprocess
import threading

import pytest

import sealdisk

ROOT = pathlib.Path(__file__).resolve().parents[3]
BITLK = ROOT / "testdata" / "bitlk"
BITLK_PASSWORD = "password12!@"
PASS = "correct horse"
NEW_PASS = "battery staple"

if shutil.which("cryptsetup") is None:
    pytest.fail("cryptsetup not found (Debian: apt install cryptsetup-bin)", pytrace=False)


def cryptsetup(*args, passphrase=None, check=True):
    return subprocess.run(
        ["cryptsetup", *args],
        input=None if passphrase is None else passphrase.encode(),
        capture_output=True,
        check=check,
    )


def cryptsetup_format(path, *extra, passphrase=PASS, size=32 << 20):
    with open(path, "wb") as f:
        f.truncate(size)
    cryptsetup("luksFormat", "--batch-mode", "--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000",
               "--key-file", "-", *extra, str(path), passphrase=passphrase)
    return str(path)


@pytest.fixture
def luks2(tmp_path):
    return cryptsetup_format(tmp_path / "luks2.img", "--type", "luks2")


@pytest.fixture(scope="session")
def bitlk_image(tmp_path_factory):
    out = tmp_path_factory.mktemp("bitlk") / "aes-xts_128.img"
    out.write_bytes(lzma.decompress((BITLK / "aes-xts_128.img.xz").read_bytes()))
    return str(out)


def pattern(offset, length):
    return bytes(((offset + i) * 31 + ((offset + i) >> 9)) & 0xFF for i in range(length))


def test_probe_names_what_cryptsetup_made(luks2, tmp_path):
    p = sealdisk.probe(luks2)
    assert p["type"] == "luks2" and p["name"] == "LUKS2" and p["cipher"] == "aes-xts-plain64"
    uuid = cryptsetup("luksUUID", luks2).stdout.decode().strip()
    assert p["uuid"] == uuid
    luks1 = cryptsetup_format(tmp_path / "luks1.img", "--type", "luks1")
    assert sealdisk.probe(luks1)["type"] == "luks1"
    blank = tmp_path / "blank.img"
    blank.write_bytes(bytes(1 << 20))
    assert sealdisk.probe(str(blank))["type"] is None


def test_write_read_round_trip_and_independent_decryption(luks2):
    with sealdisk.open(luks2, PASS, read_only=False) as v:
        # cryptsetup chose the sector size (4096 on a file) and a 16 MiB LUKS2 header.
        assert (v.kind, v.read_only) == ("luks2", False) and v.block_size in (512, 4096)
        assert v.size == (32 << 20) - (16 << 20)
        for off in (0, 1 << 20, v.size - 8192):
            v.write(off, pattern(off, 8192))
        v.write(8192, bytearray(pattern(8192, v.block_size)))
        v.flush()
    assert v.closed
    with sealdisk.open(luks2, PASS) as v:
        for off in (0, 1 << 20, v.size - 8192):
            assert v.read(off, 8192) == pattern(off, 8192)
        assert v.read(1000, 3000) == pattern(1000, 3000)  # unaligned
        assert v.read(0, 0) == b""

    # The same sectors decrypted without sealdisk: the volume key cryptsetup dumps, AES-XTS
    # over each encryption sector, its tweak the number of its first 512-byte sector (plain64;
    # LUKS2 counts IVs in 512-byte units whatever its sector size), at the data offset.
    crypto = pytest.importorskip("cryptography.hazmat.primitives.ciphers")
    dump = cryptsetup("luksDump", "--dump-volume-key", "--batch-mode", "--key-file", "-", luks2,
                      passphrase=PASS).stdout.decode()
    hexkey = dump.split("MK dump:")[1] if "MK dump:" in dump else dump.split("Volume key:")[1]
    key = bytes.fromhex("".join(hexkey.split()))
    assert len(key) == 64
    meta = json.loads(cryptsetup("luksDump", "--dump-json-metadata", luks2).stdout)
    segment = meta["segments"]["0"]
    data_offset, sector_size = int(segment["offset"]), segment["sector_size"]
    raw = pathlib.Path(luks2).read_bytes()
    for off in (0, 1 << 20):
        for s in range(0, 8192, sector_size):
            sector = (off + s) // 512
            tweak = sector.to_bytes(16, "little")
            d = crypto.Cipher(crypto.algorithms.AES(key), crypto.modes.XTS(tweak)).decryptor()
            at = data_offset + off + s
            plain = d.update(raw[at:at + sector_size]) + d.finalize()
            assert plain == pattern(off + s, sector_size), sector


def test_errors_by_kind(luks2, tmp_path):
    with pytest.raises(sealdisk.WrongKeyError) as e:
        sealdisk.open(luks2, "not it")
    assert "not it" not in str(e.value) and "No key available" in str(e.value)
    assert isinstance(e.value, sealdisk.Error)
    with pytest.raises(sealdisk.WrongKeyError):
        sealdisk.open(luks2)  # no passphrase: nothing to try
    with pytest.raises(sealdisk.DeviceIOError):
        sealdisk.open(str(tmp_path / "missing.img"), PASS)
    blank = tmp_path / "blank.img"
    blank.write_bytes(bytes(1 << 20))
    with pytest.raises(sealdisk.UsageError, match="not a valid LUKS device"):
        sealdisk.open(str(blank), PASS)  # nothing recognised
    with pytest.raises(sealdisk.UsageError):
        sealdisk.keyslot_remove(str(blank), PASS)  # not LUKS
    with pytest.raises(TypeError):
        sealdisk.open(luks2, 1234)
    with sealdisk.open(luks2, PASS.encode(), read_only=False) as v:
        with pytest.raises(sealdisk.BusyError):
            sealdisk.open(luks2, PASS, read_only=False)
        with pytest.raises(sealdisk.UsageError):
            v.write(1, b"x" * v.block_size)  # unaligned
        with pytest.raises(sealdisk.UsageError):
            v.read(v.size - 1, 2)  # past the end
        with pytest.raises(sealdisk.UsageError):
            v.read(0, 1 << 62)  # refused before anything is allocated
        with pytest.raises(OverflowError):
            v.read(-1, 1)
    with pytest.raises(sealdisk.UsageError):
        v.read(0, 512)  # closed
    v.close()  # twice is fine
    with sealdisk.open(luks2, PASS) as v:
        with pytest.raises(sealdisk.PermissionDeniedError):
            v.write(0, bytes(v.block_size))
    with pytest.raises(sealdisk.UsageError):
        sealdisk.luks_format(str(blank), PASS, type="luks3")
    with pytest.raises(sealdisk.UsageError):
        sealdisk.luks_format(str(blank), PASS, pbkdf="pbkdf2", iterations=10)  # below the minimum


def test_keyslot_add_then_cryptsetup_opens_it(luks2):
    slot = sealdisk.keyslot_add(luks2, PASS, NEW_PASS, pbkdf="pbkdf2", iterations=1000)
    assert slot == 1
    cryptsetup("open", "--test-passphrase", "--key-slot", "1", "--key-file", "-", luks2, passphrase=NEW_PASS)
    assert cryptsetup("open", "--test-passphrase", "--key-file", "-", luks2, passphrase="wrong",
                      check=False).returncode == 2
    with pytest.raises(sealdisk.WrongKeyError):
        sealdisk.keyslot_add(luks2, "wrong", "x", pbkdf="pbkdf2", iterations=1000)
    with pytest.raises(sealdisk.UsageError):
        sealdisk.keyslot_add(luks2, PASS, "x", slot=1, pbkdf="pbkdf2", iterations=1000)  # taken
    # Removing the first passphrase: cryptsetup no longer opens with it, still with the new one.
    assert sealdisk.keyslot_remove(luks2, PASS) == 0
    assert cryptsetup("open", "--test-passphrase", "--key-file", "-", luks2, passphrase=PASS,
                      check=False).returncode == 2
    cryptsetup("open", "--test-passphrase", "--key-file", "-", luks2, passphrase=NEW_PASS)
    sealdisk.keyslot_kill(luks2, 1)
    assert "keyslots" in sealdisk.dump_json(luks2) and not sealdisk.dump_json(luks2)["keyslots"]


def test_dump_json_is_cryptsetups(luks2):
    sealdisk.keyslot_add(luks2, PASS, NEW_PASS, slot=5, pbkdf="pbkdf2", iterations=1000)
    ours = sealdisk.dump_json(luks2)
    theirs = json.loads(cryptsetup("luksDump", "--dump-json-metadata", luks2).stdout)
    assert ours == theirs
    assert sorted(ours["keyslots"]) == ["0", "5"]


def test_luks_format_then_cryptsetup_reads_it(tmp_path):
    for kind in ("luks1", "luks2"):
        path = tmp_path / f"{kind}.img"
        path.write_bytes(b"")
        os.truncate(path, 32 << 20)
        sealdisk.luks_format(str(path), PASS, type=kind, cipher="aes-cbc-essiv:sha256", key_size=256,
                             pbkdf="pbkdf2", iterations=1000)
        dump = cryptsetup("luksDump", str(path)).stdout.decode()
        assert re.search(rf"^Version:\s+{kind[-1]}$", dump, re.M), dump
        assert "cbc-essiv:sha256" in dump, dump
        cryptsetup("open", "--test-passphrase", "--key-file", "-", str(path), passphrase=PASS)
        with sealdisk.open(str(path), PASS, read_only=False) as v:
            assert v.kind == kind
            v.write(0, pattern(0, 4096))
        with sealdisk.open(str(path), PASS) as v:
            assert v.read(0, 4096) == pattern(0, 4096)


def test_bitlocker_image_reads(bitlk_image):
    assert sealdisk.probe(bitlk_image)["type"] == "bitlk"
    with pytest.raises(sealdisk.WrongKeyError):
        sealdisk.open(bitlk_image, "password12!")
    with sealdisk.open(bitlk_image, BITLK_PASSWORD) as v:
        assert v.kind == "bitlk"
        boot = v.read(0, 512)
        assert boot[3:11] == b"NTFS    " and boot[510:512] == b"\x55\xaa"
        assert v.read(0x2000, 8) == b"FILE0\x00\x03\x00"  # the MFT's first record
        assert "Volume" in repr(v)
    assert sealdisk.dump_json(bitlk_image)["name"] == "BitLocker"


def test_reads_from_threads_run_concurrently(luks2):
    # The interpreter is detached during I/O: threads read at once, none sees another's data.
    with sealdisk.open(luks2, PASS, read_only=False) as v:
        v.write(0, pattern(0, 1 << 16))
    errors = []
    with sealdisk.open(luks2, PASS) as v:
        def worker(n):
            for i in range(50):
                off = ((n * 50 + i) * 512) % (1 << 16)
                if v.read(off, 512) != pattern(off, 512):
                    errors.append(off)
        threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors
