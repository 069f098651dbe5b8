/* Unit tests for CRC-32C: known vectors, hardware against table on all lengths and alignments, chaining. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kmirror/crc32c.h"

typedef uint32_t (*crc_fn)(uint32_t, const void *, size_t);

static void check_vectors(crc_fn f)
{
	uint8_t buf[48];
	assert_int_equal(f(0, "123456789", 9), 0xE3069283u);
	assert_int_equal(f(0, "", 0), 0);
	assert_int_equal(f(0, "a", 1), 0xC1D04330u);
	/* RFC 3720 appendix B.4 */
	memset(buf, 0, 32);
	assert_int_equal(f(0, buf, 32), 0x8A9136AAu);
	memset(buf, 0xff, 32);
	assert_int_equal(f(0, buf, 32), 0x62A8AB43u);
	for (int i = 0; i < 32; i++)
		buf[i] = (uint8_t)i;
	assert_int_equal(f(0, buf, 32), 0x46DD794Eu);
	for (int i = 0; i < 32; i++)
		buf[i] = (uint8_t)(31 - i);
	assert_int_equal(f(0, buf, 32), 0x113FDB5Cu);
	static const uint8_t iscsi[48] = {
		0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
		0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18,
		0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
	assert_int_equal(f(0, iscsi, sizeof(iscsi)), 0xD9963A56u);
}

static void test_vectors_table(void **state) { check_vectors(km_crc32c_table); }
static void test_vectors_hw(void **state) { check_vectors(km_crc32c_hw); }
static void test_vectors_default(void **state) { check_vectors(km_crc32c); }

static void test_hw_detected(void **state)
{
#if defined(__x86_64__)
	__builtin_cpu_init();
	assert_int_equal(km_crc32c_hw_available(), __builtin_cpu_supports("sse4.2") != 0);
	if (km_crc32c_hw_available())
		assert_string_equal(km_crc32c_impl(), "sse4.2");
#else
	skip();
#endif
}

static uint8_t *random_buf(size_t n, unsigned seed)
{
	uint8_t *p = malloc(n);
	assert_non_null(p);
	uint32_t x = seed * 2654435761u + 1;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		p[i] = (uint8_t)x;
	}
	return p;
}

/* Every length up to past two short 3-way blocks, every alignment within a word and more. */
static void test_hw_vs_table_all_lengths(void **state)
{
	uint8_t *buf = random_buf(4096 + 64, 1);
	for (size_t align = 0; align < 16; align++)
		for (size_t n = 0; n <= 2100; n++)
			assert_int_equal(km_crc32c_hw(0, buf + align, n), km_crc32c_table(0, buf + align, n));
	free(buf);
}

/* Long buffers: the 24 KiB three-way path, its joins and the tails after it. */
static void test_hw_vs_table_long(void **state)
{
	size_t max = 3 * 8192 * 3 + 3 * 256 * 2 + 100;
	uint8_t *buf = random_buf(max + 16, 2);
	static const size_t lens[] = {3 * 8192 - 1, 3 * 8192, 3 * 8192 + 1, 3 * 8192 + 767, 3 * 8192 + 768,
				      2 * 3 * 8192 + 5, 3 * 8192 * 3 + 3 * 256 * 2 + 99};
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
		for (size_t align = 0; align < 9; align++)
			assert_int_equal(km_crc32c_hw(0, buf + align, lens[i]), km_crc32c_table(0, buf + align, lens[i]));
	for (unsigned seed = 0; seed < 50; seed++) {
		size_t n = (seed * 7919u) % max;
		assert_int_equal(km_crc32c_hw(seed, buf + seed % 16, n), km_crc32c_table(seed, buf + seed % 16, n));
	}
	free(buf);
}

/* Chaining: the CRC of a split buffer equals the CRC of the whole, on both paths. */
static void test_chaining(void **state)
{
	uint8_t *buf = random_buf(70000, 3);
	uint32_t whole = km_crc32c_table(0, buf, 70000);
	static const size_t cuts[] = {0, 1, 7, 8, 767, 768, 24575, 24576, 40000, 69999, 70000};
	for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
		size_t c = cuts[i];
		assert_int_equal(km_crc32c_hw(km_crc32c_hw(0, buf, c), buf + c, 70000 - c), whole);
		assert_int_equal(km_crc32c_table(km_crc32c_table(0, buf, c), buf + c, 70000 - c), whole);
	}
	free(buf);
}

static void test_force_table(void **state)
{
	uint8_t *buf = random_buf(5000, 4);
	uint32_t a = km_crc32c(0, buf, 5000);
	km_crc32c_force_table(true);
	assert_string_equal(km_crc32c_impl(), "table");
	assert_int_equal(km_crc32c(0, buf, 5000), a);
	km_crc32c_force_table(false);
	assert_string_equal(km_crc32c_impl(), km_crc32c_hw_available() ? "sse4.2" : "table");
	/* A flipped bit changes the CRC. */
	buf[2500] ^= 0x10;
	assert_int_not_equal(km_crc32c(0, buf, 5000), a);
	free(buf);
}

/* Patching a changed field into a CRC equals recomputing it, at any place, length and size. */
static void test_patch(void **state)
{
	static const size_t lens[] = {1, 2, 40, 61, 1000, 70000};
	(void)state;
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		size_t len = lens[i];
		uint8_t *buf = random_buf(len, (unsigned)(10 + i));
		for (size_t n = 1; n <= 20 && n <= len; n += 3) {
			size_t ats[] = {0, (len - n) / 2, len - n};
			for (size_t k = 0; k < 3; k++) {
				uint8_t before[20], after[20];
				uint32_t crc = km_crc32c(0, buf, len);
				memcpy(before, buf + ats[k], n);
				for (size_t j = 0; j < n; j++)
					after[j] = (uint8_t)(before[j] ^ (0x5a + j));
				memcpy(buf + ats[k], after, n);
				assert_int_equal(km_crc32c_patch(crc, len, ats[k], before, after, n), km_crc32c(0, buf, len));
				/* Unchanged bytes change nothing. */
				assert_int_equal(km_crc32c_patch(crc, len, ats[k], before, before, n), crc);
				memcpy(buf + ats[k], before, n);
			}
		}
		free(buf);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_vectors_table),
		cmocka_unit_test(test_vectors_hw),
		cmocka_unit_test(test_vectors_default),
		cmocka_unit_test(test_hw_detected),
		cmocka_unit_test(test_hw_vs_table_all_lengths),
		cmocka_unit_test(test_hw_vs_table_long),
		cmocka_unit_test(test_chaining),
		cmocka_unit_test(test_force_table),
		cmocka_unit_test(test_patch),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
