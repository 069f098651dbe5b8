/* The state store against a real broker (KM_TEST_BOOTSTRAP, KM_TEST_TOPIC with 3 partitions, KM_TEST_STATE_TOPIC, KM_TEST_KEY_FILE, KM_TEST_PASSWORD): persist, restart, transitions. Skips without them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "kmirror/log.h"
#include "kmirror/state.h"

static const char *bootstrap, *topic, *state_topic, *key_file, *password;
static struct event_base *base;

typedef struct probe {
	bool ready;
	int partitions_changed;
	km_mp_state last_to;
} probe;

typedef struct outcome {
	bool done;
	km_err code;
	char message[512];
	km_err tcode[4];
	char tmsg[4][512];
	size_t ntopics;
} outcome;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void wait_for(const bool *flag, double seconds)
{
	double end = now_s() + seconds;
	while (!*flag && now_s() < end) {
		struct timeval tv = {0, 20000};
		event_base_loopexit(base, &tv);
		event_base_dispatch(base);
	}
	assert_true(*flag);
}

static void on_ready(void *arg)
{
	((probe *)arg)->ready = true;
}

static void on_partition(void *arg, const char *mirror, const char *t, int32_t partition, km_mp_state from,
			 km_mp_state to)
{
	probe *p = arg;
	(void)mirror;
	(void)t;
	(void)partition;
	(void)from;
	p->partitions_changed++;
	p->last_to = to;
}

static void on_done(void *arg, const km_state_result *res)
{
	outcome *o = arg;
	o->code = res->code;
	snprintf(o->message, sizeof(o->message), "%s", res->message ? res->message : "");
	o->ntopics = res->ntopics;
	for (size_t i = 0; i < res->ntopics && i < 4; i++) {
		o->tcode[i] = res->topics[i].code;
		snprintf(o->tmsg[i], sizeof(o->tmsg[i]), "%s", res->topics[i].message ? res->topics[i].message : "");
	}
	o->done = true;
}

static km_state *open_store(probe *p, bool with_key, double *load_s)
{
	km_config cfg;
	km_state_opts o;
	km_state *st;
	char err[256];
	double t0 = now_s();

	km_config_init(&cfg);
	assert_int_equal(km_config_set(&cfg, "upstream", bootstrap, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "mirror_state_topic", state_topic, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "mirror_state_partitions", "4", err, sizeof(err)), KM_OK);
	if (with_key)
		assert_int_equal(km_config_set(&cfg, "mirror_secret_key_file", key_file, err, sizeof(err)), KM_OK);
	memset(&o, 0, sizeof(o));
	memset(p, 0, sizeof(*p));
	o.base = base;
	o.cfg = &cfg;
	o.on_ready = on_ready;
	o.on_partition = on_partition;
	o.arg = p;
	st = km_state_new(&o, err, sizeof(err));
	km_config_free(&cfg);
	assert_non_null(st);
	assert_false(km_state_ready(st));
	/* Until loaded, mutations are refused with COORDINATOR_LOAD_IN_PROGRESS */
	{
		outcome r = {0};
		km_state_delete_mirror(st, "m1", on_done, &r);
		wait_for(&r.done, 5);
		if (!p->ready) {
			assert_int_equal(r.code, 14);
			assert_non_null(strstr(r.message, "mirror state is loading from"));
		}
	}
	wait_for(&p->ready, 60);
	assert_true(km_state_ready(st));
	if (load_s)
		*load_s = now_s() - t0;
	return st;
}

static void topics_op(km_state *st, km_topic_op op, const char *const *names, size_t n, outcome *r)
{
	memset(r, 0, sizeof(*r));
	km_state_topics(st, op, "m1", names, n, on_done, r);
	wait_for(&r->done, 90);
}

static void partition_states(km_state *st, km_mp_state want, size_t nwant)
{
	const km_state_topic *t = km_state_topic_find(st, topic, strlen(topic));
	assert_non_null(t);
	assert_int_equal(km_state_topic_partition_count(t), nwant);
	for (size_t i = 0; i < nwant; i++) {
		km_state_partition_info info;
		km_state_topic_partition(t, i, &info);
		assert_int_equal(info.partition, (int32_t)i);
		if (info.state != want)
			fail_msg("partition %zu is %s, not %s", i, km_mp_state_name(info.state), km_mp_state_name(want));
	}
	printf("# %s: %zu partitions %s\n", topic, nwant, km_mp_state_name(want));
}

