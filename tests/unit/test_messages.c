/* Unit tests for the generated message codecs, the API table, the arena and decode error text. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <cmocka.h>
#include <dirent.h>

#include "kmirror/api.h"
#include "kmirror/arena.h"
#include "kmirror/codec.h"
#include "kmirror/msg/api_versions_response.h"
#include "kmirror/msg/broker_heartbeat_request.h"
#include "kmirror/msg/describe_topic_partitions_request.h"
#include "kmirror/msg/metadata_request.h"
#include "kmirror/msg/request_header.h"
#include "kmirror/msg/response_header.h"
#include "kmirror/wire.h"
#include "msg_roundtrip.h"

/* Encodes one filled message: returns the bytes (caller frees) and checks size == length. */
static uint8_t *encode_checked(const km_test_msg *t, int16_t v, const void *m, size_t *len)
{
	km_wr w;
	km_wr_init(&w);
	t->encode(&w, v, m);
	if (!km_wr_ok(&w)) {
		fprintf(stderr, "%s v%d: encode failed: %s\n", t->name, v, km_err_name(w.err));
		fail();
	}
	size_t want = t->size(v, m);
	if (want != w.len) {
		fprintf(stderr, "%s v%d: size %zu, encoded %zu\n", t->name, v, want, w.len);
		fail();
	}
	return km_wr_take(&w, len);
}

/* fill -> encode -> size == length -> decode -> equal -> re-encode -> identical bytes. */
static void roundtrip_one(const km_test_msg *t, int16_t v, int mode)
{
	km_arena a;
	uint32_t seq = (uint32_t)(v * 1000 + mode * 100 + 1);
	void *m1 = calloc(1, t->struct_size), *m2 = calloc(1, t->struct_size);
	size_t len1, len2;

	km_arena_init(&a, 0);
	t->init(m1);
	t->fill(m1, v, mode, &a, &seq);
	uint8_t *b1 = encode_checked(t, v, m1, &len1);

	km_rd r;
	km_rd_init(&r, b1, len1);
	km_err err = t->decode(&r, v, m2, &a);
	if (err != KM_OK) {
		char msg[256];
		km_codec_strerror_msg(msg, sizeof(msg), t->name, v, &r);
		fprintf(stderr, "decode failed: %s\n", msg);
		fail();
	}
	assert_int_equal(r.pos, len1);
	if (!t->eq(m1, m2)) {
		fprintf(stderr, "%s v%d mode %d: decoded message differs\n", t->name, v, mode);
		fail();
	}
	uint8_t *b2 = encode_checked(t, v, m2, &len2);
	assert_int_equal(len1, len2);
	assert_memory_equal(b1, b2, len1);
	free(b1);
	free(b2);
	free(m1);
	free(m2);
	km_arena_free(&a);
}

static void test_roundtrip_all(void **state)
{
	size_t versions = 0, types = 0, api_types = 0;
	for (size_t i = 0; i < km_test_msgs_count; i++) {
		const km_test_msg *t = &km_test_msgs[i];
		types++;
		if (t->api_key >= 0)
			api_types++;
		for (int16_t v = t->min_version; v <= t->max_version; v++) {
			roundtrip_one(t, v, 0);
			roundtrip_one(t, v, 1);
			versions++;
		}
	}
	printf("round trip: %zu message types (%zu request/response), %zu message versions, %zu cases\n", types,
	       api_types, versions, versions * 2);
	/* Every request and response of the API table is in the test table. */
	size_t n;
	km_api_table(&n);
	assert_int_equal(api_types, 2 * n);
	assert_true(types >= 2 * n + 2);
}

/* A prefix of a valid encoding never decodes: it fails cleanly and names a field. */
static void test_truncation_everywhere(void **state)
{
	size_t cuts = 0;
	km_arena a;
	km_arena_init(&a, 0);
	for (size_t i = 0; i < km_test_msgs_count; i++) {
		const km_test_msg *t = &km_test_msgs[i];
		void *m = calloc(1, t->struct_size), *m2 = calloc(1, t->struct_size);
		for (int16_t v = t->min_version; v <= t->max_version; v++) {
			uint32_t seq = 7;
			size_t len;
			km_arena_reset(&a);
			t->init(m);
			t->fill(m, v, 0, &a, &seq);
			uint8_t *buf = encode_checked(t, v, m, &len);
			for (size_t cut = 0; cut < len; cut++) {
				/* A copy of exactly cut bytes, so ASan catches any read past the end. */
				uint8_t *p = malloc(cut ? cut : 1);
				memcpy(p, buf, cut);
				km_rd r;
				km_rd_init(&r, p, cut);
				km_arena b;
				km_arena_init(&b, 0);
				km_err err = t->decode(&r, v, m2, &b);
				if (err == KM_OK) {
					fprintf(stderr, "%s v%d: %zu of %zu bytes decoded\n", t->name, v, cut, len);
					fail();
				}
				assert_int_equal(err, KM_ERR_DECODE);
				assert_non_null(r.err_field);
				assert_non_null(r.err_what);
				assert_true(r.err_pos <= cut);
				km_arena_free(&b);
				free(p);
				cuts++;
			}
			free(buf);
		}
		free(m);
		free(m2);
	}
	km_arena_free(&a);
	printf("truncation: %zu prefixes rejected\n", cuts);
	assert_true(cuts > 10000);
}

