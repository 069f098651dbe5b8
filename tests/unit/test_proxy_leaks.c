/* Unit tests for the responses that can carry upstream addresses outside broker lists: DescribeConfigs, DescribeQuorum, ShareFetch, ShareAcknowledge. */
#define _GNU_SOURCE /* memmem */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kmirror/msg/describe_configs_response.h"
#include "kmirror/msg/describe_quorum_response.h"
#include "kmirror/msg/share_acknowledge_response.h"
#include "kmirror/msg/share_fetch_response.h"
#include "proxy/apis.h"
#include "proxy/rewrite.h"

/* Strings that name the fake upstream cluster: none may survive a rewrite. */
static const char *const upstream[] = {"10.1.2.3", "10.1.2.9", "broker2.internal", "fd00::1", ":12894", ":22407", ":14830"};

static int learned_n;

static void learn(void *arg, int32_t node, km_str host, int32_t port, km_str rack)
{
	(void)arg, (void)node, (void)host, (void)port, (void)rack;
	learned_n++;
}

static km_rewrite_ctx ctx_make(void)
{
	km_rewrite_ctx c = {.host = "proxy.local", .port_base = 19000, .port_count = 100, .learn = learn};
	learned_n = 0;
	return c;
}

static void assert_no_upstream(const km_wr *w)
{
	for (size_t i = 0; i < sizeof(upstream) / sizeof(upstream[0]); i++)
		if (memmem(w->buf, w->len, upstream[i], strlen(upstream[i]))) {
			print_error("upstream string %s survived\n", upstream[i]);
			fail();
		}
}

static void assert_same_bytes(const km_wr *got, const km_wr *want)
{
	assert_int_equal(got->len, want->len);
	assert_memory_equal(got->buf, want->buf, want->len);
}

/* ---- value classification ---- */

static void test_value_has_endpoint(void **state)
{
	static const char *const yes[] = {"CLIENT://127.0.0.1:12894", "127.0.0.1:14830", "1@10.1.2.9:14830,2@h:1",
					  "PLAINTEXT://myhost:9092", "[fd00::1]:9092", "x,localhost:1",
					  "https://idp.example:8443/keys"};
	static const char *const no[] = {"", "3", "CLIENT:PLAINTEXT,SASL:SASL_PLAINTEXT", "0:1,1:2", "/var/lib/kafka",
					 "RULE:^CN=(.*?)$/$1/L,DEFAULT", "host:123456", "at 12:30pm", "INFO", ":9092"};
	(void)state;
	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++)
		if (!km_rewrite_value_has_endpoint(km_str_c(yes[i]))) {
			print_error("not seen as an endpoint: %s\n", yes[i]);
			fail();
		}
	for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
		if (km_rewrite_value_has_endpoint(km_str_c(no[i]))) {
			print_error("seen as an endpoint: %s\n", no[i]);
			fail();
		}
}

/* ---- DescribeConfigs ---- */

typedef km_describe_configs_response_describe_configs_result dc_result;
typedef km_describe_configs_response_describe_configs_resource_result dc_config;
typedef km_describe_configs_response_describe_configs_synonym dc_synonym;

enum { NCONF = 9 };

/* One config with a synonym of the same name and value (a static broker config, as brokers report it). */
static void conf(dc_config *c, dc_synonym *syn, const char *name, const char *value)
{
	km_describe_configs_response_describe_configs_resource_result_init(c);
	km_describe_configs_response_describe_configs_synonym_init(syn);
	c->name = km_str_c(name);
	c->value = km_str_c(value);
	c->read_only = true;
	c->config_source = 4;
	c->config_type = 2;
	c->documentation = km_str_c("doc for clients");
	syn->name = c->name;
	syn->value = c->value;
	syn->source = 4;
	c->synonyms.count = 1;
	c->synonyms.items = syn;
}

typedef struct dc_fixture {
	km_describe_configs_response m;
	dc_result res[4];
	dc_config broker[NCONF], dflt[1], topic[2], logger[1];
	dc_synonym bsyn[NCONF], dsyn[1], tsyn[2], lsyn[1];
} dc_fixture;

