/*
 * The C ABI from C: compiled with gcc against include/sealdisk.h and libsealdisk.so, run by
 * bindings/c/test.sh, which makes the LUKS2 image with cryptsetup first and checks it with
 * cryptsetup afterwards.
 *
 *   read_volume LUKS2_IMAGE PASSPHRASE NEW_PASSPHRASE BITLK_IMAGE BITLK_PASSWORD
 *
 * On the LUKS2 image cryptsetup made: probe, open read-write, write a pattern, close, open
 * read-only and read it back (aligned and unaligned), a wrong passphrase and bad arguments
 * give their error codes, keyslot add (NEW_PASSPHRASE; test.sh then has cryptsetup open
 * it), dump JSON. On the BitLocker image: probe, open, read the NTFS boot sector.
 * Prints one line per check; exits 1 at the first failure.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sealdisk.h"

static int checks;

#define CHECK(cond, ...)                                                                  \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                 \
            fprintf(stderr, " (last error: %s)\n", sealdisk_last_error());               \
            exit(1);                                                                      \
        }                                                                                 \
        checks++;                                                                         \
    } while (0)

#define OK(call)                                                                          \
    do {                                                                                  \
        int rc_ = (call);                                                                 \
        CHECK(rc_ == SEALDISK_OK, "%s returned %s", #call, sealdisk_error_name(rc_));     \
    } while (0)

#define FAILS_WITH(code, call)                                                            \
    do {                                                                                  \
        int rc_ = (call);                                                                 \
        CHECK(rc_ == (code), "%s returned %s, expected %s", #call, sealdisk_error_name(rc_), \
              sealdisk_error_name(code));                                                 \
        CHECK(sealdisk_last_error()[0] != '\0', "%s: no message", #call);                 \
        printf("ok   %s -> %s: %s\n", #call, sealdisk_error_name(rc_), sealdisk_last_error()); \
    } while (0)

static const uint8_t *u8(const char *s) { return (const uint8_t *)s; }

static void pattern(uint8_t *buf, size_t len, uint64_t offset) {
    for (size_t i = 0; i < len; i++) {
        uint64_t at = offset + i;
        buf[i] = (uint8_t)(at * 31 + (at >> 9));
    }
}

static void luks2(const char *path, const char *pass, const char *new_pass) {
    char *json = NULL;
    OK(sealdisk_probe(path, &json));
    CHECK(strstr(json, "\"type\":\"luks2\"") != NULL, "probe: %s", json);
    printf("ok   probe %s: %s\n", path, json);
    sealdisk_string_free(json);

    /* Read-write: a pattern at the start, in the middle and in the last blocks. */
    sealdisk_volume *vol = NULL;
    OK(sealdisk_open(path, u8(pass), strlen(pass), 0, &vol));
    CHECK(vol != NULL, "open gave no volume");
    const char *kind = NULL;
    uint64_t size = 0;
    uint32_t block = 0;
    OK(sealdisk_volume_kind(vol, &kind));
    OK(sealdisk_volume_size(vol, &size));
    OK(sealdisk_volume_block_size(vol, &block));
    CHECK(strcmp(kind, "luks2") == 0, "kind %s", kind);
    CHECK(block == 512 || block == 4096, "block size %u", block);
    CHECK(size > 65536 && size % block == 0, "size %llu", (unsigned long long)size);
    printf("ok   open read-write: kind %s, %llu bytes, %u-byte blocks\n", kind,
           (unsigned long long)size, block);

    const size_t len = 65536;
    uint8_t *buf = malloc(len), *back = malloc(len);
    CHECK(buf && back, "malloc");
    const uint64_t offsets[] = {0, size / 2 / block * block, size - len};
    for (int i = 0; i < 3; i++) {
        pattern(buf, len, offsets[i]);
        OK(sealdisk_write(vol, offsets[i], buf, len));
    }
    OK(sealdisk_flush(vol));
    FAILS_WITH(SEALDISK_E_USAGE, sealdisk_write(vol, 1, buf, block));
    FAILS_WITH(SEALDISK_E_USAGE, sealdisk_write(vol, size, buf, block));
    FAILS_WITH(SEALDISK_E_USAGE, sealdisk_read(vol, size - 1, back, 2));
    /* The device is locked while open: a second read-write open is refused. */
    sealdisk_volume *second = NULL;
    FAILS_WITH(SEALDISK_E_BUSY, sealdisk_open(path, u8(pass), strlen(pass), 0, &second));
    CHECK(second == NULL, "a failed open leaves NULL");
    OK(sealdisk_close(vol));
    printf("ok   wrote a pattern at 3 offsets, closed\n");

    /* Read-only: the pattern reads back, whole and at unaligned offsets. */
    OK(sealdisk_open(path, u8(pass), strlen(pass), SEALDISK_READ_ONLY, &vol));
    for (int i = 0; i < 3; i++) {
        pattern(buf, len, offsets[i]);
        memset(back, 0, len);
        OK(sealdisk_read(vol, offsets[i], back, len));
        CHECK(memcmp(buf, back, len) == 0, "pattern at %llu", (unsigned long long)offsets[i]);
        OK(sealdisk_read(vol, offsets[i] + 7, back, 1000));
        CHECK(memcmp(buf + 7, back, 1000) == 0, "unaligned read at %llu", (unsigned long long)offsets[i] + 7);
    }
    FAILS_WITH(SEALDISK_E_PERMISSION, sealdisk_write(vol, 0, buf, block));
    OK(sealdisk_close(vol));
    printf("ok   pattern read back read-only (aligned and unaligned)\n");
    free(buf);
    free(back);

    /* Errors by kind, and NULL arguments. */
    vol = (sealdisk_volume *)&checks; /* must be overwritten with NULL */
    FAILS_WITH(SEALDISK_E_WRONG_KEY, sealdisk_open(path, u8("not it"), 6, SEALDISK_READ_ONLY, &vol));
    CHECK(vol == NULL, "a failed open leaves NULL");
    CHECK(strstr(sealdisk_last_error(), "not it") == NULL, "the passphrase is in the message");
    FAILS_WITH(SEALDISK_E_NULL_ARG, sealdisk_open(NULL, u8(pass), strlen(pass), 0, &vol));
    FAILS_WITH(SEALDISK_E_NULL_ARG, sealdisk_open(path, u8(pass), strlen(pass), 0, NULL));
    FAILS_WITH(SEALDISK_E_NULL_ARG, sealdisk_open(path, NULL, 5, 0, &vol));
    FAILS_WITH(SEALDISK_E_USAGE, sealdisk_open(path, u8(pass), strlen(pass), 0x80, &vol));
    /* No passphrase: nothing to try, as a wrong one. */
    FAILS_WITH(SEALDISK_E_WRONG_KEY, sealdisk_open(path, NULL, 0, SEALDISK_READ_ONLY, &vol));
    FAILS_WITH(SEALDISK_E_NULL_ARG, sealdisk_read(NULL, 0, (uint8_t *)&checks, 1));
    FAILS_WITH(SEALDISK_E_NULL_ARG, sealdisk_write(NULL, 0, u8("x"), 1));
    FAILS_WITH(SEALDISK_E_NULL_ARG, sealdisk_flush(NULL));
    FAILS_WITH(SEALDISK_E_NULL_ARG, sealdisk_volume_size(NULL, &size));
    FAILS_WITH(SEALDISK_E_NULL_ARG, sealdisk_probe(path, NULL));
    FAILS_WITH(SEALDISK_E_NULL_ARG, sealdisk_dump_json(NULL, &json));
    FAILS_WITH(SEALDISK_E_IO, sealdisk_probe("/nonexistent/sealdisk.img", &json));
    CHECK(json == NULL, "a failed probe leaves NULL");
    OK(sealdisk_close(NULL));
    sealdisk_string_free(NULL);

    /* A new keyslot (test.sh has cryptsetup open it), PBKDF2 at the minimum for speed. */
    sealdisk_pbkdf fast = {.type = "pbkdf2", .iterations = 1000};
    int slot = -1;
    FAILS_WITH(SEALDISK_E_WRONG_KEY,
               sealdisk_keyslot_add(path, u8("wrong"), 5, u8(new_pass), strlen(new_pass), -1, &fast, &slot));
    FAILS_WITH(SEALDISK_E_USAGE,
               sealdisk_keyslot_add(path, u8(pass), strlen(pass), u8(new_pass), strlen(new_pass), 0, &fast, &slot));
    OK(sealdisk_keyslot_add(path, u8(pass), strlen(pass), u8(new_pass), strlen(new_pass), 3, &fast, &slot));
    CHECK(slot == 3, "keyslot %d", slot);
    OK(sealdisk_open(path, u8(new_pass), strlen(new_pass), SEALDISK_READ_ONLY, &vol));
    OK(sealdisk_close(vol));
    printf("ok   keyslot 3 added, opens\n");

    OK(sealdisk_dump_json(path, &json));
    CHECK(strstr(json, "\"keyslots\"") && strstr(json, "\"3\"") && strstr(json, "\"pbkdf2\""),
          "dump: %.200s", json);
    printf("ok   dump_json: %zu bytes of LUKS2 metadata\n", strlen(json));
    sealdisk_string_free(json);
}