static void test_unknown_tags_preserved(void **state)
{
	/* ResponseHeader v1: correlation id, then tags 5 (2 bytes) and 9 (empty), out of any schema. */
	static const uint8_t in[] = {0, 0, 0, 42, 2, 5, 2, 0xaa, 0xbb, 9, 0};
	km_response_header h;
	km_arena a;
	km_rd r;
	km_wr w;

	km_arena_init(&a, 0);
	km_rd_init(&r, in, sizeof(in));
	assert_int_equal(km_response_header_decode(&r, 1, &h, &a), KM_OK);
	assert_int_equal(h.correlation_id, 42);
	assert_int_equal(h.unknown_tags.count, 2);
	assert_int_equal(h.unknown_tags.items[0].tag, 5);
	assert_int_equal(h.unknown_tags.items[0].data.len, 2);
	assert_int_equal(h.unknown_tags.items[1].tag, 9);
	/* Borrowed, not copied. */
	assert_ptr_equal(h.unknown_tags.items[0].data.p, in + 7);
	assert_int_equal(km_response_header_size(1, &h), sizeof(in));
	km_wr_init(&w);
	km_response_header_encode(&w, 1, &h);
	assert_true(km_wr_ok(&w));
	assert_int_equal(w.len, sizeof(in));
	assert_memory_equal(w.buf, in, sizeof(in));
	km_wr_free(&w);
	/* v0 has no tag section: the tags are not written. */
	km_wr_init(&w);
	km_response_header_encode(&w, 0, &h);
	assert_int_equal(w.len, 4);
	km_wr_free(&w);
	km_arena_free(&a);
}

/* A tag number that a field uses only from a later version is unknown (and kept) in earlier ones. */
static void test_tag_known_only_in_later_versions(void **state)
{
	uint8_t in[22 + 1 + 1 + 1 + 17];
	km_broker_heartbeat_request m;
	km_arena a;
	km_rd r;
	km_wr w;

	memset(in, 0, sizeof(in));
	in[3] = 1;   /* BrokerId 1 */
	in[22] = 1;  /* one tagged field */
	in[23] = 0;  /* tag 0: OfflineLogDirs from v1 */
	in[24] = 17; /* compact array of one uuid */
	in[25] = 2;
	memset(in + 26, 0xab, 16);
	km_arena_init(&a, 0);
	for (int16_t v = 0; v <= 1; v++) {
		km_rd_init(&r, in, sizeof(in));
		assert_int_equal(km_broker_heartbeat_request_decode(&r, v, &m, &a), KM_OK);
		assert_int_equal(r.pos, sizeof(in));
		if (v == 0) {
			assert_int_equal(m.unknown_tags.count, 1);
			assert_int_equal(m.unknown_tags.items[0].tag, 0);
			assert_int_equal(m.offline_log_dirs.count, 0);
		} else {
			assert_int_equal(m.unknown_tags.count, 0);
			assert_int_equal(m.offline_log_dirs.count, 1);
			assert_int_equal(m.offline_log_dirs.items[0].b[15], 0xab);
		}
		km_wr_init(&w);
		km_broker_heartbeat_request_encode(&w, v, &m);
		assert_true(km_wr_ok(&w));
		assert_int_equal(w.len, sizeof(in));
		assert_int_equal(km_broker_heartbeat_request_size(v, &m), sizeof(in));
		assert_memory_equal(w.buf, in, sizeof(in));
		km_wr_free(&w);
	}
	km_arena_free(&a);
}

