/* Unit tests for the mirror hooks' pure parts: name checks, the mirror.name split and merge of config requests, the DescribeConfigs addition. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kmirror/api.h"
#include "kmirror/msg/api_keys.h"
#include "proxy/mirror_rpc.h"

/* Encode m with key's request codec at version v, then decode it back into out (as the hooks see a request). */
static const km_mcfg_guard state_only = {"__mirror_state", NULL, NULL, 0};

static void roundtrip_request(int16_t key, int16_t v, const void *m, void *out, km_arena *a, km_wr *w)
{
	const km_api_info *api = km_api_lookup(key);
	km_rd r;
	km_wr_init(w);
	api->request.encode(w, v, m);
	assert_true(km_wr_ok(w));
	km_rd_init(&r, w->buf, w->len);
	api->request.init(out);
	assert_int_equal(api->request.decode(&r, v, out, a), KM_OK);
	assert_int_equal(km_rd_left(&r), 0);
}

static void test_names(void **state)
{
	char err[300], longname[260];
	km_str dup[2] = {km_str_c("a"), km_str_c("a")};

	(void)state;
	assert_int_equal(km_mirror_check_name(km_str_c("orders.v1_x-2"), "topic", err, sizeof(err)), KM_OK);
	assert_int_equal(km_mirror_check_name(km_str_c(""), "topic", err, sizeof(err)), KM_KAFKA_INVALID_REQUEST);
	assert_string_equal(err, "topic name is empty");
	assert_int_equal(km_mirror_check_name(km_str_c(".."), "topic", err, sizeof(err)), KM_KAFKA_INVALID_REQUEST);
	assert_int_equal(km_mirror_check_name(km_str_c("a b"), "topic", err, sizeof(err)), KM_KAFKA_INVALID_REQUEST);
	assert_non_null(strstr(err, "0x20"));
	memset(longname, 'x', 249);
	longname[249] = '\0';
	assert_int_equal(km_mirror_check_name(km_str_c(longname), "topic", err, sizeof(err)), KM_OK);
	longname[249] = 'x';
	longname[250] = '\0';
	assert_int_equal(km_mirror_check_name(km_str_c(longname), "topic", err, sizeof(err)), KM_KAFKA_INVALID_REQUEST);
	assert_non_null(strstr(err, "250 characters"));
	/* A long name with a character Kafka refuses: the reason gives its code, never the bytes themselves. */
	memcpy(longname, "evil\n\x1b[2J", 9);
	assert_int_equal(km_mirror_check_name(km_str_c(longname), "topic", err, sizeof(err)), KM_KAFKA_INVALID_REQUEST);
	assert_non_null(strstr(err, "0x0a at 4"));
	assert_null(strchr(err, '\n'));
	assert_null(strchr(err, '\x1b'));
	/* mirror names cannot carry mirror.name's suffixes; topic names can */
	assert_int_equal(km_mirror_check_name(km_str_c("m.paused"), "mirror", err, sizeof(err)), KM_KAFKA_INVALID_REQUEST);
	assert_int_equal(km_mirror_check_name(km_str_c("m.paused"), "topic", err, sizeof(err)), KM_OK);
	assert_int_equal(km_mirror_check_names(dup, 2, "topic", err, sizeof(err)), KM_KAFKA_INVALID_REQUEST);
	assert_string_equal(err, "topic 'a' is named more than once");
}

/* One IncrementalAlterConfigs resource with up to three configs. */
typedef struct iac_res {
	int8_t type;
	const char *name;
	struct {
		const char *name;
		int8_t op;
		const char *value;
	} c[3];
	int n;
} iac_res;