static void bitlk(const char *path, const char *password) {
    char *json = NULL;
    OK(sealdisk_probe(path, &json));
    CHECK(strstr(json, "\"type\":\"bitlk\"") != NULL, "probe: %s", json);
    sealdisk_string_free(json);
    sealdisk_volume *vol = NULL;
    FAILS_WITH(SEALDISK_E_WRONG_KEY, sealdisk_open(path, u8("password12!"), 11, SEALDISK_READ_ONLY, &vol));
    OK(sealdisk_open(path, u8(password), strlen(password), SEALDISK_READ_ONLY, &vol));
    const char *kind = NULL;
    OK(sealdisk_volume_kind(vol, &kind));
    CHECK(strcmp(kind, "bitlk") == 0, "kind %s", kind);
    uint8_t sector[512];
    OK(sealdisk_read(vol, 0, sector, sizeof sector));
    CHECK(memcmp(sector + 3, "NTFS    ", 8) == 0 && sector[510] == 0x55 && sector[511] == 0xaa,
          "the boot sector is not NTFS");
    OK(sealdisk_read(vol, 0x2000, sector, sizeof sector));
    CHECK(memcmp(sector, "FILE0", 5) == 0, "no MFT record at 0x2000");
    OK(sealdisk_close(vol));
    printf("ok   BitLocker %s: NTFS boot sector and MFT record\n", path);
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s LUKS2_IMAGE PASSPHRASE NEW_PASSPHRASE BITLK_IMAGE BITLK_PASSWORD\n", argv[0]);
        return 2;
    }
    printf("libsealdisk %s\n", sealdisk_version());
    luks2(argv[1], argv[2], argv[3]);
    bitlk(argv[4], argv[5]);
    printf("read_volume: %d checks passed\n", checks);
    return 0;
}