static void test_known_tagged_fields(void **state)
{
	km_api_versions_response m, d;
	km_arena a;
	km_wr w;
	km_rd r;

	km_arena_init(&a, 0);
	km_api_versions_response_init(&m);
	assert_true(m.finalized_features_epoch == -1); /* JSON default */
	/* Defaults are not written: error code, empty compact array, throttle, zero tags. */
	assert_int_equal(km_api_versions_response_size(3, &m), 2 + 1 + 4 + 1);
	m.finalized_features_epoch = 5;
	/* One tag: count, tag 1, size 8, int64. */
	assert_int_equal(km_api_versions_response_size(3, &m), 2 + 1 + 4 + 1 + 1 + 1 + 8);
	km_wr_init(&w);
	km_api_versions_response_encode(&w, 3, &m);
	assert_true(km_wr_ok(&w));
	assert_int_equal(w.len, 18);
	assert_int_equal(w.buf[7], 1);  /* one tagged field */
	assert_int_equal(w.buf[8], 1);  /* tag 1 */
	assert_int_equal(w.buf[9], 8);  /* eight bytes */
	km_rd_init(&r, w.buf, w.len);
	assert_int_equal(km_api_versions_response_decode(&r, 3, &d, &a), KM_OK);
	assert_true(d.finalized_features_epoch == 5);
	assert_int_equal(d.unknown_tags.count, 0);
	/* The same bytes read as v2 (not flexible) leave the tail unread. */
	km_wr_free(&w);
	km_arena_free(&a);
}

static void test_versions_and_ignorable(void **state)
{
	km_metadata_request m;
	km_wr w;

	km_metadata_request_init(&m);
	assert_true(m.allow_auto_topic_creation); /* default "true" */
	assert_int_equal(m.topics.count, 0);

	/* Non-default value of a non-ignorable field the version lacks: refused. */
	m.allow_auto_topic_creation = false;
	km_wr_init(&w);
	km_metadata_request_encode(&w, 3, &m);
	assert_int_equal(w.err, KM_ERR_ENCODE);
	km_wr_free(&w);
	km_wr_init(&w);
	km_metadata_request_encode(&w, 4, &m);
	assert_true(km_wr_ok(&w));
	km_wr_free(&w);

	/* IncludeClusterAuthorizedOperations exists in v8-10 only. */
	km_metadata_request_init(&m);
	m.include_cluster_authorized_operations = true;
	km_wr_init(&w);
	km_metadata_request_encode(&w, 10, &m);
	assert_true(km_wr_ok(&w));
	km_wr_free(&w);
	km_wr_init(&w);
	km_metadata_request_encode(&w, 11, &m);
	assert_int_equal(w.err, KM_ERR_ENCODE);
	km_wr_free(&w);

	/* Ignorable TopicId (v10+) is dropped silently in v9. */
	km_metadata_request_topic t;
	km_metadata_request_init(&m);
	km_metadata_request_topic_init(&t);
	t.name = km_str_c("orders");
	t.topic_id.b[0] = 1;
	m.topics.count = 1;
	m.topics.items = &t;
	km_wr_init(&w);
	km_metadata_request_encode(&w, 9, &m);
	assert_true(km_wr_ok(&w));
	assert_int_equal(w.len, km_metadata_request_size(9, &m));
	km_wr_free(&w);

	/* Null topics: allowed from v1 (all topics), not in v0. */
	km_metadata_request_init(&m);
	m.topics.count = -1;
	km_wr_init(&w);
	km_metadata_request_encode(&w, 1, &m);
	assert_true(km_wr_ok(&w));
	assert_memory_equal(w.buf, "\xff\xff\xff\xff", 4);
	km_wr_free(&w);
	km_wr_init(&w);
	km_metadata_request_encode(&w, 0, &m);
	assert_int_equal(w.err, KM_ERR_ENCODE);
	km_wr_free(&w);

	/* Unsupported versions. */
	km_wr_init(&w);
	km_metadata_request_encode(&w, KM_METADATA_REQUEST_MAX_VERSION + 1, &m);
	assert_int_equal(w.err, KM_ERR_UNSUPPORTED);
	km_wr_free(&w);
	assert_int_equal(km_metadata_request_size(-1, &m), 0);
}

static void test_request_header(void **state)
{
	km_request_header h, d;
	km_arena a;
	km_wr w;
	km_rd r;

	km_arena_init(&a, 0);
	km_request_header_init(&h);
	h.request_api_key = 3;
	h.request_api_version = 12;
	h.correlation_id = 7;
	h.client_id = km_str_c("abc");
	/* v2 is flexible but ClientId keeps its int16 length ("flexibleVersions": "none"). */
	km_wr_init(&w);
	km_request_header_encode(&w, 2, &h);
	assert_true(km_wr_ok(&w));
	static const uint8_t want[] = {0, 3, 0, 12, 0, 0, 0, 7, 0, 3, 'a', 'b', 'c', 0};
	assert_int_equal(w.len, sizeof(want));
	assert_memory_equal(w.buf, want, sizeof(want));
	km_rd_init(&r, w.buf, w.len);
	assert_int_equal(km_request_header_decode(&r, 2, &d, &a), KM_OK);
	assert_true(km_str_eq_c(d.client_id, "abc"));
	assert_ptr_equal(d.client_id.p, (const char *)w.buf + 10); /* borrowed */
	km_wr_free(&w);
	/* v1: null client id is -1. */
	h.client_id = KM_STR_NULL;
	km_wr_init(&w);
	km_request_header_encode(&w, 1, &h);
	assert_int_equal(w.len, 10);
	assert_memory_equal(w.buf + 8, "\xff\xff", 2);
	km_wr_free(&w);
	/* Kafka 4.x defines request header v1-v2 only (v0 was ControlledShutdown v0's). */
	h.client_id = km_str_c("abc");
	km_wr_init(&w);
	km_request_header_encode(&w, 0, &h);
	assert_int_equal(w.err, KM_ERR_UNSUPPORTED);
	km_wr_free(&w);
	km_arena_free(&a);
}