static void build_iac(km_incremental_alter_configs_request *m, const iac_res *res, int n, bool validate_only,
		      km_arena *a)
{
	km_incremental_alter_configs_request_init(m);
	m->validate_only = validate_only;
	m->resources.count = n;
	m->resources.items = km_arena_calloc(a, sizeof(*m->resources.items) * (size_t)n);
	for (int i = 0; i < n; i++) {
		km_incremental_alter_configs_request_alter_configs_resource *r = &m->resources.items[i];
		km_incremental_alter_configs_request_alter_configs_resource_init(r);
		r->resource_type = res[i].type;
		r->resource_name = km_str_c(res[i].name);
		r->configs.count = res[i].n;
		r->configs.items = km_arena_calloc(a, sizeof(*r->configs.items) * (size_t)(res[i].n + 1));
		for (int j = 0; j < res[i].n; j++) {
			km_incremental_alter_configs_request_alterable_config_init(&r->configs.items[j]);
			r->configs.items[j].name = km_str_c(res[i].c[j].name);
			r->configs.items[j].config_operation = res[i].c[j].op;
			r->configs.items[j].value = km_str_c(res[i].c[j].value);
		}
	}
}

static void test_iac_split_merge(void **state)
{
	static const iac_res res[] = {
		{KM_RESOURCE_TOPIC, "orders", {{"mirror.name", 0, "m1"}, {"retention.ms", 0, "1000"}}, 2},
		{KM_RESOURCE_TOPIC, "plain", {{"retention.ms", 0, "5"}}, 1},
		{KM_RESOURCE_TOPIC, "__mirror_state", {{"cleanup.policy", 0, "delete"}}, 1},
		{KM_RESOURCE_TOPIC, "paused", {{"mirror.name", 0, "m1.paused"}}, 1},
		{KM_RESOURCE_TOPIC, "gone", {{"mirror.name", 1, NULL}}, 1},
		{KM_RESOURCE_TOPIC, "bad", {{"mirror.name", 2, "x"}}, 1},
		{KM_RESOURCE_BROKER, "1", {{"mirror.name", 0, "m1"}}, 1},
	};
	km_incremental_alter_configs_request built, in;
	km_incremental_alter_configs_response resp, out, fwd_back;
	km_mcfg_split sp;
	km_arena a;
	km_wr w, w2, rw_keep;
	(void)state;

	km_arena_init(&a, 0);
	build_iac(&built, res, 7, false, &a);
	roundtrip_request(KM_API_INCREMENTAL_ALTER_CONFIGS, 1, &built, &in, &a, &w);
	assert_int_equal(km_mcfg_split_iac(&in, &state_only, &a, &sp), KM_OK);
	assert_true(sp.mine);
	assert_int_equal(sp.nres, 7);
	/* forwarded: orders (retention only), plain, paused (no configs), gone (no configs), the broker resource */
	assert_int_equal(sp.fwd.resources.count, 5);
	assert_true(km_str_eq_c(sp.fwd.resources.items[0].resource_name, "orders"));
	assert_int_equal(sp.fwd.resources.items[0].configs.count, 1);
	assert_true(km_str_eq_c(sp.fwd.resources.items[0].configs.items[0].name, "retention.ms"));
	assert_true(km_str_eq_c(sp.fwd.resources.items[2].resource_name, "paused"));
	assert_int_equal(sp.fwd.resources.items[2].configs.count, 0);
	/* mirror.name on a broker resource is not ours: the broker refuses it as it would */
	assert_int_equal(sp.fwd.resources.items[4].configs.count, 1);
	assert_int_equal(sp.res[0].kind, KM_MCFG_SET);
	assert_true(km_str_eq_c(sp.res[0].mirror, "m1"));
	assert_int_equal(sp.res[1].kind, KM_MCFG_NONE);
	assert_int_equal(sp.res[2].fwd, -1);
	assert_int_equal(sp.res[2].code, KM_KAFKA_TOPIC_AUTHORIZATION_FAILED);
	assert_true(km_str_eq_c(sp.res[2].message, "written and configured only by kmirrord"));
	assert_int_equal(sp.res[3].kind, KM_MCFG_PAUSE);
	assert_true(km_str_eq_c(sp.res[3].mirror, "m1"));
	assert_int_equal(sp.res[4].kind, KM_MCFG_STOP);
	assert_int_equal(sp.res[4].mirror.len, 0);
	assert_int_equal(sp.res[5].code, KM_KAFKA_INVALID_CONFIG);
	assert_int_equal(sp.res[5].fwd, -1);
	assert_int_equal(sp.res[6].kind, KM_MCFG_NONE);

	/* the forwarded request encodes: the broker would get no mirror.name on a topic */
	km_wr_init(&w2);
	km_incremental_alter_configs_request_encode(&w2, 1, &sp.fwd);
	assert_true(km_wr_ok(&w2));
	assert_null(memmem(w2.buf, w2.len, "m1.paused", 9));

	/* the broker answers the five forwarded; "plain" refused by the broker */
	km_incremental_alter_configs_response_init(&resp);
	resp.responses.count = 5;
	resp.responses.items = km_arena_calloc(&a, sizeof(*resp.responses.items) * 5);
	for (int i = 0; i < 5; i++) {
		km_incremental_alter_configs_response_alter_configs_resource_response_init(&resp.responses.items[i]);
		resp.responses.items[i].resource_type = sp.fwd.resources.items[i].resource_type;
		resp.responses.items[i].resource_name = sp.fwd.resources.items[i].resource_name;
	}
	resp.responses.items[1].error_code = KM_KAFKA_TOPIC_AUTHORIZATION_FAILED;
	resp.responses.items[1].error_message = km_str_c("Topic authorization failed.");
	{
		/* through the codec, as the probe's callback sees it */
		const km_api_info *api = km_api_lookup(KM_API_INCREMENTAL_ALTER_CONFIGS);
		km_wr rw;
		km_rd r;
		km_wr_init(&rw);
		api->response.encode(&rw, 1, &resp);
		km_rd_init(&r, rw.buf, rw.len);
		km_incremental_alter_configs_response_init(&fwd_back);
		assert_int_equal(km_incremental_alter_configs_response_decode(&r, 1, &fwd_back, &a), KM_OK);
		assert_int_equal(km_mcfg_take_iac(&sp, &fwd_back, false, &a), KM_OK);
		/* fwd_back borrows rw's bytes: kept until the end, where it is read again */
		rw_keep = rw;
	}
	assert_int_equal(sp.res[1].code, KM_KAFKA_TOPIC_AUTHORIZATION_FAILED);
	assert_int_equal(sp.res[0].code, 0);
	/* the mirror operation on "paused" failed: its result carries the code and message */
	km_mcfg_set(&sp, 3, KM_MIRROR_INVALID_CLUSTER_MIRROR_STATES, "cannot pause topic paused of mirror m1: it is PREPARING", &a);
	assert_int_equal(km_mcfg_merge_iac(&in, &sp, &a, &out), KM_OK);
	assert_int_equal(out.responses.count, 7);
	for (int i = 0; i < 7; i++)
		assert_true(km_str_eq(out.responses.items[i].resource_name, in.resources.items[i].resource_name));
	assert_int_equal(out.responses.items[0].error_code, 0);
	assert_int_equal(out.responses.items[0].error_message.len, -1);
	assert_int_equal(out.responses.items[1].error_code, KM_KAFKA_TOPIC_AUTHORIZATION_FAILED);
	assert_true(km_str_eq_c(out.responses.items[1].error_message, "Topic authorization failed."));
	assert_int_equal(out.responses.items[2].error_code, KM_KAFKA_TOPIC_AUTHORIZATION_FAILED);
	assert_int_equal(out.responses.items[3].error_code, KM_MIRROR_INVALID_CLUSTER_MIRROR_STATES);
	assert_true(km_str_eq_c(out.responses.items[3].error_message,
				"cannot pause topic paused of mirror m1: it is PREPARING"));
	assert_int_equal(out.responses.items[5].error_code, KM_KAFKA_INVALID_CONFIG);
	assert_true(out.responses.items[5].error_message.len > 0);

	/* a broker answer that does not match what was sent is refused */
	fwd_back.responses.count = 4;
	assert_int_equal(km_mcfg_take_iac(&sp, &fwd_back, false, &a), KM_ERR_DECODE);
	km_wr_free(&rw_keep);
	km_wr_free(&w);
	km_wr_free(&w2);
	km_arena_free(&a);
}

