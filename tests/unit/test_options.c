/* Unit tests for the option engine over a table of its own (the shape of the future per-mirror options). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "kmirror/options.h"
#include "unit_tmpfile.h"

/* A second struct and table, unrelated to km_config: two host:port lists, an enum, a secret. */
typedef struct test_opts {
	char *name;
	int64_t max_lag;
	bool enabled;
	km_hostport bind;
	km_hostport sources[4];
	int nsources;
	km_hostport targets[2];
	int ntargets;
	int64_t mode;
	char *codec;
	char *token;
} test_opts;

#define OFF(f) offsetof(test_opts, f)

static const char *const mode_names[] = {"copy", "follow", "pause"};
static const km_opt_enum modes = {"mirror mode", mode_names, 3, false};
static const char *const codec_names[] = {"LZ4", "ZSTD"};
static const km_opt_enum codecs = {NULL, codec_names, 2, true};

static const km_option rows[] = {
	{.name = "name", .type = KM_OPT_STRING, .offset = OFF(name), .def = "m1", .doc = "Mirror name."},
	{.name = "max_lag", .type = KM_OPT_INT, .offset = OFF(max_lag), .def = "100", .min = -5, .max = 1000,
	 .reloadable = true, .doc = "Lag bound."},
	{.name = "enabled", .type = KM_OPT_BOOL, .offset = OFF(enabled), .def = "true", .reloadable = true,
	 .doc = "On or off."},
	{.name = "bind", .type = KM_OPT_HOSTPORT, .offset = OFF(bind), .def = "", .doc = "Local address."},
	{.name = "sources", .type = KM_OPT_HOSTPORT_LIST, .offset = OFF(sources), .count_offset = OFF(nsources),
	 .def = "s1:1,s2:2", .max = 4, .reloadable = true, .doc = "Source cluster."},
	{.name = "targets", .type = KM_OPT_HOSTPORT_LIST, .offset = OFF(targets), .count_offset = OFF(ntargets),
	 .def = "", .max = 2, .doc = "Target cluster."},
	{.name = "mode", .type = KM_OPT_ENUM, .offset = OFF(mode), .def = "follow", .choices = &modes,
	 .reloadable = true, .doc = "What the mirror does."},
	{.name = "codec", .type = KM_OPT_STRING, .offset = OFF(codec), .def = "", .choices = &codecs,
	 .reloadable = true, .doc = "Compression."},
	{.name = "token", .type = KM_OPT_STRING, .offset = OFF(token), .def = "", .reloadable = true, .secret = true,
	 .doc = "Secret token."},
};

static const km_opt_table table = {rows, sizeof(rows) / sizeof(rows[0]), sizeof(test_opts)};

static char *fmt(const test_opts *o, const char *name)
{
	static char buf[512];
	km_opt_format(km_opt_find(&table, name), o, buf, sizeof(buf));
	return buf;
}

static void test_defaults(void **state)
{
	test_opts o;

	assert_int_equal(km_opt_init(&table, &o), KM_OK);
	assert_string_equal(o.name, "m1");
	assert_int_equal(o.max_lag, 100);
	assert_true(o.enabled);
	assert_int_equal(o.bind.port, 0);
	assert_int_equal(o.nsources, 2);
	assert_string_equal(o.sources[1].host, "s2");
	assert_int_equal(o.ntargets, 0);
	assert_int_equal(o.mode, 1);
	assert_null(o.codec);
	assert_null(o.token);
	for (size_t i = 0; i < table.count; i++)
		assert_string_equal(fmt(&o, rows[i].name), rows[i].def);
	km_opt_free(&table, &o);
}