static void test_nullable_struct(void **state)
{
	km_describe_topic_partitions_request m, d;
	km_describe_topic_partitions_request_cursor c;
	km_arena a;
	km_wr w;
	km_rd r;

	km_arena_init(&a, 0);
	km_describe_topic_partitions_request_init(&m);
	assert_int_equal(m.response_partition_limit, 2000);
	assert_null(m.cursor);
	km_wr_init(&w);
	km_describe_topic_partitions_request_encode(&w, 0, &m);
	/* topics [] (1), limit (4), cursor null marker -1 (1), tags (1) */
	assert_int_equal(w.len, 7);
	assert_int_equal(w.buf[5], 0xff);
	km_wr_free(&w);
	km_describe_topic_partitions_request_cursor_init(&c);
	c.topic_name = km_str_c("t");
	c.partition_index = 3;
	m.cursor = &c;
	km_wr_init(&w);
	km_describe_topic_partitions_request_encode(&w, 0, &m);
	assert_int_equal(w.buf[5], 1);
	km_rd_init(&r, w.buf, w.len);
	assert_int_equal(km_describe_topic_partitions_request_decode(&r, 0, &d, &a), KM_OK);
	assert_non_null(d.cursor);
	assert_int_equal(d.cursor->partition_index, 3);
	assert_true(km_str_eq_c(d.cursor->topic_name, "t"));
	km_wr_free(&w);
	km_arena_free(&a);
}

static void test_api_table(void **state)
{
	size_t n;
	const km_api_info *rows = km_api_table(&n);
	assert_true(n >= 80);
	for (size_t i = 0; i < n; i++) {
		if (i > 0)
			assert_true(rows[i - 1].api_key < rows[i].api_key);
		assert_true(rows[i].min_version <= rows[i].max_version);
		assert_ptr_equal(km_api_lookup(rows[i].api_key), &rows[i]);
		assert_non_null(rows[i].request.decode);
		assert_non_null(rows[i].response.encode);
		assert_true(rows[i].request.struct_size > 0);
	}
	const km_api_info *md = km_api_lookup(KM_API_METADATA);
	assert_non_null(md);
	assert_string_equal(md->name, "Metadata");
	assert_string_equal(md->request.name, "MetadataRequest");
	assert_int_equal(md->first_flexible, 9);
	assert_true(md->listeners & KM_API_LISTENER_BROKER);
	assert_false(md->listeners & KM_API_LISTENER_CONTROLLER);
	assert_int_equal(km_api_request_header_version(KM_API_METADATA, 8), 1);
	assert_int_equal(km_api_request_header_version(KM_API_METADATA, 9), 2);
	assert_int_equal(km_api_response_header_version(KM_API_METADATA, 8), 0);
	assert_int_equal(km_api_response_header_version(KM_API_METADATA, 9), 1);
	/* ApiVersions answers with response header v0 even in flexible versions. */
	assert_int_equal(km_api_request_header_version(KM_API_API_VERSIONS, 3), 2);
	assert_int_equal(km_api_response_header_version(KM_API_API_VERSIONS, 3), 0);
	/* APIs that Kafka 4.x removed ("validVersions": "none": ControlledShutdown, LeaderAndIsr,
	 * StopReplica, UpdateMetadata) are not in the table. */
	assert_null(km_api_lookup(7));
	assert_null(km_api_lookup(4));
	assert_int_equal(km_api_request_header_version(7, 1), -1);
	/* Unknown keys and versions. */
	assert_null(km_api_lookup(-1));
	assert_null(km_api_lookup(31999));
	assert_int_equal(km_api_request_header_version(31999, 0), -1);
	/* kmirror's own RPCs come from src/codec/messages, on their own listener. */
	const km_api_info *cm = km_api_lookup(KM_API_CREATE_MIRROR);
	assert_non_null(cm);
	assert_int_equal(cm->api_key, 32000);
	assert_true(cm->listeners & KM_API_LISTENER_KMIRROR);
	assert_false(cm->listeners & KM_API_LISTENER_BROKER);
	assert_int_equal(km_api_request_header_version(KM_API_CREATE_MIRROR, 0), 2);
	assert_int_equal(km_api_response_header_version(KM_API_METADATA, 99), -1);
	assert_false(km_api_version_supported(KM_API_METADATA, 99));
	assert_true(km_api_version_supported(KM_API_PRODUCE, md->min_version >= 0 ? 3 : 0));
	const km_api_info *ctl = km_api_lookup(KM_API_BROKER_REGISTRATION);
	assert_non_null(ctl);
	assert_true(ctl->listeners & KM_API_LISTENER_CONTROLLER);
}

