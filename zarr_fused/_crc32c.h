/* CRC-32C (Castagnoli), as the zarr v3 crc32c codec stores it.
 *
 * Two implementations: the SSE4.2 / ARMv8 CRC32 instructions, and a portable
 * slicing-by-8 table. zf_crc32c_init() picks one at run time from what the
 * CPU reports; nothing depends on the flags of the build machine (the
 * hardware functions carry their own target attribute).
 */
#ifndef ZARR_FUSED_CRC32C_H
#define ZARR_FUSED_CRC32C_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define ZF_CRC32C_X86 1
#include <cpuid.h>
#include <nmmintrin.h>
#elif defined(__aarch64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define ZF_CRC32C_ARM 1
#include <arm_acle.h>
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
#endif

static uint32_t zf_crc32c_table[8][256];
static int zf_crc32c_kind = 0; /* 0 portable, 1 sse4.2, 2 armv8 crc */

/* The hardware paths run three independent streams over consecutive blocks
 * (the instruction's latency is three times its issue rate) and then join
 * them: the CRC register is linear, so the CRC of A||B is the register of A
 * advanced over len(B) zero bytes, xor the register of B started from zero.
 * Advancing over a fixed number of zero bytes is a 32x32 matrix over GF(2),
 * applied one register byte at a time through these tables. */
#define ZF_CRC32C_LONG 8192
#define ZF_CRC32C_SHORT 256
static uint32_t zf_crc32c_long[4][256];
static uint32_t zf_crc32c_short[4][256];

static uint32_t zf_gf2_apply(const uint32_t *columns, uint32_t vector) {
    uint32_t sum = 0;
    for (int i = 0; vector; i++, vector >>= 1)
        if (vector & 1) sum ^= columns[i];
    return sum;
}

/* out = a after b (apply b, then a) */
static void zf_gf2_compose(uint32_t *out, const uint32_t *a, const uint32_t *b) {
    for (int i = 0; i < 32; i++) out[i] = zf_gf2_apply(a, b[i]);
}

static void zf_crc32c_zeros_table(uint32_t table[4][256], size_t nbytes) {
    uint32_t power[32], op[32], tmp[32];
    /* one zero bit: the register shifts right, the polynomial enters on a carry */
    power[0] = 0x82F63B78u;
    for (int i = 1; i < 32; i++) power[i] = 1u << (i - 1);
    for (int k = 0; k < 3; k++) { /* 8 bits: one zero byte */
        zf_gf2_compose(tmp, power, power);
        memcpy(power, tmp, sizeof(tmp));
    }
    for (int i = 0; i < 32; i++) op[i] = 1u << i; /* identity */
    while (nbytes) {
        if (nbytes & 1) {
            zf_gf2_compose(tmp, power, op);
            memcpy(op, tmp, sizeof(tmp));
        }
        nbytes >>= 1;
        if (nbytes) {
            zf_gf2_compose(tmp, power, power);
            memcpy(power, tmp, sizeof(tmp));
        }
    }
    for (int k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++) table[k][b] = zf_gf2_apply(op, b << (8 * k));
}

static inline uint32_t zf_crc32c_shift(const uint32_t table[4][256], uint32_t crc) {
    return table[0][crc & 0xff] ^ table[1][(crc >> 8) & 0xff] ^ table[2][(crc >> 16) & 0xff] ^
           table[3][crc >> 24];
}