static void test_types_and_bounds(void **state)
{
	test_opts o;
	char err[256];

	assert_int_equal(km_opt_init(&table, &o), KM_OK);
	/* int: bounds are inclusive, junk and overflow refused, a failure changes nothing */
	assert_int_equal(km_opt_set(&table, &o, "max_lag", "-5", err, sizeof(err)), KM_OK);
	assert_int_equal(o.max_lag, -5);
	assert_int_equal(km_opt_set(&table, &o, "max_lag", "1000", err, sizeof(err)), KM_OK);
	assert_int_equal(km_opt_set(&table, &o, "max_lag", "1001", err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "max_lag: 1001 is out of range [-5, 1000]"));
	assert_int_equal(km_opt_set(&table, &o, "max_lag", "-6", err, sizeof(err)), KM_ERR_CONFIG);
	assert_int_equal(km_opt_set(&table, &o, "max_lag", "", err, sizeof(err)), KM_ERR_CONFIG);
	assert_int_equal(km_opt_set(&table, &o, "max_lag", "99999999999999999999", err, sizeof(err)), KM_ERR_CONFIG);
	assert_int_equal(o.max_lag, 1000);
	/* bool */
	assert_int_equal(km_opt_set(&table, &o, "enabled", "OFF", err, sizeof(err)), KM_OK);
	assert_false(o.enabled);
	assert_int_equal(km_opt_set(&table, &o, "enabled", "1", err, sizeof(err)), KM_OK);
	assert_true(o.enabled);
	assert_int_equal(km_opt_set(&table, &o, "enabled", "2", err, sizeof(err)), KM_ERR_CONFIG);
	/* host:port, IPv6 in brackets, empty clears */
	assert_int_equal(km_opt_set(&table, &o, "bind", "[::1]:99", err, sizeof(err)), KM_OK);
	assert_string_equal(o.bind.host, "::1");
	assert_string_equal(fmt(&o, "bind"), "[::1]:99");
	assert_int_equal(km_opt_set(&table, &o, "bind", "host:", err, sizeof(err)), KM_ERR_CONFIG);
	/* A listener's ":PORT" is every IPv4 address. */
	assert_int_equal(km_opt_set(&table, &o, "bind", ":1", err, sizeof(err)), KM_OK);
	assert_string_equal(fmt(&o, "bind"), "0.0.0.0:1");
	assert_int_equal(km_opt_set(&table, &o, "bind", "", err, sizeof(err)), KM_OK);
	assert_int_equal(o.bind.port, 0);
	/* two lists: each writes its own array and count */
	assert_int_equal(km_opt_set(&table, &o, "targets", "t1:9, [fe80::1]:10", err, sizeof(err)), KM_OK);
	assert_int_equal(o.ntargets, 2);
	assert_int_equal(o.nsources, 2);
	assert_string_equal(o.sources[0].host, "s1");
	assert_string_equal(o.targets[1].host, "fe80::1");
	assert_string_equal(fmt(&o, "targets"), "t1:9,[fe80::1]:10");
	assert_int_equal(km_opt_set(&table, &o, "sources", "a:1 b:2,c:3,d:4", err, sizeof(err)), KM_OK);
	assert_int_equal(o.nsources, 4);
	assert_int_equal(o.ntargets, 2);
	/* capacity, port 0 and junk refused whole */
	assert_int_equal(km_opt_set(&table, &o, "targets", "a:1,b:2,c:3", err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "more than 2 entries"));
	assert_int_equal(km_opt_set(&table, &o, "targets", "a:1,b:0", err, sizeof(err)), KM_ERR_CONFIG);
	assert_int_equal(km_opt_set(&table, &o, "targets", "a:1,b", err, sizeof(err)), KM_ERR_CONFIG);
	assert_int_equal(o.ntargets, 2);
	assert_string_equal(o.targets[0].host, "t1");
	assert_int_equal(km_opt_set(&table, &o, "targets", "", err, sizeof(err)), KM_OK);
	assert_int_equal(o.ntargets, 0);
	/* enum: any case, named in the error, its own type name */
	assert_int_equal(km_opt_set(&table, &o, "mode", "PAUSE", err, sizeof(err)), KM_OK);
	assert_int_equal(o.mode, 2);
	assert_string_equal(fmt(&o, "mode"), "pause");
	assert_int_equal(km_opt_set(&table, &o, "mode", "stop", err, sizeof(err)), KM_ERR_CONFIG);
	assert_string_equal(err, "mode: 'stop' is not one of copy, follow, pause");
	assert_string_equal(km_opt_type_name(km_opt_find(&table, "mode")), "mirror mode");
	/* a string with a name table: exact case, empty allowed, typed as a string */
	assert_int_equal(km_opt_set(&table, &o, "codec", "zstd", err, sizeof(err)), KM_ERR_CONFIG);
	assert_int_equal(km_opt_set(&table, &o, "codec", "ZSTD", err, sizeof(err)), KM_OK);
	assert_string_equal(o.codec, "ZSTD");
	assert_int_equal(km_opt_set(&table, &o, "codec", "", err, sizeof(err)), KM_OK);
	assert_null(o.codec);
	assert_string_equal(km_opt_type_name(km_opt_find(&table, "codec")), "string");
	/* unknown names */
	assert_int_equal(km_opt_set(&table, &o, "nope", "1", err, sizeof(err)), KM_ERR_CONFIG);
	assert_string_equal(err, "unknown option 'nope'");
	km_opt_free(&table, &o);
}