static void dc_build(dc_fixture *f)
{
	memset(f, 0, sizeof(*f));
	km_describe_configs_response_init(&f->m);
	f->m.throttle_time_ms = 7;
	for (int i = 0; i < 4; i++)
		km_describe_configs_response_describe_configs_result_init(&f->res[i]);
	/* BROKER "2" */
	f->res[0].resource_type = 4;
	f->res[0].resource_name = km_str_c("2");
	conf(&f->broker[0], &f->bsyn[0], "listeners", "CLIENT://10.1.2.3:12894,SASL://10.1.2.3:22407");
	conf(&f->broker[1], &f->bsyn[1], "advertised.listeners", "CLIENT://broker2.internal:12894,SASL://broker2.internal:22407");
	conf(&f->broker[2], &f->bsyn[2], "controller.quorum.bootstrap.servers", "10.1.2.9:14830");
	conf(&f->broker[3], &f->bsyn[3], "controller.quorum.voters", "1@10.1.2.9:14830");
	conf(&f->broker[4], &f->bsyn[4], "num.partitions", "3");
	conf(&f->broker[5], &f->bsyn[5], "listener.security.protocol.map", "CLIENT:PLAINTEXT,SASL:SASL_PLAINTEXT");
	conf(&f->broker[6], &f->bsyn[6], "custom.endpoint", "[fd00::1]:9092");
	conf(&f->broker[7], &f->bsyn[7], "early.start.listeners", "");
	conf(&f->broker[8], &f->bsyn[8], "log.dirs", "/var/lib/kafka/data");
	f->broker[8].synonyms.count = 0; /* an empty synonym list stays empty */
	f->res[0].configs.count = NCONF;
	f->res[0].configs.items = f->broker;
	/* BROKER "" (cluster default): advertised.listeners has no node, so it is hidden */
	f->res[1].resource_type = 4;
	f->res[1].resource_name = km_str_c("");
	conf(&f->dflt[0], &f->dsyn[0], "advertised.listeners", "CLIENT://broker2.internal:12894");
	f->res[1].configs.count = 1;
	f->res[1].configs.items = f->dflt;
	/* TOPIC: left alone, even a partition:broker pair list */
	f->res[2].resource_type = 2;
	f->res[2].resource_name = km_str_c("t");
	conf(&f->topic[0], &f->tsyn[0], "follower.replication.throttled.replicas", "0:1,1:2");
	conf(&f->topic[1], &f->tsyn[1], "cleanup.policy", "delete");
	f->res[2].configs.count = 2;
	f->res[2].configs.items = f->topic;
	/* BROKER_LOGGER "2": a logger level stays */
	f->res[3].resource_type = 8;
	f->res[3].resource_name = km_str_c("2");
	f->res[3].error_code = 0;
	conf(&f->logger[0], &f->lsyn[0], "kafka.server.KafkaApis", "INFO");
	f->logger[0].synonyms.count = 0;
	f->res[3].configs.count = 1;
	f->res[3].configs.items = f->logger;
	f->m.results.count = 4;
	f->m.results.items = f->res;
}

static void hide(dc_config *c)
{
	c->value = KM_STR_NULL;
	c->is_sensitive = true;
	for (int32_t k = 0; k < c->synonyms.count; k++)
		c->synonyms.items[k].value = KM_STR_NULL;
}

static void test_describe_configs_all_versions(void **state)
{
	(void)state;
	for (int16_t v = KM_DESCRIBE_CONFIGS_RESPONSE_MIN_VERSION; v <= KM_DESCRIBE_CONFIGS_RESPONSE_MAX_VERSION; v++) {
		dc_fixture f;
		km_wr in, got, want;
		km_rewrite_ctx ctx = ctx_make();

		dc_build(&f);
		km_wr_init(&in);
		km_describe_configs_response_encode(&in, v, &f.m);
		assert_true(km_wr_ok(&in));
		assert_non_null(memmem(in.buf, in.len, "10.1.2.3:12894", 14)); /* the input does leak */

		km_wr_init(&got);
		assert_int_equal(km_rewrite_describe_configs(in.buf, in.len, v, &ctx, &got), KM_OK);
		assert_no_upstream(&got);

		/* The expected answer: the same message with exactly these changes. */
		hide(&f.broker[0]);
		f.broker[1].value = km_str_c("CLIENT://proxy.local:19002");
		f.bsyn[1].value = f.broker[1].value;
		hide(&f.broker[2]);
		hide(&f.broker[3]);
		hide(&f.broker[6]);
		hide(&f.dflt[0]);
		km_wr_init(&want);
		km_describe_configs_response_encode(&want, v, &f.m);
		assert_same_bytes(&got, &want);
		/* v0 has no synonyms: one fewer rewrite per config with a synonym */
		assert_int_equal(ctx.rewritten, v >= 1 ? 12 : 6);
		km_wr_free(&in);
		km_wr_free(&got);
		km_wr_free(&want);
	}
}