/* Every kmirror wire code has its row in docs/protocol.md's error table, and no code is missing from the table. */
static void test_mirror_errors_documented(void **state)
{
	const char *srcdir = getenv("srcdir");
	char path[1024], row[128], *doc;
	size_t n;
	FILE *f;
	km_err code;

	(void)state;
	snprintf(path, sizeof(path), "%s/docs/protocol.md", srcdir ? srcdir : ".");
	f = fopen(path, "r");
	assert_non_null(f);
	doc = calloc(1, 1 << 20);
	n = fread(doc, 1, (1 << 20) - 1, f);
	fclose(f);
	assert_true(n > 0);
	for (code = KM_MIRROR_ERROR_FIRST; km_err_is_mirror(code); code++) {
		snprintf(row, sizeof(row), "| %d | `%s` | %s |", code, km_err_name(code),
			 km_err_retriable(code) ? "yes" : "no");
		if (!strstr(doc, row)) {
			fprintf(stderr, "docs/protocol.md lacks the row starting \"%s\"\n", row);
			fail();
		}
		assert_int_equal(km_err_by_name(km_err_name(code)), code);
	}
	assert_int_equal(code, KM_MIRROR_STATE_UNAVAILABLE + 1);
	snprintf(row, sizeof(row), "| %d | `", code);
	assert_null(strstr(doc, row));
	free(doc);
}

static void test_generic_codec(void **state)
{
	/* Through the table, as a fuzzer or logger does: encode a default Fetch request, decode it back. */
	const km_api_info *api = km_api_lookup(KM_API_FETCH);
	km_arena a;
	km_wr w;
	km_rd r;
	assert_non_null(api);
	void *m = calloc(1, api->request.struct_size), *d = calloc(1, api->request.struct_size);
	km_arena_init(&a, 0);
	for (int16_t v = api->min_version; v <= api->max_version; v++) {
		api->request.init(m);
		km_wr_init(&w);
		api->request.encode(&w, v, m);
		assert_true(km_wr_ok(&w));
		assert_int_equal(w.len, api->request.size(v, m));
		km_rd_init(&r, w.buf, w.len);
		assert_int_equal(api->request.decode(&r, v, d, &a), KM_OK);
		km_wr_free(&w);
	}
	free(m);
	free(d);
	km_arena_free(&a);
}

static void test_arena(void **state)
{
	km_arena a;
	km_arena_init(&a, 64 * 1024);
	/* Alignment and distinct blocks. */
	char *p = km_arena_alloc(&a, 3), *q = km_arena_alloc(&a, 5);
	assert_non_null(p);
	assert_non_null(q);
	assert_int_equal((uintptr_t)q % _Alignof(max_align_t), 0);
	assert_true(q >= p + 3);
	/* Many small allocations span chunks. */
	for (int i = 0; i < 1000; i++)
		assert_non_null(km_arena_alloc(&a, 24));
	assert_true(km_arena_size(&a) <= 64 * 1024);
	/* Over the cap: a clean failure, sticky until reset. */
	assert_null(km_arena_alloc(&a, 64 * 1024));
	assert_int_equal(km_arena_err(&a), KM_ERR_TOO_LARGE);
	assert_null(km_arena_alloc(&a, (size_t)-1));
	km_arena_reset(&a);
	assert_int_equal(km_arena_err(&a), KM_OK);
	assert_true(km_arena_size(&a) > 0);
	char *z = km_arena_calloc(&a, 100);
	for (int i = 0; i < 100; i++)
		assert_int_equal(z[i], 0);
	km_arena_free(&a);
	assert_int_equal(km_arena_size(&a), 0);
}

