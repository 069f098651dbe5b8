/* Unit tests for the wire primitives: round trips, varint edges, bounds and sticky errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "kmirror/error.h"
#include "kmirror/wire.h"

static void test_fixed_roundtrip(void **state)
{
	km_wr w;
	km_rd r;
	km_uuid u, u2;
	int8_t i8;
	int16_t i16;
	int32_t i32;
	int64_t i64;
	double d;
	bool b;

	for (int i = 0; i < 16; i++)
		u.b[i] = (uint8_t)(i * 17);
	km_wr_init(&w);
	km_wr_i8(&w, -5);
	km_wr_i16(&w, -30000);
	km_wr_i32(&w, INT32_MIN);
	km_wr_i64(&w, INT64_MAX);
	km_wr_f64(&w, 3.25);
	km_wr_bool(&w, true);
	km_wr_uuid(&w, &u);
	assert_true(km_wr_ok(&w));
	assert_int_equal(w.len, 1 + 2 + 4 + 8 + 8 + 1 + 16);

	km_rd_init(&r, w.buf, w.len);
	assert_true(km_rd_i8(&r, "a", &i8));
	assert_true(km_rd_i16(&r, "b", &i16));
	assert_true(km_rd_i32(&r, "c", &i32));
	assert_true(km_rd_i64(&r, "d", &i64));
	assert_true(km_rd_f64(&r, "e", &d));
	assert_true(km_rd_bool(&r, "f", &b));
	assert_true(km_rd_uuid(&r, "g", &u2));
	assert_int_equal(i8, -5);
	assert_int_equal(i16, -30000);
	assert_int_equal(i32, INT32_MIN);
	assert_true(i64 == INT64_MAX);
	assert_true(d == 3.25);
	assert_true(b);
	assert_memory_equal(u.b, u2.b, 16);
	assert_int_equal(km_rd_left(&r), 0);
	km_wr_free(&w);
}

static void test_varints(void **state)
{
	static const int64_t vals[] = {0, 1, -1, 63, -64, 64, 300, INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN};
	for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
		km_wr w;
		km_rd r;
		int64_t got;
		km_wr_init(&w);
		km_wr_varlong(&w, vals[i]);
		assert_int_equal(w.len, km_sz_varlong(vals[i]));
		km_rd_init(&r, w.buf, w.len);
		assert_true(km_rd_varlong(&r, "v", &got));
		assert_true(got == vals[i]);
		if (vals[i] >= INT32_MIN && vals[i] <= INT32_MAX) {
			int32_t g32;
			km_wr_free(&w);
			km_wr_init(&w);
			km_wr_varint(&w, (int32_t)vals[i]);
			assert_int_equal(w.len, km_sz_varint((int32_t)vals[i]));
			km_rd_init(&r, w.buf, w.len);
			assert_true(km_rd_varint(&r, "v", &g32));
			assert_int_equal(g32, (int32_t)vals[i]);
		}
		km_wr_free(&w);
	}
	/* Known encodings: zigzag(-1) = 1, 300 = 0xac 0x02 unsigned. */
	{
		km_wr w;
		km_wr_init(&w);
		km_wr_varint(&w, -1);
		km_wr_uvarint(&w, 300);
		assert_int_equal(w.len, 3);
		assert_int_equal(w.buf[0], 0x01);
		assert_int_equal(w.buf[1], 0xac);
		assert_int_equal(w.buf[2], 0x02);
		km_wr_free(&w);
	}
}

