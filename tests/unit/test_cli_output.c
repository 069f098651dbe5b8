/* kmirror CLI output: JSON escaping and structure, aligned tables, times, describe's tables and JSON. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "cli/cli.h"
#include "kmirror/msg/describe_mirrors_response.h"

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

/* A DescribeMirrors answer as a kmirrord would send it: one mirror whose sync runs here (east), one
 * whose sync runs elsewhere (west), one from a kmirrord that reports no sync (old), one unknown. */
typedef struct describe_fixture {
	km_describe_mirrors_response r;
	km_describe_mirrors_response_described_mirror m[4];
	km_describe_mirrors_response_described_config c[2];
	km_describe_mirrors_response_described_topic t, fresh;
	km_describe_mirrors_response_described_partition p;
	km_describe_mirrors_response_metadata_sync_status east[4], west[4];
} describe_fixture;

static void sync_entry(km_describe_mirrors_response_metadata_sync_status *s, const char *kind, bool owner,
		       int64_t last, int64_t compared, int64_t changes_last, int64_t changes_total, int64_t skipped,
		       int64_t errors, const char *err, int64_t err_ms)
{
	km_describe_mirrors_response_metadata_sync_status_init(s);
	s->kind = km_str_c(kind);
	s->is_owner = owner;
	s->last_sync_time_ms = last;
	s->compared = compared;
	s->changes_last_cycle = changes_last;
	s->changes_total = changes_total;
	s->skipped = skipped;
	s->errors_total = errors;
	s->last_error = err ? km_str_c(err) : KM_STR_NULL;
	s->last_error_time_ms = err_ms;
	s->scope = KM_STR_NULL; /* as from a kmirrord that does not say (set below where it does) */
}

static void describe_fixture_init(describe_fixture *f)
{
	static const char *const kinds[] = {"configs", "partitions", "groups", "acls"};
	km_describe_mirrors_response_described_mirror *east = &f->m[0];

	memset(f, 0, sizeof(*f));
	km_describe_mirrors_response_init(&f->r);
	for (int i = 0; i < 4; i++) {
		km_describe_mirrors_response_described_mirror_init(&f->m[i]);
		f->m[i].configs.count = 0;
		f->m[i].topics.count = 0;
	}
	f->r.mirrors.items = f->m;
	f->r.mirrors.count = 4;

	east->mirror_name = km_str_c("east");
	east->owner = km_str_c("host-a@127.0.0.1:8080");
	km_describe_mirrors_response_described_config_init(&f->c[0]);
	f->c[0].name = km_str_c("bootstrap.servers");
	f->c[0].value = km_str_c("src:9092");
	km_describe_mirrors_response_described_config_init(&f->c[1]);
	f->c[1].name = km_str_c("sasl.password");
	f->c[1].value = KM_STR_NULL;
	f->c[1].is_sensitive = true;
	east->configs.items = f->c;
	east->configs.count = 2;
	km_describe_mirrors_response_described_topic_init(&f->t);
	f->t.name = km_str_c("orders");
	f->t.state = km_str_c("MIRRORING");
	km_describe_mirrors_response_described_partition_init(&f->p);
	f->p.partition_index = 0;
	f->p.state = km_str_c("MIRRORING");
	f->p.state_change_time_ms = 1767322245123LL;
	f->p.source_log_end_offset = 10;
	f->p.mirrored_offset = 7;
	f->p.lag = 3;
	f->p.lag_time_ms = 2500;
	f->t.started_by_pattern = true;
	f->t.partitions.items = &f->p;
	f->t.partitions.count = 1;
	east->topics.items = &f->t;
	east->topics.count = 1;
	sync_entry(&f->east[0], "configs", true, 1767322245123LL, 3, 1, 5, 0, 0, NULL, -1);
	sync_entry(&f->east[1], "partitions", true, -1, 0, 0, 0, 0, 0, NULL, -1);
	sync_entry(&f->east[2], "groups", true, 1767322246000LL, 12, 4, 40, 2, 0, NULL, -1);
	sync_entry(&f->east[3], "acls", true, 1767322200000LL, 0, 0, 0, 0, 7, "SECURITY_DISABLED: no authorizer",
		   1767322247000LL);
	f->east[0].scope = f->east[1].scope = km_str_c("the mirror's topics");
	f->east[2].scope = km_str_c("include .*");
	f->east[3].scope = km_str_c("off");
	east->metadata_sync.items = f->east;
	east->metadata_sync.count = 4;

	f->m[1].mirror_name = km_str_c("west");
	km_describe_mirrors_response_described_topic_init(&f->fresh); /* no partitions yet: one row of dashes */
	f->fresh.name = km_str_c("fresh");
	f->fresh.state = km_str_c("PREPARING");
	f->fresh.partitions.count = 0;
	f->m[1].topics.items = &f->fresh;
	f->m[1].topics.count = 1;
	for (int k = 0; k < 4; k++)
		sync_entry(&f->west[k], kinds[k], false, -1, 0, 0, 0, 0, 0, NULL, -1);
	f->m[1].metadata_sync.items = f->west;
	f->m[1].metadata_sync.count = 4;

	f->m[2].mirror_name = km_str_c("old");

	f->m[3].mirror_name = km_str_c("ghost");
	f->m[3].error_code = KM_MIRROR_UNKNOWN_CLUSTER_MIRROR;
	f->m[3].error_message = km_str_c("mirror ghost does not exist");
}

