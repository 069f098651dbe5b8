/* Unit tests for the API table: Produce acks, and how the features' stages compose into rows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kmirror/net.h"
#include "kmirror/wire.h"
#include "proxy/apis.h"

/* A request header as a client writes it (header v2: with one unknown tagged field, which must be skipped). */
static void build_header(km_wr *w, int16_t key, int16_t ver, int32_t corr, const char *client_id, int hv)
{
	km_wr_i16(w, key);
	km_wr_i16(w, ver);
	km_wr_i32(w, corr);
	km_wr_string(w, false, km_str_c(client_id));
	if (hv >= 2) {
		km_wr_uvarint(w, 1);
		km_wr_uvarint(w, 5);
		km_wr_uvarint(w, 2);
		km_wr_u16(w, 0xabcd);
	}
}

static void produce_request(km_wr *w, int16_t ver, const char *txn, int16_t acks)
{
	bool flex = ver >= 9;
	build_header(w, 0, ver, 5, "producer-1", flex ? 2 : 1);
	if (ver >= 3)
		km_wr_string(w, flex, km_str_c(txn));
	km_wr_i16(w, acks);
	km_wr_i32(w, 30000);
}

static void test_produce_acks(void **state)
{
	static const struct {
		int16_t ver;
		const char *txn;
		int16_t acks;
	} cases[] = {{2, NULL, 0}, {3, NULL, 0}, {3, "txn-a", 1}, {7, "t", -1}, {8, NULL, 0},
		     {9, NULL, 0}, {9, "transactional-id-x", 1}, {11, NULL, -1}, {11, "x", 0}};

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		km_wr w;
		int16_t acks = 99;
		km_wr_init(&w);
		produce_request(&w, cases[i].ver, cases[i].txn, cases[i].acks);
		assert_int_equal(km_proxy_produce_acks(w.buf, w.len, cases[i].ver, &acks), KM_OK);
		assert_int_equal(acks, cases[i].acks);
		/* Cut before acks: must fail, not guess. */
		assert_int_not_equal(km_proxy_produce_acks(w.buf, w.len - 5, cases[i].ver, &acks), KM_OK);
		km_wr_free(&w);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_produce_acks),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