static void check_mirror(km_state *st, size_t ntopics)
{
	const km_state_mirror *m = km_state_mirror_find(st, "m1");
	const char *name, *value;
	bool secret, saw_secret = false;
	char buf[256];

	assert_non_null(m);
	assert_int_equal(km_state_mirror_count(st), 1);
	assert_string_equal(km_state_mirror_source(m), "source-a:9092,source-b:9092");
	for (size_t i = 0; i < km_state_mirror_config_count(m); i++) {
		km_state_mirror_config_at(m, i, &name, &value, &secret);
		if (!strcmp(name, "sasl.password")) {
			assert_true(secret);
			assert_null(value);
			saw_secret = true;
		}
	}
	assert_true(saw_secret);
	assert_int_equal(km_state_mirror_secret(st, m, "sasl.password", buf, sizeof(buf)), KM_OK);
	assert_string_equal(buf, password);
	assert_int_equal(km_state_mirror_secret(st, m, "sasl.username", buf, sizeof(buf)), KM_ERR_INVAL);
	assert_int_equal(km_state_mirror_topic_count(m), ntopics);
}

static void test_state_live(void **state)
{
	probe p;
	outcome r;
	km_state *st;
	const km_state_topic *t;
	km_uuid id;
	double load1, load2, t0;
	const char *both[2] = {topic, "kmirror-no-such-topic"};
	const char *one[1] = {topic};
	km_state_kv kv[4] = {{"bootstrap.servers", "source-a:9092,source-b:9092"},
			     {"security.protocol", "SASL_PLAINTEXT"},
			     {"sasl.username", "mirror-user"},
			     {"sasl.password", password}};
	(void)state;
	if (!bootstrap) {
		skip();
		return;
	}
	km_log_set_level(KM_LOG_INFO);

	/* a store without a key refuses secrets, naming the option to set */
	st = open_store(&p, false, NULL);
	memset(&r, 0, sizeof(r));
	km_state_create_mirror(st, "m1", kv, 4, false, on_done, &r);
	wait_for(&r.done, 30);
	assert_int_equal(r.code, KM_MIRROR_SECRET_KEY_MISSING);
	assert_non_null(strstr(r.message, "mirror_secret_key_file"));
	assert_null(strstr(r.message, password));
	km_state_free(st);

	st = open_store(&p, true, &load1);
	printf("# load (empty or absent state topic): %.0f ms\n", load1 * 1000);
	/* validate-only persists nothing */
	memset(&r, 0, sizeof(r));
	km_state_create_mirror(st, "m1", kv, 4, true, on_done, &r);
	wait_for(&r.done, 30);
	assert_int_equal(r.code, KM_OK);
	assert_null(km_state_mirror_find(st, "m1"));

	t0 = now_s();
	memset(&r, 0, sizeof(r));
	km_state_create_mirror(st, "m1", kv, 4, false, on_done, &r);
	wait_for(&r.done, 90);
	if (r.code != KM_OK)
		fail_msg("create: %s %s", km_err_name(r.code), r.message);
	printf("# first create (topic creation included): %.0f ms\n", (now_s() - t0) * 1000);
	check_mirror(st, 0);

	memset(&r, 0, sizeof(r));
	km_state_create_mirror(st, "m1", kv, 4, false, on_done, &r);
	wait_for(&r.done, 30);
	assert_int_equal(r.code, KM_MIRROR_CLUSTER_MIRROR_ALREADY_EXISTS);

	t0 = now_s();
	topics_op(st, KM_TOPIC_START, both, 2, &r);
	printf("# start (Metadata + Produce): %.0f ms\n", (now_s() - t0) * 1000);
	assert_int_equal(r.code, KM_OK);
	assert_int_equal(r.ntopics, 2);
	if (r.tcode[0] != KM_OK)
		fail_msg("start: %s %s", km_err_name(r.tcode[0]), r.tmsg[0]);
	assert_int_equal(r.tcode[1], 3);
	assert_non_null(strstr(r.tmsg[1], "does not exist on the destination"));
	assert_int_equal(p.partitions_changed, 3);
	assert_int_equal(p.last_to, KM_MP_PREPARING);
	partition_states(st, KM_MP_PREPARING, 3);
	t = km_state_topic_find(st, topic, strlen(topic));
	id = *km_state_topic_id(t);
	assert_ptr_equal(km_state_topic_find_id(st, &id), t);
	assert_true(km_state_topic_read_only(t, 0));
	km_state_free(st);

	/* a new store on the same cluster reads the same state back */
	st = open_store(&p, true, &load2);
	printf("# load (reread): %.0f ms\n", load2 * 1000);
	check_mirror(st, 1);
	partition_states(st, KM_MP_PREPARING, 3);
	t = km_state_topic_find(st, topic, strlen(topic));
	assert_memory_equal(km_state_topic_id(t), &id, sizeof(id));
	assert_int_equal(km_state_topic_state(t), KM_MP_PREPARING);

	/* refusals, each with its code and a message naming the topic and the state */
	topics_op(st, KM_TOPIC_PAUSE, one, 1, &r);
	assert_int_equal(r.tcode[0], KM_MIRROR_INVALID_CLUSTER_MIRROR_STATES);
	assert_non_null(strstr(r.tmsg[0], topic));
	assert_non_null(strstr(r.tmsg[0], "PREPARING"));
	printf("# pause refused: %s\n", r.tmsg[0]);
	topics_op(st, KM_TOPIC_RESUME, one, 1, &r);
	assert_int_equal(r.tcode[0], KM_MIRROR_MIRROR_TOPIC_NOT_PAUSED);
	topics_op(st, KM_TOPIC_START, one, 1, &r);
	assert_int_equal(r.tcode[0], KM_MIRROR_TOPIC_ALREADY_IN_CLUSTER_MIRROR);
	memset(&r, 0, sizeof(r));
	km_state_topics(st, KM_TOPIC_STOP, "nope", one, 1, on_done, &r);
	wait_for(&r.done, 30);
	assert_int_equal(r.code, KM_MIRROR_UNKNOWN_CLUSTER_MIRROR);
	memset(&r, 0, sizeof(r));
	km_state_delete_mirror(st, "m1", on_done, &r);
	wait_for(&r.done, 30);
	assert_int_equal(r.code, KM_MIRROR_CLUSTER_MIRROR_IN_USE);
	printf("# delete refused: %s\n", r.message);

	/* stop: STOPPING; the data plane's STOPPED; then the mirror can go */
	p.partitions_changed = 0;
	topics_op(st, KM_TOPIC_STOP, one, 1, &r);
	assert_int_equal(r.tcode[0], KM_OK);
	assert_int_equal(p.partitions_changed, 3);
	partition_states(st, KM_MP_STOPPING, 3);
	memset(&r, 0, sizeof(r));
	km_state_delete_mirror(st, "m1", on_done, &r);
	wait_for(&r.done, 30);
	assert_int_equal(r.code, KM_MIRROR_CLUSTER_MIRROR_IN_USE);
	/*
	 * The driver's PREPARING -> MIRRORING queued behind this stop (it looked while the topic was
	 * still PREPARING) is refused: the stop is not undone, the topic stays STOPPING.
	 */
	memset(&r, 0, sizeof(r));
	km_state_partition_set(st, "m1", topic, 0, KM_MP_MIRRORING, NULL, on_done, &r);
	wait_for(&r.done, 30);
	assert_int_equal(r.code, KM_MIRROR_INVALID_CLUSTER_MIRROR_STATES);
	assert_non_null(strstr(r.message, "STOPPING"));
	printf("# late settle refused: %s\n", r.message);
	partition_states(st, KM_MP_STOPPING, 3);
	for (int32_t i = 0; i < 3; i++) {
		memset(&r, 0, sizeof(r));
		km_state_partition_set(st, "m1", topic, i, KM_MP_STOPPED, NULL, on_done, &r);
		wait_for(&r.done, 30);
		assert_int_equal(r.code, KM_OK);
	}
	partition_states(st, KM_MP_STOPPED, 3);
	t = km_state_topic_find(st, topic, strlen(topic));
	assert_false(km_state_topic_read_only(t, 1));
	km_state_free(st);

	/* STOPPED survives a restart, still in the mirror; then delete */
	st = open_store(&p, true, NULL);
	partition_states(st, KM_MP_STOPPED, 3);
	memset(&r, 0, sizeof(r));
	km_state_delete_mirror(st, "m1", on_done, &r);
	wait_for(&r.done, 30);
	assert_int_equal(r.code, KM_OK);
	assert_int_equal(km_state_mirror_count(st), 0);
	assert_null(km_state_topic_find(st, topic, strlen(topic)));
	km_state_free(st);
	st = open_store(&p, true, NULL);
	assert_int_equal(km_state_mirror_count(st), 0);
	assert_null(km_state_topic_find(st, topic, strlen(topic)));
	km_state_free(st);
	printf("# done\n");
}

int main(void)
{
	const struct CMUnitTest tests[] = {cmocka_unit_test(test_state_live)};
	bootstrap = getenv("KM_TEST_BOOTSTRAP");
	topic = getenv("KM_TEST_TOPIC");
	state_topic = getenv("KM_TEST_STATE_TOPIC");
	key_file = getenv("KM_TEST_KEY_FILE");
	password = getenv("KM_TEST_PASSWORD");
	if (!topic || !state_topic || !key_file || !password)
		bootstrap = NULL;
	base = event_base_new();
	int rc = cmocka_run_group_tests(tests, NULL, NULL);
	event_base_free(base);
	return rc;
}