static void test_secret(void **state)
{
	test_opts o;
	char err[256], *text = NULL;
	size_t len;
	FILE *f;

	assert_int_equal(km_opt_init(&table, &o), KM_OK);
	assert_string_equal(fmt(&o, "token"), "");
	assert_int_equal(km_opt_set(&table, &o, "token", "hunter2", err, sizeof(err)), KM_OK);
	assert_string_equal(o.token, "hunter2");
	assert_string_equal(fmt(&o, "token"), KM_OPT_SECRET_MASK);
	f = open_memstream(&text, &len);
	km_opt_write_values(&table, &o, f);
	fclose(f);
	assert_null(strstr(text, "hunter2"));
	assert_non_null(strstr(text, "token = ********\n"));
	assert_non_null(strstr(text, "sources = s1:1,s2:2\n"));
	free(text);
	km_opt_free(&table, &o);
}

static void test_files(void **state)
{
	test_opts o;
	char err[256];
	char *good = write_tmp("# a mirror\n\n  name = \"orders\"  \ntargets=x:1\ncodec = \"\"\nmax_lag = 7\n");
	char *bad_value = write_tmp("name = changed\nmax_lag = 7\nmode = sideways\nenabled = false\n");
	char *no_equals = write_tmp("name = changed\njust words\n");
	char *unknown = write_tmp("\n\n\nwhat = 1\n");
	char long_line[20000];

	assert_int_equal(km_opt_init(&table, &o), KM_OK);
	assert_int_equal(km_opt_load_file(&table, &o, good, err, sizeof(err)), KM_OK);
	assert_string_equal(o.name, "orders");
	assert_int_equal(o.ntargets, 1);
	assert_int_equal(o.max_lag, 7);
	/* the first bad line fails the file, says where, and nothing of the file is kept */
	assert_int_equal(km_opt_load_file(&table, &o, bad_value, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, ":3: mode: 'sideways' is not one of"));
	assert_string_equal(o.name, "orders");
	assert_true(o.enabled);
	assert_int_equal(km_opt_load_file(&table, &o, no_equals, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, ":2: expected 'key = value'"));
	assert_string_equal(o.name, "orders");
	assert_int_equal(km_opt_load_file(&table, &o, unknown, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, ":4: unknown option 'what'"));
	assert_int_equal(km_opt_load_file(&table, &o, "/nonexistent/x.conf", err, sizeof(err)), KM_ERR_CONFIG);
	/* A line of any length loads whole (what --print-config prints of a long value must load). */
	memcpy(long_line, "name = ", 7);
	memset(long_line + 7, 'x', sizeof(long_line) - 9);
	long_line[sizeof(long_line) - 2] = '\n';
	long_line[sizeof(long_line) - 1] = '\0';
	{
		char *huge = write_tmp(long_line);
		assert_int_equal(km_opt_load_file(&table, &o, huge, err, sizeof(err)), KM_OK);
		assert_int_equal(strlen(o.name), sizeof(long_line) - 9);
		unlink(huge);
		free(huge);
	}
	/* A NUL byte is refused where it is (it would cut the line short). */
	{
		char *nul = write_tmp("max_lag = 8\nname = ab");
		FILE *f = fopen(nul, "a");
		assert_non_null(f);
		assert_int_equal(fwrite("\0c\n", 1, 3, f), 3);
		assert_int_equal(fclose(f), 0);
		assert_int_equal(km_opt_load_file(&table, &o, nul, err, sizeof(err)), KM_ERR_CONFIG);
		assert_non_null(strstr(err, ":2: a NUL byte in the line"));
		assert_int_equal(o.max_lag, 7);
		unlink(nul);
		free(nul);
	}
	km_opt_free(&table, &o);
	unlink(good);
	unlink(bad_value);
	unlink(no_equals);
	unlink(unknown);
	free(good);
	free(bad_value);
	free(no_equals);
	free(unknown);
}