static void test_decode_caps_and_errors(void **state)
{
	km_metadata_request m;
	km_arena a;
	km_rd r;
	char msg[160];

	/* A count of a million topics in a 10-byte request: refused before any allocation. */
	static const uint8_t big[] = {0, 0x0f, 0x42, 0x40, 0, 1, 'a', 0, 1, 'b'};
	km_arena_init(&a, 0);
	km_rd_init(&r, big, sizeof(big));
	assert_int_equal(km_metadata_request_decode(&r, 0, &m, &a), KM_ERR_DECODE);
	assert_string_equal(r.err_field, "Topics");
	assert_int_equal(km_arena_size(&a), 0);
	km_codec_strerror(msg, sizeof(msg), KM_API_METADATA, 0, &r);
	assert_string_equal(msg, "ApiKey 3 (Metadata) v0: field Topics at byte 4: array length over the bytes left");

	/* Truncated inside a topic name. */
	static const uint8_t cut[] = {0, 0, 0, 1, 0, 5, 'a', 'b'};
	km_rd_init(&r, cut, sizeof(cut));
	assert_int_equal(km_metadata_request_decode(&r, 0, &m, &a), KM_ERR_DECODE);
	km_codec_strerror(msg, sizeof(msg), KM_API_METADATA, 0, &r);
	assert_string_equal(msg, "ApiKey 3 (Metadata) v0: field MetadataRequestTopic.Name at byte 6: truncated");

	/* Null name where v0 does not allow it. */
	static const uint8_t nul[] = {0, 0, 0, 1, 0xff, 0xff};
	km_rd_init(&r, nul, sizeof(nul));
	assert_int_equal(km_metadata_request_decode(&r, 0, &m, &a), KM_ERR_DECODE);
	assert_string_equal(r.err_what, "null in a non-nullable field");

	/* Unsupported version. */
	km_rd_init(&r, big, sizeof(big));
	assert_int_equal(km_metadata_request_decode(&r, 42, &m, &a), KM_ERR_UNSUPPORTED);
	km_arena_free(&a);

	/* A small arena cap: the decode fails with TOO_LARGE and names the array. */
	uint8_t buf[4 + 100 * 3];
	km_put_be32(buf, 100);
	for (int i = 0; i < 100; i++) {
		buf[4 + i * 3] = 0;
		buf[5 + i * 3] = 1;
		buf[6 + i * 3] = (uint8_t)('a' + i % 26);
	}
	km_arena_init(&a, 256);
	km_rd_init(&r, buf, sizeof(buf));
	assert_int_equal(km_metadata_request_decode(&r, 0, &m, &a), KM_ERR_TOO_LARGE);
	assert_string_equal(r.err_field, "Topics");
	km_arena_free(&a);
	km_arena_init(&a, 0);
	km_rd_init(&r, buf, sizeof(buf));
	assert_int_equal(km_metadata_request_decode(&r, 0, &m, &a), KM_OK);
	assert_int_equal(m.topics.count, 100);
	assert_true(km_str_eq_c(m.topics.items[99].name, "v"));
	km_arena_free(&a);
}

#ifndef KM_FUZZ_CORPUS_DIR
#define KM_FUZZ_CORPUS_DIR "tests/fuzz/corpus"
#endif

enum golden_result { GOLDEN_OK, GOLDEN_NEWER, GOLDEN_BAD };

/* Decodes one captured message body of key/version with the table; it must decode whole and
 * re-encode byte for byte (GOLDEN_BAD, with the reason on stderr, if not). GOLDEN_NEWER if the
 * version is newer than the definitions. */
static enum golden_result golden_body(const char *label, int16_t key, int16_t v, bool response,
				      const uint8_t *body, size_t len)
{
	enum golden_result res = GOLDEN_OK;
	const km_api_info *api = km_api_lookup(key);
	assert_non_null(api);
	const km_api_codec *c = response ? &api->response : &api->request;
	if (!km_api_version_supported(key, v))
		return GOLDEN_NEWER; /* the broker is newer than the definitions: a proxy never negotiates it */
	void *m = calloc(1, c->struct_size);
	km_arena a;
	km_rd r;
	km_wr w;
	char msg[256];
	km_arena_init(&a, 0);
	km_rd_init(&r, body, len);
	km_wr_init(&w);
	if (c->decode(&r, v, m, &a) != KM_OK || r.pos != len) {
		km_codec_strerror(msg, sizeof(msg), key, v, &r);
		fprintf(stderr, "%s: %s (read %zu of %zu bytes)\n", label, msg, r.pos, len);
		res = GOLDEN_BAD;
	} else {
		c->encode(&w, v, m);
		if (!km_wr_ok(&w) || c->size(v, m) != len || w.len != len || memcmp(w.buf, body, len) != 0) {
			fprintf(stderr, "%s: re-encoding differs from the broker's bytes\n", label);
			res = GOLDEN_BAD;
		}
	}
	km_wr_free(&w);
	km_arena_free(&a);
	free(m);
	return res;
}