static void test_describe_table(void **state)
{
	describe_fixture f;
	membuf m;
	char *s;
	(void)state;

	describe_fixture_init(&f);
	mb_open(&m);
	km_cli_describe_print(m.f, &f.r, false);
	s = mb_close(&m);
	/* The sync's block sits between the configuration and the partitions (whose table the
	 * integration tests read to its end); "never" for a step not yet completed, the last error with
	 * its time; a kmirrord that does not report the sync shows none. */
	assert_string_equal(s,
			    "Mirror: east\n"
			    "Run by: host-a@127.0.0.1:8080\n"
			    "Topics: 1 (1 started by mirror.topics.include)\n"
			    "Partitions: 1 (1 MIRRORING)\n"
			    "Lag: 3 records, 2.5 s\n"
			    "Last error: none\n"
			    "\n"
			    "CONFIG             VALUE\n"
			    "bootstrap.servers  src:9092\n"
			    "sasl.password      (secret)\n"
			    "\n"
			    "Metadata sync:\n"
			    "KIND        SCOPE                LAST-SYNC             COMPARED  CHANGES-LAST  CHANGES-TOTAL  SKIPPED  "
			    "ERRORS  LAST-ERROR\n"
			    "configs     the mirror's topics  2026-01-02T02:50:45Z  3         1             5              0        "
			    "0       -\n"
			    "partitions  the mirror's topics  never                 0         0             0              0        "
			    "0       -\n"
			    "groups      include .*           2026-01-02T02:50:46Z  12        4             40             2        "
			    "0       -\n"
			    "acls        off                  2026-01-02T02:50:00Z  0         0             0              0        "
			    "7       SECURITY_DISABLED: no authorizer (2026-01-02T02:50:47Z)\n"
			    "\n"
			    "TOPIC   PARTITION  STATE      SINCE                 SOURCE-END  MIRRORED  LAG  SKIPPED  HIDDEN  LAST-ERROR\n"
			    "orders  0          MIRRORING  2026-01-02T02:50:45Z  10          7         3    0        0       -\n"
			    "\n"
			    "Mirror: west\n"
			    "Run by: not known to this kmirrord\n"
			    "Topics: 1\n"
			    "Partitions: 0\n"
			    "Lag: 0 records, 0.0 s\n"
			    "Last error: none\n"
			    "\n"
			    "CONFIG  VALUE\n"
			    "\n"
			    "Metadata sync (not run by this kmirrord: another kmirrord runs it, or no topic is synced yet):\n"
			    "KIND        SCOPE  LAST-SYNC  COMPARED  CHANGES-LAST  CHANGES-TOTAL  SKIPPED  ERRORS  LAST-ERROR\n"
			    "configs     -      never      0         0             0              0        0       -\n"
			    "partitions  -      never      0         0             0              0        0       -\n"
			    "groups      -      never      0         0             0              0        0       -\n"
			    "acls        -      never      0         0             0              0        0       -\n"
			    "\n"
			    "TOPIC  PARTITION  STATE      SINCE  SOURCE-END  MIRRORED  LAG  SKIPPED  HIDDEN  LAST-ERROR\n"
			    "fresh  -          PREPARING  -      -           -         -    -        -       -\n"
			    "\n"
			    "Mirror: old\n"
			    "Run by: not known to this kmirrord\n"
			    "Topics: 0\n"
			    "Partitions: 0\n"
			    "Lag: 0 records, 0.0 s\n"
			    "Last error: none\n"
			    "\n"
			    "CONFIG  VALUE\n"
			    "\n"
			    "No topics.\n"
			    "\n"
			    "Mirror: ghost\n"
			    "Error: UNKNOWN_CLUSTER_MIRROR: mirror ghost does not exist\n");
	free(s);
}