static uint32_t zf_crc32c_portable(uint32_t crc, const uint8_t *p, size_t n) {
    const int little = (*(const uint16_t *)"\x01\x00") == 1;
    if (little) {
        while (n >= 8) {
            uint64_t v;
            memcpy(&v, p, 8);
            v ^= crc;
            crc = zf_crc32c_table[7][v & 0xff] ^ zf_crc32c_table[6][(v >> 8) & 0xff] ^
                  zf_crc32c_table[5][(v >> 16) & 0xff] ^ zf_crc32c_table[4][(v >> 24) & 0xff] ^
                  zf_crc32c_table[3][(v >> 32) & 0xff] ^ zf_crc32c_table[2][(v >> 40) & 0xff] ^
                  zf_crc32c_table[1][(v >> 48) & 0xff] ^ zf_crc32c_table[0][v >> 56];
            p += 8;
            n -= 8;
        }
    }
    while (n--) crc = zf_crc32c_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

#ifdef ZF_CRC32C_X86
#define ZF_CRC32C_STREAMS(BLOCK, TABLE)                                          \
    while (n >= 3 * (BLOCK)) {                                                 \
        uint64_t c1 = 0, c2 = 0;                                               \
        const uint8_t *end = p + (BLOCK);                                      \
        do {                                                                   \
            uint64_t v0, v1, v2;                                               \
            memcpy(&v0, p, 8);                                                 \
            memcpy(&v1, p + (BLOCK), 8);                                       \
            memcpy(&v2, p + 2 * (BLOCK), 8);                                   \
            c0 = _mm_crc32_u64(c0, v0);                                        \
            c1 = _mm_crc32_u64(c1, v1);                                        \
            c2 = _mm_crc32_u64(c2, v2);                                        \
            p += 8;                                                            \
        } while (p < end);                                                     \
        c0 = zf_crc32c_shift(TABLE, (uint32_t)c0) ^ (uint32_t)c1;              \
        c0 = zf_crc32c_shift(TABLE, (uint32_t)c0) ^ (uint32_t)c2;              \
        p += 2 * (BLOCK);                                                      \
        n -= 3 * (BLOCK);                                                      \
    }

/* clang 14 and later make the CRC32 instructions a target feature of their
   own, which "sse4.2" does not imply in every release (zig's clang, which
   builds the portable wheel, refuses them without it); GCC knows them as
   part of SSE4.2. */
#if defined(__clang__) && __clang_major__ >= 14
__attribute__((target("sse4.2,crc32")))
#else
__attribute__((target("sse4.2")))
#endif
static uint32_t zf_crc32c_sse42(uint32_t crc, const uint8_t *p, size_t n) {
#if defined(__x86_64__)
    uint64_t c0 = crc;
    ZF_CRC32C_STREAMS(ZF_CRC32C_LONG, zf_crc32c_long)
    ZF_CRC32C_STREAMS(ZF_CRC32C_SHORT, zf_crc32c_short)
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c0 = _mm_crc32_u64(c0, v);
        p += 8;
        n -= 8;
    }
    crc = (uint32_t)c0;
#endif
    while (n >= 4) {
        uint32_t v;
        memcpy(&v, p, 4);
        crc = _mm_crc32_u32(crc, v);
        p += 4;
        n -= 4;
    }
    while (n--) crc = _mm_crc32_u8(crc, *p++);
    return crc;
}
#endif

#ifdef ZF_CRC32C_ARM
/* The ARMv8 CRC32C instructions, eight bytes a step (one stream: the x86
   path's three-stream interleave is not repeated here) */
#if defined(__clang__)
__attribute__((target("crc")))
#else
__attribute__((target("+crc")))
#endif
static uint32_t zf_crc32c_armv8(uint32_t crc, const uint8_t *p, size_t n) {
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        crc = __crc32cd(crc, v);
        p += 8;
        n -= 8;
    }
    while (n--) crc = __crc32cb(crc, *p++);
    return crc;
}
#endif

static void zf_crc32c_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        zf_crc32c_table[0][i] = c;
    }
    for (int t = 1; t < 8; t++) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = zf_crc32c_table[t - 1][i];
            zf_crc32c_table[t][i] = (c >> 8) ^ zf_crc32c_table[0][c & 0xff];
        }
    }
    zf_crc32c_zeros_table(zf_crc32c_long, ZF_CRC32C_LONG);
    zf_crc32c_zeros_table(zf_crc32c_short, ZF_CRC32C_SHORT);
#ifdef ZF_CRC32C_X86
    /* CPUID leaf 1, ECX bit 20, read directly: __builtin_cpu_supports needs
       the compiler runtime's CPU model, which zig's (the portable wheel's
       compiler) leaves unset in a shared library */
    {
        unsigned int eax, ebx, ecx, edx;
        if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 20))) zf_crc32c_kind = 1;
    }
#endif
#ifdef ZF_CRC32C_ARM
    if (getauxval(AT_HWCAP) & HWCAP_CRC32) zf_crc32c_kind = 2;
#endif
}

/* force: -1 = what the CPU supports, 0 = portable (for tests) */
static uint32_t zf_crc32c_with(int force, const uint8_t *p, size_t n) {
    uint32_t crc = 0xFFFFFFFFu;
    int kind = force < 0 ? zf_crc32c_kind : force;
#ifdef ZF_CRC32C_X86
    if (kind == 1) return zf_crc32c_sse42(crc, p, n) ^ 0xFFFFFFFFu;
#endif
#ifdef ZF_CRC32C_ARM
    if (kind == 2) return zf_crc32c_armv8(crc, p, n) ^ 0xFFFFFFFFu;
#endif
    return zf_crc32c_portable(crc, p, n) ^ 0xFFFFFFFFu;
}

static inline uint32_t zf_crc32c(const uint8_t *p, size_t n) { return zf_crc32c_with(-1, p, n); }

static inline const char *zf_crc32c_name(void) {
    return zf_crc32c_kind == 1 ? "sse4.2" : zf_crc32c_kind == 2 ? "armv8-crc" : "portable";
}

#endif