/* The guard's synced topics: "orders" and "paused" are mirror topics. */
static bool synced_table(void *arg, km_str topic, char *msg, size_t len)
{
	(void)arg;
	snprintf(msg, len, "%.*s follows its source", (int)topic.len, topic.p);
	return km_str_eq_c(topic, "orders") || km_str_eq_c(topic, "paused");
}

/* A mirror topic's configs are the metadata sync's: anything but mirror.name is refused, whole. */
static void test_synced_topics_refuse_configs(void **state)
{
	static const iac_res res[] = {
		{KM_RESOURCE_TOPIC, "orders", {{"mirror.name", 0, "m1"}, {"retention.ms", 0, "1000"}}, 2},
		{KM_RESOURCE_TOPIC, "paused", {{"mirror.name", 0, "m1.paused"}}, 1},
		{KM_RESOURCE_TOPIC, "plain", {{"retention.ms", 0, "5"}}, 1},
		{KM_RESOURCE_TOPIC, "orders", {{"cleanup.policy", 0, "delete"}}, 1},
	};
	const km_mcfg_guard g = {"__mirror_state", synced_table, NULL, KM_KAFKA_POLICY_VIOLATION};
	km_incremental_alter_configs_request in;
	km_alter_configs_request ac;
	km_alter_configs_request_alter_configs_resource r;
	km_mcfg_split sp;
	km_arena a;
	(void)state;

	km_arena_init(&a, 0);
	build_iac(&in, res, 4, false, &a);
	assert_int_equal(km_mcfg_split_iac(&in, &g, &a, &sp), KM_OK);
	assert_true(sp.mine);
	assert_int_equal(sp.res[0].code, KM_KAFKA_POLICY_VIOLATION);
	assert_int_equal(sp.res[0].fwd, -1);
	assert_true(km_str_eq_c(sp.res[0].message, "orders follows its source"));
	assert_int_equal(sp.res[1].code, 0); /* mirror.name alone: a mirror operation, as ever */
	assert_int_equal(sp.res[1].kind, KM_MCFG_PAUSE);
	assert_int_equal(sp.res[2].code, 0);
	assert_int_equal(sp.res[3].code, KM_KAFKA_POLICY_VIOLATION);
	assert_int_equal(sp.fwd.resources.count, 2); /* paused (no configs left) and plain */
	/* The legacy request replaces every config: an empty set on a mirror topic is a change too. */
	km_alter_configs_request_init(&ac);
	km_alter_configs_request_alter_configs_resource_init(&r);
	r.resource_type = KM_RESOURCE_TOPIC;
	r.resource_name = km_str_c("orders");
	r.configs.count = 0;
	ac.resources.items = &r;
	ac.resources.count = 1;
	assert_int_equal(km_mcfg_split_ac(&ac, &g, &a, &sp), KM_OK);
	assert_int_equal(sp.res[0].code, KM_KAFKA_POLICY_VIOLATION);
	assert_int_equal(sp.fwd_legacy.resources.count, 0);
	km_arena_free(&a);
}