static void test_describe_configs_advertised_forms(void **state)
{
	static const struct {
		const char *host, *res, *in, *out; /* out NULL: hidden */
	} cases[] = {
		{"proxy.local", "5", "INTERNAL://10.1.2.3:1", "INTERNAL://proxy.local:19005"},
		{"proxy.local", "5", "10.1.2.3:1", "proxy.local:19005"},
		{"::1", "0", "C://10.1.2.3:1,D://10.1.2.3:2", "C://[::1]:19000"},
		{"proxy.local", "100", "C://10.1.2.3:1", NULL}, /* beyond the proxy's ports */
		{"proxy.local", "x", "C://10.1.2.3:1", NULL},
	};
	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		dc_fixture f;
		km_wr in, got, want;
		km_rewrite_ctx ctx = ctx_make();
		ctx.host = cases[i].host;
		dc_build(&f);
		f.m.results.count = 1;
		f.res[0].resource_name = km_str_c(cases[i].res);
		f.res[0].configs.count = 1;
		f.res[0].configs.items = &f.broker[1];
		f.broker[1].value = f.bsyn[1].value = km_str_c(cases[i].in);
		km_wr_init(&in);
		km_describe_configs_response_encode(&in, 4, &f.m);
		km_wr_init(&got);
		assert_int_equal(km_rewrite_describe_configs(in.buf, in.len, 4, &ctx, &got), KM_OK);
		if (cases[i].out) {
			f.broker[1].value = f.bsyn[1].value = km_str_c(cases[i].out);
		} else {
			hide(&f.broker[1]);
		}
		km_wr_init(&want);
		km_describe_configs_response_encode(&want, 4, &f.m);
		assert_same_bytes(&got, &want);
		km_wr_free(&in);
		km_wr_free(&got);
		km_wr_free(&want);
	}
}

static void test_describe_configs_malformed(void **state)
{
	dc_fixture f;
	km_wr in, out;
	km_rewrite_ctx ctx = ctx_make();
	(void)state;
	dc_build(&f);
	km_wr_init(&in);
	km_describe_configs_response_encode(&in, 4, &f.m);
	/* every truncation fails; none is passed on */
	for (size_t n = 0; n < in.len; n += 7) {
		km_wr_init(&out);
		assert_int_equal(km_rewrite_describe_configs(in.buf, n, 4, &ctx, &out), KM_ERR_DECODE);
		km_wr_free(&out);
	}
	/* a trailing byte after a whole message is not ignored */
	km_wr_i8(&in, 0);
	km_wr_init(&out);
	assert_int_equal(km_rewrite_describe_configs(in.buf, in.len, 4, &ctx, &out), KM_ERR_DECODE);
	km_wr_free(&out);
	km_wr_init(&out);
	assert_int_equal(km_rewrite_describe_configs(in.buf, in.len, 5, &ctx, &out), KM_ERR_UNSUPPORTED);
	km_wr_free(&out);
	km_wr_free(&in);
}

/* ---- DescribeQuorum ---- */

