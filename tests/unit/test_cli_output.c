/* kmirror CLI output: JSON escaping and structure, aligned tables, times. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "cli/cli.h"

typedef struct membuf {
	char *buf;
	size_t len;
	FILE *f;
} membuf;

static void mb_open(membuf *m)
{
	m->buf = NULL;
	m->len = 0;
	m->f = open_memstream(&m->buf, &m->len);
	assert_non_null(m->f);
}

static char *mb_close(membuf *m)
{
	fclose(m->f);
	return m->buf;
}

static char *escaped(const char *p, size_t len)
{
	membuf m;
	mb_open(&m);
	km_cli_json_escape(m.f, p, len);
	return mb_close(&m);
}

#define ASSERT_ESCAPE(in, len, want)            \
	do {                                    \
		char *s_ = escaped(in, len);    \
		assert_string_equal(s_, want);  \
		free(s_);                       \
	} while (0)

static void test_escape(void **state)
{
	(void)state;
	ASSERT_ESCAPE("plain", 5, "\"plain\"");
	ASSERT_ESCAPE("q\"b\\s/", 6, "\"q\\\"b\\\\s/\"");
	ASSERT_ESCAPE("\n\r\t\b\f", 5, "\"\\n\\r\\t\\b\\f\"");
	ASSERT_ESCAPE("\x01\x1f\x7f", 3, "\"\\u0001\\u001f\\u007f\"");
	ASSERT_ESCAPE("nul\0in", 6, "\"nul\\u0000in\"");
	/* Valid UTF-8 passes through; stray, overlong, surrogate and truncated sequences become U+FFFD. */
	ASSERT_ESCAPE("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 14, "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"");
	ASSERT_ESCAPE("\xff", 1, "\"\\ufffd\"");
	ASSERT_ESCAPE("\xc0\xaf", 2, "\"\\ufffd\\ufffd\"");
	ASSERT_ESCAPE("\xed\xa0\x80", 3, "\"\\ufffd\\ufffd\\ufffd\"");
	ASSERT_ESCAPE("a\xe2\x82", 3, "\"a\\ufffd\\ufffd\"");
	ASSERT_ESCAPE("\xf4\x90\x80\x80", 4, "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");
}

static void test_document(void **state)
{
	membuf m;
	km_cli_json j;
	char *s;
	(void)state;

	mb_open(&m);
	km_cli_json_init(&j, m.f);
	km_cli_json_obj(&j);
	km_cli_json_key(&j, "mirrors");
	km_cli_json_arr(&j);
	km_cli_json_obj(&j);
	km_cli_json_key(&j, "name");
	km_cli_json_str(&j, "m\"1");
	km_cli_json_key(&j, "error");
	km_cli_json_null(&j);
	km_cli_json_key(&j, "n");
	km_cli_json_int(&j, -1);
	km_cli_json_key(&j, "big");
	km_cli_json_int(&j, INT64_MAX);
	km_cli_json_key(&j, "ok");
	km_cli_json_bool(&j, true);
	km_cli_json_key(&j, "nullstr");
	km_cli_json_strn(&j, NULL, -1);
	km_cli_json_key(&j, "empty");
	km_cli_json_arr(&j);
	km_cli_json_arr_end(&j);
	km_cli_json_obj_end(&j);
	km_cli_json_str(&j, "second");
	km_cli_json_int(&j, 3);
	km_cli_json_arr_end(&j);
	km_cli_json_obj_end(&j);
	s = mb_close(&m);
	assert_string_equal(s, "{\"mirrors\":[{\"name\":\"m\\\"1\",\"error\":null,\"n\":-1,\"big\":9223372036854775807,"
			       "\"ok\":true,\"nullstr\":null,\"empty\":[]},\"second\",3]}\n");
	free(s);
}

static void test_table(void **state)
{
	static const char *const hdr[] = {"TOPIC", "P", "MESSAGE"};
	const char *r1[] = {"orders", "0", "line\nbreak"};
	const char *r2[] = {"a", "12", NULL};
	km_cli_table t;
	membuf m;
	char *s;
	(void)state;

	assert_true(km_cli_table_init(&t, 3, hdr));
	assert_true(km_cli_table_row(&t, r1));
	assert_true(km_cli_table_row(&t, r2));
	mb_open(&m);
	km_cli_table_print(&t, m.f);
	s = mb_close(&m);
	/* Columns padded to the widest cell, two spaces apart; the last column unpadded; a newline
	 * in a cell cannot split the row; NULL prints as "-". */
	assert_string_equal(s, "TOPIC   P   MESSAGE\n"
			       "orders  0   line break\n"
			       "a       12  -\n");
	free(s);
	km_cli_table_free(&t);
}

static void test_time(void **state)
{
	char buf[32];
	(void)state;
	km_cli_format_time(-1, buf, sizeof(buf));
	assert_string_equal(buf, "-");
	km_cli_format_time(0, buf, sizeof(buf));
	assert_string_equal(buf, "1970-01-01T00:00:00Z");
	km_cli_format_time(1767322245123LL, buf, sizeof(buf));
	assert_string_equal(buf, "2026-01-02T02:50:45Z");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_escape),
		cmocka_unit_test(test_document),
		cmocka_unit_test(test_table),
		cmocka_unit_test(test_time),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