static void test_describe_json(void **state)
{
	describe_fixture f;
	membuf m;
	char *s;
	(void)state;

	describe_fixture_init(&f);
	f.r.mirrors.count = 2; /* east and west */
	mb_open(&m);
	km_cli_describe_print(m.f, &f.r, true);
	s = mb_close(&m);
	/* The existing keys as they were, then metadata_sync: one object per step, snake_case keys,
	 * -1 for a time not known, null for no error. */
	assert_string_equal(
		s,
		"{\"mirrors\":["
		"{\"name\":\"east\",\"error\":null,"
		"\"summary\":{\"topics\":1,\"topics_started_by_pattern\":1,\"partitions\":1,\"partitions_by_state\":{\"MIRRORING\":1},"
		"\"lag_records\":3,\"lag_seconds\":2.500,\"last_error\":null},\"owner\":\"host-a@127.0.0.1:8080\","
		"\"configs\":[{\"name\":\"bootstrap.servers\",\"value\":\"src:9092\",\"sensitive\":false},"
		"{\"name\":\"sasl.password\",\"value\":null,\"sensitive\":true}],"
		"\"topics\":[{\"name\":\"orders\",\"topic_id\":null,\"source_topic_id\":null,\"started_by\":\"pattern\","
		"\"state\":\"MIRRORING\",\"partitions\":["
		"{\"partition\":0,\"state\":\"MIRRORING\",\"state_change_time_ms\":1767322245123,"
		"\"source_log_end_offset\":10,\"mirrored_offset\":7,\"lag\":3,\"lag_time_ms\":2500,\"skipped_records\":0,"
		"\"records_hidden\":0,\"last_error\":null,\"last_error_time_ms\":-1}]}],"
		"\"metadata_sync\":["
		"{\"kind\":\"configs\",\"is_owner\":true,\"scope\":\"the mirror's topics\",\"last_sync_time_ms\":1767322245123,\"compared\":3,"
		"\"changes_last_cycle\":1,\"changes_total\":5,\"skipped\":0,\"errors_total\":0,\"last_error\":null,"
		"\"last_error_time_ms\":-1},"
		"{\"kind\":\"partitions\",\"is_owner\":true,\"scope\":\"the mirror's topics\",\"last_sync_time_ms\":-1,\"compared\":0,"
		"\"changes_last_cycle\":0,\"changes_total\":0,\"skipped\":0,\"errors_total\":0,\"last_error\":null,"
		"\"last_error_time_ms\":-1},"
		"{\"kind\":\"groups\",\"is_owner\":true,\"scope\":\"include .*\",\"last_sync_time_ms\":1767322246000,\"compared\":12,"
		"\"changes_last_cycle\":4,\"changes_total\":40,\"skipped\":2,\"errors_total\":0,\"last_error\":null,"
		"\"last_error_time_ms\":-1},"
		"{\"kind\":\"acls\",\"is_owner\":true,\"scope\":\"off\",\"last_sync_time_ms\":1767322200000,\"compared\":0,"
		"\"changes_last_cycle\":0,\"changes_total\":0,\"skipped\":0,\"errors_total\":7,"
		"\"last_error\":\"SECURITY_DISABLED: no authorizer\",\"last_error_time_ms\":1767322247000}]},"
		"{\"name\":\"west\",\"error\":null,"
		"\"summary\":{\"topics\":1,\"topics_started_by_pattern\":0,\"partitions\":0,\"partitions_by_state\":{},"
		"\"lag_records\":0,\"lag_seconds\":0.000,\"last_error\":null},\"owner\":null,\"configs\":[],"
		"\"topics\":[{\"name\":\"fresh\",\"topic_id\":null,\"source_topic_id\":null,\"started_by\":\"operator\",\"state\":\"PREPARING\",\"partitions\":[]}],"
		"\"metadata_sync\":["
		"{\"kind\":\"configs\",\"is_owner\":false,\"scope\":null,\"last_sync_time_ms\":-1,\"compared\":0,"
		"\"changes_last_cycle\":0,\"changes_total\":0,\"skipped\":0,\"errors_total\":0,\"last_error\":null,"
		"\"last_error_time_ms\":-1},"
		"{\"kind\":\"partitions\",\"is_owner\":false,\"scope\":null,\"last_sync_time_ms\":-1,\"compared\":0,"
		"\"changes_last_cycle\":0,\"changes_total\":0,\"skipped\":0,\"errors_total\":0,\"last_error\":null,"
		"\"last_error_time_ms\":-1},"
		"{\"kind\":\"groups\",\"is_owner\":false,\"scope\":null,\"last_sync_time_ms\":-1,\"compared\":0,"
		"\"changes_last_cycle\":0,\"changes_total\":0,\"skipped\":0,\"errors_total\":0,\"last_error\":null,"
		"\"last_error_time_ms\":-1},"
		"{\"kind\":\"acls\",\"is_owner\":false,\"scope\":null,\"last_sync_time_ms\":-1,\"compared\":0,"
		"\"changes_last_cycle\":0,\"changes_total\":0,\"skipped\":0,\"errors_total\":0,\"last_error\":null,"
		"\"last_error_time_ms\":-1}]}]}\n");
	free(s);

	/* A kmirrord that does not report the sync (or a mirror in error): an empty list, the key still there. */
	mb_open(&m);
	f.r.mirrors.items = &f.m[2];
	f.r.mirrors.count = 2;
	km_cli_describe_print(m.f, &f.r, true);
	s = mb_close(&m);
	assert_string_equal(s, "{\"mirrors\":[{\"name\":\"old\",\"error\":null,"
			       "\"summary\":{\"topics\":0,\"topics_started_by_pattern\":0,\"partitions\":0,"
			       "\"partitions_by_state\":{},\"lag_records\":0,\"lag_seconds\":0.000,\"last_error\":null},"
			       "\"owner\":null,\"configs\":[],\"topics\":[],"
			       "\"metadata_sync\":[]},"
			       "{\"name\":\"ghost\",\"error\":{\"code\":32002,\"name\":\"UNKNOWN_CLUSTER_MIRROR\","
			       "\"message\":\"mirror ghost does not exist\"},\"summary\":null,\"owner\":null,\"configs\":[],\"topics\":[],"
			       "\"metadata_sync\":[]}]}\n");
	free(s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_escape),
		cmocka_unit_test(test_document),
		cmocka_unit_test(test_table),
		cmocka_unit_test(test_time),
		cmocka_unit_test(test_describe_table),
		cmocka_unit_test(test_describe_json),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