/* The duplicate check: the first repeat, or none; linear, so a large list is cheap. */
static void test_first_dup(void **state)
{
	km_str v[5] = {km_str_c("a"), km_str_c("bb"), km_str_c("c"), km_str_c("bb"), km_str_c("a")};
	enum { N = 200000 };
	km_str *many = calloc(N, sizeof(*many));
	char *text = calloc(N, 8);
	size_t dup;
	(void)state;

	assert_int_equal(km_str_first_dup(v, 5, sizeof(*v), 0, &dup), KM_OK);
	assert_int_equal(dup, 3);
	assert_int_equal(km_str_first_dup(v, 3, sizeof(*v), 0, &dup), KM_OK);
	assert_int_equal(dup, 3); /* none: n */
	assert_int_equal(km_str_first_dup(v, 0, sizeof(*v), 0, &dup), KM_OK);
	assert_int_equal(dup, 0);
	assert_non_null(many);
	assert_non_null(text);
	for (int i = 0; i < N; i++) {
		snprintf(text + (size_t)i * 8, 8, "t%06d", i);
		many[i] = km_str_c(text + (size_t)i * 8);
	}
	assert_int_equal(km_str_first_dup(many, N, sizeof(*many), 0, &dup), KM_OK);
	assert_int_equal(dup, N);
	many[N - 1] = many[17];
	assert_int_equal(km_str_first_dup(many, N, sizeof(*many), 0, &dup), KM_OK);
	assert_int_equal(dup, N - 1);
	free(many);
	free(text);
}

