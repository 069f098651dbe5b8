/* CRC-32C for record batches: SSE4.2 three-way interleaved when present, slicing-by-8 otherwise. */
#include <stdint.h>
#include <string.h>

#include "kmirror/crc32c.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#define KM_CRC_HAVE_SSE42 1
#endif

/* The Castagnoli polynomial, bit-reflected. */
#define POLY 0x82f63b78u

/*
 * Three-way interleaving: the crc32 instruction has a latency of about three cycles but a throughput
 * of one per cycle, so three independent streams keep it busy. The streams are joined by shifting a
 * partial CRC over the bytes of the streams after it, i.e. multiplying it by x^(8*len) mod P, which
 * for a fixed len is a linear map of the 32 CRC bits: four 256-entry tables.
 */
#define LONG_BLOCK 8192
#define SHORT_BLOCK 256

static uint32_t table[8][256];
static uint32_t shift_long[4][256];
static uint32_t shift_short[4][256];

/* a * b mod P, both in the reflected representation (bit 31 is x^0). */
static uint32_t multmodp(uint32_t a, uint32_t b)
{
	uint32_t m = 1u << 31, prod = 0;
	for (;;) {
		if (a & m) {
			prod ^= b;
			if ((a & (m - 1)) == 0)
				break;
		}
		m >>= 1;
		b = b & 1 ? (b >> 1) ^ POLY : b >> 1;
	}
	return prod;
}

/* x^(8*n) mod P. */
static uint32_t x8nmodp(size_t n)
{
	uint32_t result = 1u << 31; /* x^0 */
	uint32_t sq = 1u << 23;     /* x^8 */
	while (n) {
		if (n & 1)
			result = multmodp(sq, result);
		sq = multmodp(sq, sq);
		n >>= 1;
	}
	return result;
}

static void make_shift_table(uint32_t t[4][256], size_t len)
{
	uint32_t op = x8nmodp(len);
	for (unsigned k = 0; k < 4; k++)
		for (unsigned i = 0; i < 256; i++)
			t[k][i] = multmodp(op, (uint32_t)i << (8 * k));
}

static inline uint32_t shift_crc(uint32_t t[4][256], uint32_t crc)
{
	return t[0][crc & 0xff] ^ t[1][(crc >> 8) & 0xff] ^ t[2][(crc >> 16) & 0xff] ^ t[3][crc >> 24];
}

static inline uint64_t load_le64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, sizeof(v));
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
	v = __builtin_bswap64(v);
#endif
	return v;
}

/* Raw register versions: no pre/post inversion. */
static uint32_t crc_table_raw(uint32_t crc, const uint8_t *p, size_t n)
{
	while (n && ((uintptr_t)p & 7)) {
		crc = table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
		n--;
	}
	while (n >= 8) {
		uint64_t w = load_le64(p) ^ crc;
		crc = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^
		      table[4][(w >> 24) & 0xff] ^ table[3][(w >> 32) & 0xff] ^ table[2][(w >> 40) & 0xff] ^
		      table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
		p += 8;
		n -= 8;
	}
	while (n--)
		crc = table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
	return crc;
}

#ifdef KM_CRC_HAVE_SSE42
__attribute__((target("sse4.2"))) static uint32_t crc_sse42_raw(uint32_t crc, const uint8_t *p, size_t n)
{
	uint64_t c0 = crc;
	while (n && ((uintptr_t)p & 7)) {
		c0 = _mm_crc32_u8((uint32_t)c0, *p++);
		n--;
	}
	while (n >= 3 * LONG_BLOCK) {
		uint64_t c1 = 0, c2 = 0;
		const uint8_t *end = p + LONG_BLOCK;
		do {
			c0 = _mm_crc32_u64(c0, load_le64(p));
			c1 = _mm_crc32_u64(c1, load_le64(p + LONG_BLOCK));
			c2 = _mm_crc32_u64(c2, load_le64(p + 2 * LONG_BLOCK));
			p += 8;
		} while (p < end);
		c0 = shift_crc(shift_long, (uint32_t)c0) ^ (uint32_t)c1;
		c0 = shift_crc(shift_long, (uint32_t)c0) ^ (uint32_t)c2;
		p += 2 * LONG_BLOCK;
		n -= 3 * LONG_BLOCK;
	}
	while (n >= 3 * SHORT_BLOCK) {
		uint64_t c1 = 0, c2 = 0;
		const uint8_t *end = p + SHORT_BLOCK;
		do {
			c0 = _mm_crc32_u64(c0, load_le64(p));
			c1 = _mm_crc32_u64(c1, load_le64(p + SHORT_BLOCK));
			c2 = _mm_crc32_u64(c2, load_le64(p + 2 * SHORT_BLOCK));
			p += 8;
		} while (p < end);
		c0 = shift_crc(shift_short, (uint32_t)c0) ^ (uint32_t)c1;
		c0 = shift_crc(shift_short, (uint32_t)c0) ^ (uint32_t)c2;
		p += 2 * SHORT_BLOCK;
		n -= 3 * SHORT_BLOCK;
	}
	while (n >= 8) {
		c0 = _mm_crc32_u64(c0, load_le64(p));
		p += 8;
		n -= 8;
	}
	while (n--)
		c0 = _mm_crc32_u8((uint32_t)c0, *p++);
	return (uint32_t)c0;
}
#endif