/* Reads a whole file (at most 1 MiB) into a malloc'ed buffer. */
static uint8_t *read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		fprintf(stderr, "%s: %s\n", path, strerror(errno));
	assert_non_null(f);
	uint8_t *buf = malloc(1 << 20);
	*len = fread(buf, 1, 1 << 20, f);
	fclose(f);
	return buf;
}

/* One fuzz-corpus capture: 2-byte api key, 2-byte version, body. */
static enum golden_result golden_one(const char *path, bool response)
{
	size_t len;
	uint8_t *buf = read_file(path, &len);
	assert_true(len >= 4);
	enum golden_result res = golden_body(path, (int16_t)km_be16(buf), (int16_t)km_be16(buf + 2), response,
					     buf + 4, len - 4);
	free(buf);
	return res;
}

/* Frames recorded between real clients (Kafka's Java tools, librdkafka, kcat) and Kafka 4.1.1 and 4.4.0 brokers (golden-*; golden-*k44-* are 4.4.0 with its own tools). */
static void test_golden_captures(void **state)
{
	size_t n = 0, newer = 0, bad = 0;
	/* KM_CORPUS_DIR checks a fresh capture (tests/fuzz/capture-golden OUT) before it is committed. */
	const char *top = getenv("KM_CORPUS_DIR") ? getenv("KM_CORPUS_DIR") : KM_FUZZ_CORPUS_DIR;
	for (int kind = 0; kind < 2; kind++) {
		char dir[4096];
		snprintf(dir, sizeof(dir), "%s/%s", top, kind ? "response" : "request");
		DIR *d = opendir(dir);
		assert_non_null(d);
		struct dirent *e;
		while ((e = readdir(d)) != NULL) {
			if (strncmp(e->d_name, "golden-", 7) != 0)
				continue;
			char path[8192];
			snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
			enum golden_result res = golden_one(path, kind == 1);
			n += res == GOLDEN_OK;
			newer += res == GOLDEN_NEWER;
			bad += res == GOLDEN_BAD;
		}
		closedir(d);
	}
	printf("golden captures: %zu frames decoded and re-encoded byte for byte (%zu in versions newer "
	       "than the definitions)\n", n, newer);
	assert_int_equal(bad, 0);
	assert_true(n >= 30);
}

#ifndef KM_GOLDEN_DIR
#define KM_GOLDEN_DIR "tests/data/golden"
#endif

/* Frames a real client sent with bytes after the message (Kafka's parser ignores them, the broker
 * answered): only the message is checked, and the number of extra bytes must be exactly this. */
static const struct {
	const char *file;
	size_t trailing;
} golden_trailing[] = {
	/* librdkafka 2.16's AdminClient list_topics(): Metadata v13 for all topics (Topics null,
	 * both flags false, no tags) followed by 01 00 00. */
	{"confluent-admin/0008-3-v13-req.bin", 3},
};

/* Whole frames (header and body, no size prefix) recorded by tests/tools/make-golden from real
 * clients and Kafka 4.1.1 and 4.4.0 brokers, as listed in tests/data/golden/index.tsv: the header
 * and the body must each decode whole and re-encode byte for byte. */