static void test_varint_too_long(void **state)
{
	static const uint8_t six[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
	km_rd r;
	uint32_t v;
	km_rd_init(&r, six, sizeof(six));
	assert_false(km_rd_uvarint(&r, "Count", &v));
	assert_int_equal(r.err, KM_ERR_DECODE);
	assert_string_equal(r.err_field, "Count");
}

static void test_uuids(void **state)
{
	km_uuid z = {{0}}, a = {{0}}, b = {{0}};

	(void)state;
	a.b[15] = 1;
	b.b[15] = 1;
	assert_true(km_uuid_is_zero(&z));
	assert_false(km_uuid_is_zero(&a));
	assert_true(km_uuid_eq(&a, &b));
	b.b[0] = 9;
	assert_false(km_uuid_eq(&a, &b));
	assert_false(km_uuid_eq(&a, &z));
	/* Printed as Kafka's tools print them: URL-safe base64, no padding ("-" and "_", not "+" and "/"). */
	{
		km_uuid u = {{0xfb, 0xff, 0xbf, 0x40, 0x41, 0x42, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48, 0x49, 0x4a, 0x4b, 0x4c}};
		char out[23];
		km_uuid_str(&u, out);
		assert_string_equal(out, "-_-_QEFCQ0RFRkdISUpLTA");
		km_uuid_str(&z, out);
		assert_string_equal(out, "AAAAAAAAAAAAAAAAAAAAAA");
	}
}

static void test_strings(void **state)
{
	km_wr w;
	km_rd r;
	km_str s;
	km_wr_init(&w);
	km_wr_string(&w, false, km_str_c("hello"));
	km_wr_string(&w, true, km_str_c("hi"));
	km_wr_string(&w, true, KM_STR_NULL);
	km_wr_string(&w, false, KM_STR_NULL);
	assert_int_equal(w.len, km_sz_string(false, km_str_c("hello")) + km_sz_string(true, km_str_c("hi")) +
					km_sz_string(true, KM_STR_NULL) + km_sz_string(false, KM_STR_NULL));
	km_rd_init(&r, w.buf, w.len);
	assert_true(km_rd_string(&r, "a", false, false, &s));
	assert_true(km_str_eq_c(s, "hello"));
	/* The string borrows from the buffer. */
	assert_ptr_equal(s.p, (const char *)w.buf + 2);
	assert_true(km_rd_string(&r, "b", true, false, &s));
	assert_true(km_str_eq_c(s, "hi"));
	assert_true(km_rd_string(&r, "c", true, true, &s));
	assert_int_equal(s.len, -1);
	/* A null where the field is not nullable is an error naming the field. */
	assert_false(km_rd_string(&r, "ClientId", false, false, &s));
	assert_string_equal(r.err_field, "ClientId");
	km_wr_free(&w);
}

static void test_truncation_is_sticky(void **state)
{
	static const uint8_t buf[] = {0x00, 0x01, 0x02};
	km_rd r;
	int32_t v;
	int8_t b;
	km_rd_init(&r, buf, sizeof(buf));
	assert_false(km_rd_i32(&r, "Size", &v));
	assert_int_equal(r.err_pos, 0);
	assert_string_equal(r.err_what, "truncated");
	/* Later reads fail too, even ones that would fit. */
	assert_false(km_rd_i8(&r, "Other", &b));
	assert_string_equal(r.err_field, "Size");
}

static void test_array_len_capped(void **state)
{
	/* A count of 1,000,000 with 4 bytes left must fail before anyone allocates. */
	uint8_t buf[8];
	km_rd r;
	int32_t n;
	km_put_be32(buf, 1000000);
	memset(buf + 4, 0, 4);
	km_rd_init(&r, buf, sizeof(buf));
	assert_false(km_rd_array_len(&r, "Topics", false, false, 4, &n));
	assert_string_equal(r.err_field, "Topics");
	/* One element of 4 bytes fits. */
	km_put_be32(buf, 1);
	km_rd_init(&r, buf, sizeof(buf));
	assert_true(km_rd_array_len(&r, "Topics", false, false, 4, &n));
	assert_int_equal(n, 1);
}

static void test_sub_reader(void **state)
{
	static const uint8_t buf[] = {0, 0, 0, 1, 0xaa, 0xbb};
	km_rd r, sub;
	int32_t v;
	int8_t b;
	km_rd_init(&r, buf, sizeof(buf));
	assert_true(km_rd_sub(&r, "Body", 5, &sub));
	assert_true(km_rd_i32(&sub, "x", &v));
	assert_true(km_rd_i8(&sub, "y", &b));
	assert_false(km_rd_i8(&sub, "z", &b));
	assert_int_equal(sub.err_pos, 5);
	assert_int_equal(km_rd_left(&r), 1);
}

static void test_fixed_writer_overflow(void **state)
{
	uint8_t buf[3];
	km_wr w;
	km_wr_init_fixed(&w, buf, sizeof(buf));
	km_wr_i16(&w, 1);
	assert_true(km_wr_ok(&w));
	km_wr_i32(&w, 2);
	assert_false(km_wr_ok(&w));
	assert_int_equal(w.err, KM_ERR_TOO_LARGE);
	assert_int_equal(w.len, 2);
}

static void test_errors_table(void **state)
{
	assert_string_equal(km_err_name(6), "NOT_LEADER_OR_FOLLOWER");
	assert_true(km_err_retriable(6));
	assert_false(km_err_retriable(KM_KAFKA_UNSUPPORTED_VERSION));
	assert_string_equal(km_err_name(KM_KAFKA_UNSUPPORTED_VERSION), "UNSUPPORTED_VERSION");
	assert_string_equal(km_err_name(KM_KAFKA_INVALID_REQUEST), "INVALID_REQUEST");
	/* Unknown codes are not retriable. */
	assert_false(km_err_retriable(5000));
	assert_false(km_err_is_known(5000));
	assert_string_equal(km_err_name(KM_ERR_DECODE), "KM_ERR_DECODE");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fixed_roundtrip),   cmocka_unit_test(test_varints),
		cmocka_unit_test(test_varint_too_long),   cmocka_unit_test(test_strings), cmocka_unit_test(test_uuids),
		cmocka_unit_test(test_truncation_is_sticky), cmocka_unit_test(test_array_len_capped),
		cmocka_unit_test(test_sub_reader),        cmocka_unit_test(test_fixed_writer_overflow),
		cmocka_unit_test(test_errors_table),
	};
	return cmocka_run_group_tests_name("wire", tests, NULL, NULL);
}
