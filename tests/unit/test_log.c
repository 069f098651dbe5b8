/* Unit tests of the log: km_log_escape (a peer's text made fit for one line) and a line written with it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "kmirror/log.h"

static const char *esc(char *buf, size_t cap, const char *s)
{
	return km_log_escape(buf, cap, s, s ? (int32_t)strlen(s) : 0);
}

static void test_escape(void **state)
{
	char b[64];
	static const char bin[] = {'a', 0, 'b', 0x7f, (char)0xc3, (char)0xa9};
	(void)state;
	assert_string_equal(esc(b, sizeof(b), "orders-1.x_y"), "orders-1.x_y");
	assert_string_equal(esc(b, sizeof(b), "a\nb\r\tc"), "a\\nb\\r\\tc");
	assert_string_equal(esc(b, sizeof(b), "say \"hi\" \\o/"), "say \\\"hi\\\" \\\\o/");
	assert_string_equal(esc(b, sizeof(b), "\x1b[2J\x07"), "\\x1b[2J\\x07");
	/* NUL, DEL and bytes above ASCII (UTF-8, C1 controls) as hex. */
	assert_string_equal(km_log_escape(b, sizeof(b), bin, sizeof(bin)), "a\\x00b\\x7f\\xc3\\xa9");
	/* Nothing to show. */
	assert_string_equal(km_log_escape(b, sizeof(b), NULL, 5), "");
	assert_string_equal(km_log_escape(b, sizeof(b), "abc", -1), "");
	assert_string_equal(km_log_escape(b, sizeof(b), "abc", 0), "");
}

static void test_escape_bounded(void **state)
{
	char b[64], small[10];
	char big[KM_LOG_ESCAPED_SIZE(3)];
	(void)state;
	/* It fits exactly: no cut mark. */
	assert_string_equal(esc(b, 5, "abcd"), "abcd");
	/* It does not: cut, with the mark, within the buffer. */
	assert_string_equal(esc(small, sizeof(small), "abcdefghijkl"), "abcdef...");
	assert_string_equal(esc(b, 5, "abcde"), "a...");
	/* An escape is never cut in half. */
	assert_string_equal(esc(small, 8, "\n\n\n\n"), "\\n\\n...");
	assert_string_equal(esc(small, 9, "\x01\x02"), "\\x01\\x02");
	assert_string_equal(esc(small, 8, "\x01\x02"), "\\x01...");
	/* KM_LOG_ESCAPED_SIZE(n) holds any n bytes whole. */
	assert_string_equal(esc(big, sizeof(big), "\x01\x02\x03"), "\\x01\\x02\\x03");
}

/* A line with a client id that holds a newline stays one line. */
static void test_one_line(void **state)
{
	static const char cid[] = "rdkafka\n2024-01-01T00:00:00.000Z level=error msg=\"forged\"";
	char path[] = "/tmp/km-log-XXXXXX", line[4096], id[KM_LOG_ESCAPED_SIZE(64)];
	int fd = mkstemp(path), saved, lines = 0;
	FILE *f;
	(void)state;

	assert_true(fd >= 0);
	fflush(stderr);
	saved = dup(2);
	assert_true(dup2(fd, 2) >= 0);
	km_log_write(KM_LOG_INFO, "proxy", 7, "refused Produce (client id \"%s\")", esc(id, sizeof(id), cid));
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	assert_non_null(f = fdopen(fd, "r"));
	rewind(f);
	while (fgets(line, sizeof(line), f)) {
		lines++;
		assert_non_null(strstr(line, " level=info comp=proxy conn=7 msg=\"refused Produce (client id \"rdkafka\\n"));
		assert_non_null(strstr(line, "level=error msg=\\\"forged\\\"\")\"\n"));
	}
	assert_int_equal(lines, 1);
	fclose(f);
	unlink(path);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_escape),
		cmocka_unit_test(test_escape_bounded),
		cmocka_unit_test(test_one_line),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