static void test_iac_plain_is_not_ours(void **state)
{
	static const iac_res res[] = {{KM_RESOURCE_TOPIC, "t", {{"retention.ms", 0, "1"}}, 1}};
	km_incremental_alter_configs_request built, in;
	km_mcfg_split sp;
	km_arena a;
	km_wr w;
	(void)state;
	km_arena_init(&a, 0);
	build_iac(&built, res, 1, false, &a);
	roundtrip_request(KM_API_INCREMENTAL_ALTER_CONFIGS, 0, &built, &in, &a, &w);
	assert_int_equal(km_mcfg_split_iac(&in, &state_only, &a, &sp), KM_OK);
	assert_false(sp.mine);
	km_wr_free(&w);
	km_arena_free(&a);
}

static void test_ac_split_merge(void **state)
{
	km_alter_configs_request built, in;
	km_alter_configs_request_alter_configs_resource r[3];
	km_alter_configs_request_alterable_config c0[2], c1[1], c2[1];
	km_alter_configs_response fwd, auth_unused, out;
	km_incremental_alter_configs_response auth;
	km_mcfg_split sp;
	km_arena a;
	km_wr w;
	(void)state;
	(void)auth_unused;

	km_arena_init(&a, 0);
	km_alter_configs_request_init(&built);
	for (int i = 0; i < 3; i++)
		km_alter_configs_request_alter_configs_resource_init(&r[i]);
	km_alter_configs_request_alterable_config_init(&c0[0]);
	km_alter_configs_request_alterable_config_init(&c0[1]);
	km_alter_configs_request_alterable_config_init(&c1[0]);
	km_alter_configs_request_alterable_config_init(&c2[0]);
	/* "a": mirror.name and another config; "b": only mirror.name (never forwarded empty); "c": plain */
	c0[0].name = km_str_c("mirror.name");
	c0[0].value = km_str_c("m1.removed");
	c0[1].name = km_str_c("retention.ms");
	c0[1].value = km_str_c("10");
	c1[0].name = km_str_c("mirror.name");
	c1[0].value = km_str_c("m1");
	c2[0].name = km_str_c("retention.ms");
	c2[0].value = km_str_c("20");
	r[0].resource_type = r[1].resource_type = r[2].resource_type = KM_RESOURCE_TOPIC;
	r[0].resource_name = km_str_c("a");
	r[1].resource_name = km_str_c("b");
	r[2].resource_name = km_str_c("c");
	r[0].configs.items = c0;
	r[0].configs.count = 2;
	r[1].configs.items = c1;
	r[1].configs.count = 1;
	r[2].configs.items = c2;
	r[2].configs.count = 1;
	built.resources.items = r;
	built.resources.count = 3;
	roundtrip_request(KM_API_ALTER_CONFIGS, 2, &built, &in, &a, &w);
	assert_int_equal(km_mcfg_split_ac(&in, &state_only, &a, &sp), KM_OK);
	assert_true(sp.mine);
	assert_int_equal(sp.fwd_legacy.resources.count, 2);
	assert_true(km_str_eq_c(sp.fwd_legacy.resources.items[0].resource_name, "a"));
	assert_int_equal(sp.fwd_legacy.resources.items[0].configs.count, 1);
	assert_true(km_str_eq_c(sp.fwd_legacy.resources.items[1].resource_name, "c"));
	assert_int_equal(sp.res[0].kind, KM_MCFG_STOP);
	assert_true(km_str_eq_c(sp.res[0].mirror, "m1"));
	assert_int_equal(sp.res[1].kind, KM_MCFG_SET);
	assert_int_equal(sp.res[1].fwd, -1);
	assert_int_equal(sp.res[1].auth, 0);
	assert_true(sp.auth.validate_only);
	assert_int_equal(sp.auth.resources.count, 1);
	assert_int_equal(sp.auth.resources.items[0].configs.count, 0);

	km_alter_configs_response_init(&fwd);
	fwd.responses.count = 2;
	fwd.responses.items = km_arena_calloc(&a, sizeof(*fwd.responses.items) * 2);
	for (int i = 0; i < 2; i++) {
		km_alter_configs_response_alter_configs_resource_response_init(&fwd.responses.items[i]);
		fwd.responses.items[i].resource_type = KM_RESOURCE_TOPIC;
		fwd.responses.items[i].resource_name = sp.fwd_legacy.resources.items[i].resource_name;
	}
	km_incremental_alter_configs_response_init(&auth);
	auth.responses.count = 1;
	auth.responses.items = km_arena_calloc(&a, sizeof(*auth.responses.items));
	km_incremental_alter_configs_response_alter_configs_resource_response_init(&auth.responses.items[0]);
	auth.responses.items[0].resource_type = KM_RESOURCE_TOPIC;
	auth.responses.items[0].resource_name = km_str_c("b");
	auth.responses.items[0].error_code = KM_KAFKA_TOPIC_AUTHORIZATION_FAILED;
	assert_int_equal(km_mcfg_take_ac(&sp, &fwd, &a), KM_OK);
	assert_int_equal(km_mcfg_take_iac(&sp, &auth, true, &a), KM_OK);
	/* a refusal without a message still gets one */
	assert_int_equal(sp.res[1].code, KM_KAFKA_TOPIC_AUTHORIZATION_FAILED);
	assert_true(sp.res[1].message.len > 0);
	assert_int_equal(km_mcfg_merge_ac(&in, &sp, &a, &out), KM_OK);
	assert_int_equal(out.responses.count, 3);
	assert_int_equal(out.responses.items[0].error_code, 0);
	assert_int_equal(out.responses.items[1].error_code, KM_KAFKA_TOPIC_AUTHORIZATION_FAILED);
	assert_true(km_str_eq_c(out.responses.items[2].resource_name, "c"));
	km_wr_free(&w);
	km_arena_free(&a);
}