/*
 * A string km_opt_write_values prints loads back the same: blanks at either end, or a value in
 * double quotes of its own, go in double quotes (the file's reader trims a value, then drops one
 * pair of quotes); anything else as it is.
 */
static void test_write_values_loads_back(void **state)
{
	static const char *const values[][2] = {
		{" ", "name = \" \"\n"},       {" x", "name = \" x\"\n"},     {"x\t", "name = \"x\t\"\n"},
		{"\"x\"", "name = \"\"x\"\"\n"}, {"\"\"", "name = \"\"\"\"\n"}, {"\"", "name = \"\n"},
		{"a \"b\" c", "name = a \"b\" c\n"}, {"\"x", "name = \"x\n"},     {"x = y # z", "name = x = y # z\n"},
	};
	(void)state;

	for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
		test_opts o, back;
		char err[256], *text = NULL, *path;
		size_t len;
		FILE *f;

		assert_int_equal(km_opt_init(&table, &o), KM_OK);
		assert_int_equal(km_opt_set(&table, &o, "name", values[i][0], err, sizeof(err)), KM_OK);
		assert_non_null(f = open_memstream(&text, &len));
		km_opt_write_values(&table, &o, f);
		assert_int_equal(fclose(f), 0);
		assert_non_null(strstr(text, values[i][1]));
		path = write_tmp(text);
		assert_int_equal(km_opt_init(&table, &back), KM_OK);
		assert_int_equal(km_opt_load_file(&table, &back, path, err, sizeof(err)), KM_OK);
		assert_string_equal(back.name, values[i][0]);
		km_opt_free(&table, &o);
		km_opt_free(&table, &back);
		unlink(path);
		free(path);
		free(text);
	}
}

static void test_reload_and_copy(void **state)
{
	test_opts cur, next;
	char err[256];

	assert_int_equal(km_opt_init(&table, &cur), KM_OK);
	assert_int_equal(km_opt_set(&table, &cur, "token", "t", err, sizeof(err)), KM_OK);
	assert_int_equal(km_opt_copy(&table, &next, &cur), KM_OK);
	/* deep: the strings are the copy's own */
	assert_ptr_not_equal(next.name, cur.name);
	assert_ptr_not_equal(next.token, cur.token);
	for (size_t i = 0; i < table.count; i++)
		assert_true(km_opt_equal(&rows[i], &cur, &next));
	assert_int_equal(km_opt_check_reload(&table, &cur, &next, err, sizeof(err)), KM_OK);
	/* reloadable rows may change, secrets compare by value */
	assert_int_equal(km_opt_set(&table, &next, "sources", "z:1", err, sizeof(err)), KM_OK);
	assert_int_equal(km_opt_set(&table, &next, "token", "u", err, sizeof(err)), KM_OK);
	assert_false(km_opt_equal(km_opt_find(&table, "token"), &cur, &next));
	assert_int_equal(km_opt_check_reload(&table, &cur, &next, err, sizeof(err)), KM_OK);
	/* the first non-reloadable row that differs is named */
	assert_int_equal(km_opt_set(&table, &next, "targets", "q:1", err, sizeof(err)), KM_OK);
	assert_int_equal(km_opt_set(&table, &next, "name", "other", err, sizeof(err)), KM_OK);
	assert_int_equal(km_opt_check_reload(&table, &cur, &next, err, sizeof(err)), KM_ERR_CONFIG);
	assert_string_equal(err, "name cannot change on reload (restart needed)");
	assert_int_equal(km_opt_set(&table, &next, "name", "m1", err, sizeof(err)), KM_OK);
	assert_int_equal(km_opt_check_reload(&table, &cur, &next, err, sizeof(err)), KM_ERR_CONFIG);
	assert_string_equal(err, "targets cannot change on reload (restart needed)");
	/* a list of the same length but another entry differs */
	assert_int_equal(km_opt_set(&table, &cur, "targets", "q:2", err, sizeof(err)), KM_OK);
	assert_false(km_opt_equal(km_opt_find(&table, "targets"), &cur, &next));
	km_opt_free(&table, &next);
	km_opt_free(&table, &cur);
	assert_null(cur.name);
}