static void test_describe_quorum_all_versions(void **state)
{
	(void)state;
	for (int16_t v = KM_DESCRIBE_QUORUM_RESPONSE_MIN_VERSION; v <= KM_DESCRIBE_QUORUM_RESPONSE_MAX_VERSION; v++) {
		km_describe_quorum_response m;
		km_describe_quorum_response_topic_data topic;
		km_describe_quorum_response_partition_data part;
		km_describe_quorum_response_replica_state voters[2];
		km_describe_quorum_response_node nodes[2];
		km_describe_quorum_response_listener ls[3];
		km_wr in, got, want;
		km_rewrite_ctx ctx = ctx_make();

		km_describe_quorum_response_init(&m);
		km_describe_quorum_response_topic_data_init(&topic);
		km_describe_quorum_response_partition_data_init(&part);
		for (int i = 0; i < 2; i++) {
			km_describe_quorum_response_replica_state_init(&voters[i]);
			voters[i].replica_id = i + 1;
			voters[i].log_end_offset = 100 + i;
			if (v >= 2)
				voters[i].replica_directory_id.b[0] = (uint8_t)(i + 9);
			km_describe_quorum_response_node_init(&nodes[i]);
			nodes[i].node_id = i + 1;
		}
		for (int i = 0; i < 3; i++) {
			km_describe_quorum_response_listener_init(&ls[i]);
			ls[i].name = km_str_c("CONTROLLER");
			ls[i].host = km_str_c(i == 2 ? "broker2.internal" : "10.1.2.9");
			ls[i].port = (uint16_t)(14830 + (i == 1));
		}
		part.leader_id = 1;
		part.leader_epoch = 3;
		part.high_watermark = 101;
		part.current_voters.count = 2;
		part.current_voters.items = voters;
		part.observers.count = 0;
		topic.topic_name = km_str_c("__cluster_metadata");
		topic.partitions.count = 1;
		topic.partitions.items = &part;
		m.topics.count = 1;
		m.topics.items = &topic;
		if (v >= 2) {
			nodes[0].listeners.count = 2;
			nodes[0].listeners.items = ls;
			nodes[1].listeners.count = 1;
			nodes[1].listeners.items = ls + 2;
			m.nodes.count = 2;
			m.nodes.items = nodes;
		}
		km_wr_init(&in);
		km_describe_quorum_response_encode(&in, v, &m);
		assert_true(km_wr_ok(&in));
		km_wr_init(&got);
		assert_int_equal(km_rewrite_describe_quorum(in.buf, in.len, v, &ctx, &got), KM_OK);
		assert_no_upstream(&got);
		assert_int_equal(ctx.rewritten, v >= 2 ? 3 : 0);
		nodes[0].listeners.count = nodes[1].listeners.count = 0;
		km_wr_init(&want);
		km_describe_quorum_response_encode(&want, v, &m);
		assert_same_bytes(&got, &want);
		if (v < 2)
			assert_same_bytes(&got, &in); /* nothing to hide before v2 */
		km_wr_free(&in);
		km_wr_free(&got);
		km_wr_free(&want);
	}
}

/* ---- ShareFetch / ShareAcknowledge ---- */