/*
 * A broker answers config resources in its own order: the refused ones first, then the
 * controller's map order (ControllerApis.handleIncrementalAlterConfigs). Each resource must get
 * its own verdict, found by type and name, for the forwarded request and the authorizing probe.
 */
static void test_take_matches_by_name(void **state)
{
	static const iac_res res[] = {
		{KM_RESOURCE_TOPIC, "allowed", {{"mirror.name", 0, "m1"}}, 1},
		{KM_RESOURCE_TOPIC, "denied", {{"mirror.name", 0, "m1"}}, 1},
		{KM_RESOURCE_TOPIC, "plain", {{"retention.ms", 0, "5"}}, 1},
	};
	km_incremental_alter_configs_request built, in;
	km_incremental_alter_configs_response resp;
	km_alter_configs_response acr;
	km_mcfg_split sp;
	km_arena a;
	km_wr w;
	(void)state;

	km_arena_init(&a, 0);
	build_iac(&built, res, 3, false, &a);
	roundtrip_request(KM_API_INCREMENTAL_ALTER_CONFIGS, 1, &built, &in, &a, &w);
	assert_int_equal(km_mcfg_split_iac(&in, &state_only, &a, &sp), KM_OK);
	assert_int_equal(sp.fwd.resources.count, 3);
	/* the broker's order: "denied" (refused) first, then the others reversed */
	km_incremental_alter_configs_response_init(&resp);
	resp.responses.count = 3;
	resp.responses.items = km_arena_calloc(&a, sizeof(*resp.responses.items) * 3);
	for (int i = 0; i < 3; i++) {
		km_incremental_alter_configs_response_alter_configs_resource_response_init(&resp.responses.items[i]);
		resp.responses.items[i].resource_type = KM_RESOURCE_TOPIC;
	}
	resp.responses.items[0].resource_name = km_str_c("denied");
	resp.responses.items[0].error_code = KM_KAFKA_TOPIC_AUTHORIZATION_FAILED;
	resp.responses.items[1].resource_name = km_str_c("plain");
	resp.responses.items[2].resource_name = km_str_c("allowed");
	assert_int_equal(km_mcfg_take_iac(&sp, &resp, false, &a), KM_OK);
	assert_int_equal(sp.res[0].code, 0);
	assert_int_equal(sp.res[1].code, KM_KAFKA_TOPIC_AUTHORIZATION_FAILED);
	assert_int_equal(sp.res[2].code, 0);
	/* a resource the broker did not answer is not taken as allowed */
	resp.responses.items[0].resource_name = km_str_c("other");
	assert_int_equal(km_mcfg_take_iac(&sp, &resp, false, &a), KM_ERR_DECODE);
	km_wr_free(&w);

	/* AlterConfigs: the same, forwarded resources answered out of order */
	{
		km_alter_configs_request b2, in2;
		km_alter_configs_request_alter_configs_resource r[2];
		km_alter_configs_request_alterable_config c[2];
		for (int i = 0; i < 2; i++) {
			km_alter_configs_request_alter_configs_resource_init(&r[i]);
			km_alter_configs_request_alterable_config_init(&c[i]);
			c[i].name = km_str_c(i ? "retention.ms" : "mirror.name");
			c[i].value = km_str_c(i ? "20" : "m1.removed");
			r[i].resource_type = KM_RESOURCE_TOPIC;
			r[i].configs.items = &c[i];
			r[i].configs.count = 1;
		}
		/* "x": mirror.name only (authorized by the probe), "y" and "z": plain, forwarded */
		km_alter_configs_request_alter_configs_resource r3[3] = {r[0], r[1], r[1]};
		r3[0].resource_name = km_str_c("x");
		r3[1].resource_name = km_str_c("y");
		r3[2].resource_name = km_str_c("z");
		km_alter_configs_request_init(&b2);
		b2.resources.items = r3;
		b2.resources.count = 3;
		roundtrip_request(KM_API_ALTER_CONFIGS, 2, &b2, &in2, &a, &w);
		assert_int_equal(km_mcfg_split_ac(&in2, &state_only, &a, &sp), KM_OK);
		assert_int_equal(sp.fwd_legacy.resources.count, 2);
		km_alter_configs_response_init(&acr);
		acr.responses.count = 2;
		acr.responses.items = km_arena_calloc(&a, sizeof(*acr.responses.items) * 2);
		for (int i = 0; i < 2; i++) {
			km_alter_configs_response_alter_configs_resource_response_init(&acr.responses.items[i]);
			acr.responses.items[i].resource_type = KM_RESOURCE_TOPIC;
		}
		acr.responses.items[0].resource_name = km_str_c("z");
		acr.responses.items[0].error_code = KM_KAFKA_TOPIC_AUTHORIZATION_FAILED;
		acr.responses.items[1].resource_name = km_str_c("y");
		assert_int_equal(km_mcfg_take_ac(&sp, &acr, &a), KM_OK);
		assert_int_equal(sp.res[1].code, 0);
		assert_int_equal(sp.res[2].code, KM_KAFKA_TOPIC_AUTHORIZATION_FAILED);
		km_wr_free(&w);
	}
	km_arena_free(&a);
}