static void test_doc_table(void **state)
{
	char *text = NULL;
	size_t len;
	FILE *f = open_memstream(&text, &len);

	km_opt_write_doc(&table, f);
	fclose(f);
	assert_non_null(strstr(text, "| option | type | default | reloadable | description |\n"));
	assert_non_null(strstr(text, "| `max_lag` | integer | `100` | yes | Lag bound. |\n"));
	assert_non_null(strstr(text, "| `bind` | host:port | (empty) | no | Local address. |\n"));
	assert_non_null(strstr(text, "| `mode` | mirror mode | `follow` | yes | What the mirror does. |\n"));
	assert_non_null(strstr(text, "| `targets` | host:port list | (empty) | no | Target cluster. |\n"));
	free(text);
}

static void test_hostport(void **state)
{
	km_hostport hp;
	char buf[300];

	assert_true(km_hostport_parse("a.b:0", &hp));
	assert_false(km_hostport_parse("a.b:65536", &hp));
	assert_false(km_hostport_parse("[::1]99", &hp));
	assert_false(km_hostport_parse("a:1x", &hp));
	assert_true(km_hostport_parse("h:65535", &hp));
	km_hostport_format(&hp, buf, sizeof(buf));
	assert_string_equal(buf, "h:65535");
	/* Brackets only around an address: none inside a host, bracketed or not. */
	assert_false(km_hostport_parse("K::1]:8080", &hp));
	assert_false(km_hostport_parse("[[::1]:8080", &hp));
	assert_false(km_hostport_parse("[a]b]:1", &hp));
	assert_false(km_hostport_parse("a[b:1", &hp));
	assert_false(km_hostport_parse("[]:1", &hp));
	/* A host is letters, digits and . - _ : % (no blank, no quote); a port only digits. */
	assert_false(km_hostport_parse(" h:1", &hp));
	assert_false(km_hostport_parse("\"h\":1", &hp));
	assert_false(km_hostport_parse("a,b:1", &hp));
	assert_false(km_hostport_parse("h: 1", &hp));
	assert_false(km_hostport_parse("h:+1", &hp));
	assert_false(km_hostport_parse("h:-0", &hp));
	assert_false(km_hostport_parse("h:", &hp));
	assert_true(km_hostport_parse("::1:8080", &hp));
	assert_string_equal(hp.host, "::1");
	km_hostport_format(&hp, buf, sizeof(buf));
	assert_string_equal(buf, "[::1]:8080");
	assert_true(km_hostport_parse("[fe80::1%eth0]:9092", &hp));
	assert_string_equal(hp.host, "fe80::1%eth0");
	assert_int_equal(hp.port, 9092);
	assert_true(km_hostport_parse("[k-1.example]:7", &hp));
	km_hostport_format(&hp, buf, sizeof(buf));
	assert_string_equal(buf, "k-1.example:7");
	memset(&hp, 0, sizeof(hp));
	km_hostport_format(&hp, buf, sizeof(buf));
	assert_string_equal(buf, "");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults),        cmocka_unit_test(test_types_and_bounds),
		cmocka_unit_test(test_secret),          cmocka_unit_test(test_files),
		cmocka_unit_test(test_reload_and_copy), cmocka_unit_test(test_doc_table),
		cmocka_unit_test(test_hostport),        cmocka_unit_test(test_write_values_loads_back),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