static void test_golden_frames(void **state)
{
	char path[8192], line[2048], file[1024], dir[8];
	size_t n = 0, newer = 0, bad = 0;
	int key, ver, corr;
	snprintf(path, sizeof(path), "%s/index.tsv", KM_GOLDEN_DIR);
	FILE *idx = fopen(path, "r");
	assert_non_null(idx);
	assert_non_null(fgets(line, sizeof(line), idx)); /* the column names */
	while (fgets(line, sizeof(line), idx)) {
		assert_int_equal(sscanf(line, "%1023s %d %d %d %7s", file, &key, &ver, &corr, dir), 5);
		bool response = strcmp(dir, "resp") == 0;
		int hv = response ? km_api_response_header_version((int16_t)key, (int16_t)ver)
				  : km_api_request_header_version((int16_t)key, (int16_t)ver);
		if (hv < 0) {
			newer++;
			continue;
		}
		size_t len;
		snprintf(path, sizeof(path), "%s/%s", KM_GOLDEN_DIR, file);
		uint8_t *buf = read_file(path, &len);
		km_arena a;
		km_rd r;
		km_wr w;
		km_arena_init(&a, 0);
		km_rd_init(&r, buf, len);
		km_wr_init(&w);
		if (response) {
			km_response_header h;
			km_response_header_init(&h);
			assert_int_equal(km_response_header_decode(&r, (int16_t)hv, &h, &a), KM_OK);
			assert_int_equal(h.correlation_id, corr);
			km_response_header_encode(&w, (int16_t)hv, &h);
		} else {
			km_request_header h;
			km_request_header_init(&h);
			assert_int_equal(km_request_header_decode(&r, (int16_t)hv, &h, &a), KM_OK);
			assert_int_equal(h.request_api_key, key);
			assert_int_equal(h.request_api_version, ver);
			assert_int_equal(h.correlation_id, corr);
			km_request_header_encode(&w, (int16_t)hv, &h);
		}
		assert_true(km_rd_ok(&r));
		if (w.len != r.pos || memcmp(w.buf, buf, r.pos) != 0) {
			fprintf(stderr, "%s: the re-encoded header differs\n", path);
			fail();
		}
		size_t trailing = 0;
		for (size_t i = 0; i < sizeof(golden_trailing) / sizeof(golden_trailing[0]); i++)
			if (strcmp(file, golden_trailing[i].file) == 0)
				trailing = golden_trailing[i].trailing;
		assert_true(len - r.pos > trailing);
		enum golden_result res = golden_body(path, (int16_t)key, (int16_t)ver, response, buf + r.pos,
						     len - r.pos - trailing);
		n += res == GOLDEN_OK;
		newer += res == GOLDEN_NEWER;
		bad += res == GOLDEN_BAD;
		km_wr_free(&w);
		km_arena_free(&a);
		free(buf);
	}
	fclose(idx);
	printf("golden frames: %zu frames (headers and bodies) decoded and re-encoded byte for byte (%zu in "
	       "versions newer than the definitions, %zu not)\n", n, newer, bad);
	assert_int_equal(bad, 0);
	assert_true(n >= 400);
}

/* --write-corpus DIR: writes fuzz seeds (2-byte api key, 2-byte version, body) for the two harnesses. */
static int write_corpus(const char *dir)
{
	char path[4096];
	int files = 0;
	for (int kind = 0; kind < 2; kind++) {
		const char *sub = kind == 0 ? "request" : "response";
		snprintf(path, sizeof(path), "%s/%s", dir, sub);
		if (mkdir(path, 0755) != 0 && errno != EEXIST) {
			perror(path);
			return 1;
		}
		for (size_t i = 0; i < km_test_msgs_count; i++) {
			const km_test_msg *t = &km_test_msgs[i];
			size_t nl = strlen(t->name);
			bool is_req = nl > 7 && strcmp(t->name + nl - 7, "Request") == 0;
			bool is_resp = nl > 8 && strcmp(t->name + nl - 8, "Response") == 0;
			int key = t->api_key;
			if (strcmp(t->name, "RequestHeader") == 0)
				is_req = true, key = 0xffff;
			if (strcmp(t->name, "ResponseHeader") == 0)
				is_resp = true, key = 0xffff;
			if ((kind == 0 && !is_req) || (kind == 1 && !is_resp) || key < 0)
				continue;
			for (int16_t v = t->min_version; v <= t->max_version; v++) {
				for (int mode = 0; mode < 2; mode++) {
					km_arena a;
					km_wr w;
					uint32_t seq = 1;
					void *m = calloc(1, t->struct_size);
					km_arena_init(&a, 0);
					t->init(m);
					t->fill(m, v, mode, &a, &seq);
					km_wr_init(&w);
					km_wr_u16(&w, (uint16_t)key);
					km_wr_i16(&w, v);
					t->encode(&w, v, m);
					snprintf(path, sizeof(path), "%s/%s/seed-%s-v%d-%d", dir, sub, t->name, v, mode);
					FILE *f = fopen(path, "wb");
					if (!f || fwrite(w.buf, 1, w.len, f) != w.len) {
						perror(path);
						return 1;
					}
					fclose(f);
					files++;
					km_wr_free(&w);
					km_arena_free(&a);
					free(m);
				}
			}
		}
	}
	printf("wrote %d seed files under %s\n", files, dir);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "--write-corpus") == 0)
		return write_corpus(argv[2]);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip_all),
		cmocka_unit_test(test_truncation_everywhere),
		cmocka_unit_test(test_golden_captures),
		cmocka_unit_test(test_golden_frames),
		cmocka_unit_test(test_unknown_tags_preserved),
		cmocka_unit_test(test_known_tagged_fields),
		cmocka_unit_test(test_tag_known_only_in_later_versions),
		cmocka_unit_test(test_versions_and_ignorable),
		cmocka_unit_test(test_request_header),
		cmocka_unit_test(test_nullable_struct),
		cmocka_unit_test(test_api_table),
		cmocka_unit_test(test_generic_codec),
		cmocka_unit_test(test_mirror_errors_documented),
		cmocka_unit_test(test_arena),
		cmocka_unit_test(test_decode_caps_and_errors),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