static bool lookup(void *arg, km_str topic, char *value, size_t cap)
{
	(void)arg;
	if (!km_str_eq_c(topic, "orders"))
		return false;
	snprintf(value, cap, "m1.paused");
	return true;
}

static void test_describe_add(void **state)
{
	km_describe_configs_request_describe_configs_resource q;
	km_describe_configs_response m, back;
	km_describe_configs_response_describe_configs_result res[2];
	km_describe_configs_response_describe_configs_resource_result cfg;
	km_str keys[1] = {km_str_c("retention.ms")}, topics[2] = {km_str_c("orders"), km_str_c("plain")};
	const km_api_info *api = km_api_lookup(KM_API_DESCRIBE_CONFIGS);
	km_arena a;
	int added = 0;
	(void)state;

	km_describe_configs_request_describe_configs_resource_init(&q);
	q.resource_type = KM_RESOURCE_TOPIC;
	q.configuration_keys.count = -1;
	assert_true(km_mcfg_describe_wants(&q));
	q.configuration_keys.count = 1;
	q.configuration_keys.items = keys;
	assert_false(km_mcfg_describe_wants(&q));
	keys[0] = km_str_c("mirror.name");
	assert_true(km_mcfg_describe_wants(&q));
	q.resource_type = KM_RESOURCE_BROKER;
	assert_false(km_mcfg_describe_wants(&q));

	km_arena_init(&a, 0);
	km_describe_configs_response_init(&m);
	for (int i = 0; i < 2; i++) {
		km_describe_configs_response_describe_configs_result_init(&res[i]);
		res[i].resource_type = KM_RESOURCE_TOPIC;
		res[i].resource_name = topics[i];
		res[i].configs.count = 1;
		res[i].configs.items = &cfg;
	}
	km_describe_configs_response_describe_configs_resource_result_init(&cfg);
	cfg.name = km_str_c("retention.ms");
	cfg.value = km_str_c("1000");
	m.results.items = res;
	m.results.count = 2;
	assert_int_equal(km_mcfg_describe_add(&m, topics, 2, true, lookup, NULL, &a, &added), KM_OK);
	assert_int_equal(added, 1);
	assert_int_equal(res[0].configs.count, 2);
	assert_int_equal(res[1].configs.count, 1);
	/* in every version's shape: encode and decode v1 and v4 */
	for (int16_t v = 1; v <= 4; v += 3) {
		km_wr w;
		km_rd r;
		km_wr_init(&w);
		api->response.encode(&w, v, &m);
		assert_true(km_wr_ok(&w));
		km_rd_init(&r, w.buf, w.len);
		km_describe_configs_response_init(&back);
		assert_int_equal(km_describe_configs_response_decode(&r, v, &back, &a), KM_OK);
		assert_int_equal(back.results.items[0].configs.count, 2);
		{
			const km_describe_configs_response_describe_configs_resource_result *e =
				&back.results.items[0].configs.items[1];
			assert_true(km_str_eq_c(e->name, "mirror.name"));
			assert_true(km_str_eq_c(e->value, "m1.paused"));
			assert_true(e->read_only);
			assert_int_equal(e->config_source, KM_CONFIG_SOURCE_DYNAMIC_TOPIC);
			assert_int_equal(e->synonyms.count, 1);
		}
		km_wr_free(&w);
	}
	km_arena_free(&a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_iac_split_merge),
		cmocka_unit_test(test_iac_plain_is_not_ours),
		cmocka_unit_test(test_synced_topics_refuse_configs),
		cmocka_unit_test(test_first_dup),
		cmocka_unit_test(test_ac_split_merge),
		cmocka_unit_test(test_take_matches_by_name),
		cmocka_unit_test(test_describe_add),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