static void test_share_fetch(void **state)
{
	static const uint8_t records[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
	(void)state;
	for (int16_t v = KM_SHARE_FETCH_RESPONSE_MIN_VERSION; v <= KM_SHARE_FETCH_RESPONSE_MAX_VERSION; v++) {
		km_share_fetch_response m;
		km_share_fetch_response_share_fetchable_topic_response t;
		km_share_fetch_response_partition_data p;
		km_share_fetch_response_node_endpoint ne[3];
		km_wr in, got, want;
		km_rewrite_ctx ctx = ctx_make();

		km_share_fetch_response_init(&m);
		km_share_fetch_response_share_fetchable_topic_response_init(&t);
		km_share_fetch_response_partition_data_init(&p);
		p.partition_index = 4;
		p.error_code = 6; /* NOT_LEADER_OR_FOLLOWER */
		p.current_leader.leader_id = 2;
		p.records = (km_bytes){records, sizeof(records)};
		t.topic_id.b[3] = 7;
		t.partitions.count = 1;
		t.partitions.items = &p;
		m.responses.count = 1;
		m.responses.items = &t;
		for (int i = 0; i < 3; i++) {
			km_share_fetch_response_node_endpoint_init(&ne[i]);
			ne[i].node_id = i == 2 ? -1 : i + 1;
			ne[i].host = km_str_c(i == 2 ? "" : i ? "broker2.internal" : "10.1.2.3");
			ne[i].port = i == 2 ? -1 : 12894;
			ne[i].rack = km_str_c(i ? NULL : "r1");
		}
		m.node_endpoints.count = 3;
		m.node_endpoints.items = ne;
		km_wr_init(&in);
		km_share_fetch_response_encode(&in, v, &m);
		km_wr_init(&got);
		assert_int_equal(km_rewrite_share_fetch(in.buf, in.len, v, &ctx, &got), KM_OK);
		assert_no_upstream(&got);
		assert_int_equal(ctx.rewritten, 2);
		assert_int_equal(learned_n, 2);
		ne[0].host = ne[1].host = km_str_c("proxy.local");
		ne[0].port = 19001;
		ne[1].port = 19002;
		km_wr_init(&want);
		km_share_fetch_response_encode(&want, v, &m);
		assert_same_bytes(&got, &want);
		km_wr_free(&got);
		km_wr_init(&got);
		assert_int_equal(km_rewrite_share_fetch(in.buf, in.len - 1, v, &ctx, &got), KM_ERR_DECODE);
		km_wr_free(&in);
		km_wr_free(&got);
		km_wr_free(&want);
	}
}

static void test_share_acknowledge(void **state)
{
	(void)state;
	for (int16_t v = KM_SHARE_ACKNOWLEDGE_RESPONSE_MIN_VERSION; v <= KM_SHARE_ACKNOWLEDGE_RESPONSE_MAX_VERSION; v++) {
		km_share_acknowledge_response m;
		km_share_acknowledge_response_share_acknowledge_topic_response t;
		km_share_acknowledge_response_partition_data p;
		km_share_acknowledge_response_node_endpoint ne;
		km_wr in, got, want;
		km_rewrite_ctx ctx = ctx_make();

		km_share_acknowledge_response_init(&m);
		km_share_acknowledge_response_share_acknowledge_topic_response_init(&t);
		km_share_acknowledge_response_partition_data_init(&p);
		km_share_acknowledge_response_node_endpoint_init(&ne);
		p.partition_index = 1;
		p.error_code = 6;
		p.current_leader.leader_id = 3;
		t.partitions.count = 1;
		t.partitions.items = &p;
		m.responses.count = 1;
		m.responses.items = &t;
		ne.node_id = 3;
		ne.host = km_str_c("10.1.2.3");
		ne.port = 22407;
		m.node_endpoints.count = 1;
		m.node_endpoints.items = &ne;
		km_wr_init(&in);
		km_share_acknowledge_response_encode(&in, v, &m);
		km_wr_init(&got);
		assert_int_equal(km_rewrite_share_acknowledge(in.buf, in.len, v, &ctx, &got), KM_OK);
		assert_no_upstream(&got);
		ne.host = km_str_c("proxy.local");
		ne.port = 19003;
		km_wr_init(&want);
		km_share_acknowledge_response_encode(&want, v, &m);
		assert_same_bytes(&got, &want);
		km_wr_free(&in);
		km_wr_free(&got);
		km_wr_free(&want);
	}
}

static void test_needs_rewrite(void **state)
{
	km_proxy_apis *t = km_proxy_apis_new();
	(void)state;
	/* Every response that can carry a broker address is rewritten, for every version. */
	for (int16_t v = KM_DESCRIBE_CONFIGS_RESPONSE_MIN_VERSION; v <= KM_DESCRIBE_CONFIGS_RESPONSE_MAX_VERSION; v++)
		assert_int_equal(km_proxy_api_resp(km_proxy_apis_find(t, KM_API_DESCRIBE_CONFIGS), v), KM_RESP_WHOLE);
	assert_int_equal(km_proxy_api_resp(km_proxy_apis_find(t, KM_API_DESCRIBE_QUORUM), 2), KM_RESP_WHOLE);
	assert_int_equal(km_proxy_api_resp(km_proxy_apis_find(t, KM_API_SHARE_FETCH), 1), KM_RESP_WHOLE);
	assert_int_equal(km_proxy_api_resp(km_proxy_apis_find(t, KM_API_SHARE_ACKNOWLEDGE), 1), KM_RESP_WHOLE);
	assert_int_equal(km_proxy_api_resp(km_proxy_apis_find(t, KM_API_DESCRIBE_LOG_DIRS), 4), KM_RESP_FORWARD);
	km_proxy_apis_free(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_value_has_endpoint),
		cmocka_unit_test(test_describe_configs_all_versions),
		cmocka_unit_test(test_describe_configs_advertised_forms),
		cmocka_unit_test(test_describe_configs_malformed),
		cmocka_unit_test(test_describe_quorum_all_versions),
		cmocka_unit_test(test_share_fetch),
		cmocka_unit_test(test_share_acknowledge),
		cmocka_unit_test(test_needs_rewrite),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