static uint32_t (*crc_best)(uint32_t, const uint8_t *, size_t) = crc_table_raw;
static uint32_t (*crc_impl)(uint32_t, const uint8_t *, size_t) = crc_table_raw;
static int crc_ready;

/* Tables are filled before main() so that the hot path has no once-check. */
__attribute__((constructor)) static void crc_init(void)
{
	if (crc_ready)
		return;
	for (unsigned i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
		table[0][i] = c;
	}
	for (unsigned i = 0; i < 256; i++)
		for (unsigned k = 1; k < 8; k++)
			table[k][i] = table[0][table[k - 1][i] & 0xff] ^ (table[k - 1][i] >> 8);
	make_shift_table(shift_long, LONG_BLOCK);
	make_shift_table(shift_short, SHORT_BLOCK);
#ifdef KM_CRC_HAVE_SSE42
	__builtin_cpu_init();
	if (__builtin_cpu_supports("sse4.2"))
		crc_best = crc_sse42_raw;
#endif
	crc_impl = crc_best;
	crc_ready = 1;
}

/* Only a caller running before the constructor (another constructor) takes this branch. */
#define ENSURE_READY()                          \
	do {                                    \
		if (__builtin_expect(!crc_ready, 0)) \
			crc_init();             \
	} while (0)

uint32_t km_crc32c(uint32_t crc, const void *p, size_t n)
{
	ENSURE_READY();
	return ~crc_impl(~crc, p, n);
}

uint32_t km_crc32c_table(uint32_t crc, const void *p, size_t n)
{
	ENSURE_READY();
	return ~crc_table_raw(~crc, p, n);
}

uint32_t km_crc32c_hw(uint32_t crc, const void *p, size_t n)
{
	ENSURE_READY();
	return ~crc_best(~crc, p, n);
}

bool km_crc32c_hw_available(void)
{
	ENSURE_READY();
	return crc_best != crc_table_raw;
}

void km_crc32c_force_table(bool on)
{
	crc_init();
	crc_impl = on ? crc_table_raw : crc_best;
}

const char *km_crc32c_impl(void)
{
	ENSURE_READY();
	return crc_impl == crc_table_raw ? "table" : "sse4.2";
}

uint32_t km_crc32c_patch(uint32_t crc, size_t len, size_t at, const void *before, const void *after, size_t n)
{
	const uint8_t *a = before, *b = after;
	uint8_t d[16];
	uint32_t reg = 0;

	ENSURE_READY();
	/*
	 * The CRC is affine in the message: crc(m ^ D) = crc(m) ^ L(D), L the bare register update from
	 * zero (no inversions). D is zero outside [at, at + n): its leading zeros leave a zero register,
	 * the changed bytes load it, the trailing zeros multiply it by x^(8 * rest).
	 */
	while (n) {
		size_t k = n < sizeof(d) ? n : sizeof(d);
		for (size_t i = 0; i < k; i++)
			d[i] = a[i] ^ b[i];
		reg = crc_table_raw(reg, d, k);
		a += k;
		b += k;
		at += k;
		n -= k;
	}
	return crc ^ multmodp(x8nmodp(len - at), reg);
}
