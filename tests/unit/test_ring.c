/* Unit tests for the growable FIFO ring (kmirror/ring.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kmirror/ring.h"

typedef struct item {
	int32_t id;
	char pad[13]; /* an odd size: elements are copied whole */
} item;

KM_RING_TYPED(items, item)

static void test_fifo_order_across_growth(void **state)
{
	km_ring r;
	int32_t next_in = 0, next_out = 0;
	(void)state;
	items_init(&r);
	assert_null(items_front(&r));
	/* Push and pop in uneven rounds so that the ring wraps before and after it grows. */
	for (int round = 0; round < 50; round++) {
		for (int i = 0; i < round % 7 + 3; i++) {
			item it = {.id = next_in++};
			it.pad[12] = (char)it.id;
			assert_true(items_push(&r, &it));
		}
		for (int i = 0; i < round % 5 + 1 && items_count(&r); i++) {
			item *f = items_front(&r);
			assert_int_equal(f->id, next_out);
			assert_int_equal(f->pad[12], (char)next_out);
			items_pop(&r);
			next_out++;
		}
		for (size_t i = 0; i < items_count(&r); i++)
			assert_int_equal(items_at(&r, i)->id, next_out + (int32_t)i);
	}
	assert_int_equal(items_count(&r), (size_t)(next_in - next_out));
	assert_true(r.cap >= r.count && r.cap > 8);
	km_ring_free(&r);
	assert_int_equal(items_count(&r), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fifo_order_across_growth),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
