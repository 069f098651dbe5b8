/* The state store against a real broker (KM_TEST_BOOTSTRAP, KM_TEST_TOPIC with 3 partitions, KM_TEST_STATE_TOPIC, KM_TEST_KEY_FILE, KM_TEST_PASSWORD): persist, restart, transitions, offset map runs. Skips without them. */
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
#include "kmirror/mirror.h"
#include "kmirror/state.h"

static const char *bootstrap, *topic, *state_topic, *key_file, *password;
static char runs_state_topic[300]; /* test_runs_live's own state topic: <state topic>-runs */
static struct event_base *base;

typedef struct probe {
	bool ready;
	int partitions_changed;
	km_mp_state last_to;
	int joined; /* partitions that came in from UNKNOWN to PREPARING (a start, a growth) */
	int joined_max; /* the highest such partition */
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
	p->partitions_changed++;
	p->last_to = to;
	if (from == KM_MP_UNKNOWN && to == KM_MP_PREPARING) {
		p->joined++;
		if (partition > p->joined_max)
			p->joined_max = partition;
	}
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

static km_state *open_store_on(const char *stopic, probe *p, bool with_key, double *load_s)
{
	km_config cfg;
	km_state_opts o;
	km_state *st;
	char err[256];
	double t0 = now_s();

	km_config_init(&cfg);
	assert_int_equal(km_config_set(&cfg, "upstream", bootstrap, err, sizeof(err)), KM_OK);
	assert_int_equal(km_config_set(&cfg, "mirror_state_topic", stopic, err, sizeof(err)), KM_OK);
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

static km_state *open_store(probe *p, bool with_key, double *load_s)
{
	return open_store_on(state_topic, p, with_key, load_s);
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

/* The mirror m1's configuration, its password a secret. */
static void mirror_kv(km_state_kv kv[4])
{
	kv[0] = (km_state_kv){"bootstrap.servers", "source-a:9092,source-b:9092"};
	kv[1] = (km_state_kv){"security.protocol", "SASL_PLAINTEXT"};
	kv[2] = (km_state_kv){"sasl.username", "mirror-user"};
	kv[3] = (km_state_kv){"sasl.password", password};
}

/* A store without a key refuses secrets, naming the option to set. */
static void live_secret_refused(probe *p)
{
	outcome r;
	km_state_kv kv[4];
	km_state *st = open_store(p, false, NULL);

	mirror_kv(kv);
	memset(&r, 0, sizeof(r));
	km_state_create_mirror(st, "m1", kv, 4, false, on_done, &r);
	wait_for(&r.done, 30);
	assert_int_equal(r.code, KM_MIRROR_SECRET_KEY_MISSING);
	assert_non_null(strstr(r.message, "mirror_secret_key_file"));
	assert_null(strstr(r.message, password));
	km_state_free(st);
}

/* Create (validate-only first, then for real, then again: refused) and start; the topic's id. */
static km_uuid live_create_start(probe *p)
{
	outcome r;
	double load1, t0;
	const char *both[2] = {topic, "kmirror-no-such-topic"};
	km_state *st = open_store(p, true, &load1);
	km_state_kv kv[4];
	const km_state_topic *t;
	km_uuid id;

	mirror_kv(kv);
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
	assert_int_equal(p->partitions_changed, 3);
	assert_int_equal(p->last_to, KM_MP_PREPARING);
	partition_states(st, KM_MP_PREPARING, 3);
	t = km_state_topic_find(st, topic, strlen(topic));
	id = *km_state_topic_id(t);
	assert_ptr_equal(km_state_topic_find_id(st, &id), t);
	assert_true(km_state_topic_read_only(t, 0));
	km_state_free(st);
	return id;
}

/* Refusals, each with its code and a message naming the topic and the state. */
static void live_refusals(km_state *st)
{
	outcome r;
	const char *one[1] = {topic};

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
}

/* Stop: STOPPING; the data plane's STOPPED; then the mirror can go. */
static void live_stop(km_state *st, probe *p)
{
	outcome r;
	const char *one[1] = {topic};
	const km_state_topic *t;

	p->partitions_changed = 0;
	topics_op(st, KM_TOPIC_STOP, one, 1, &r);
	assert_int_equal(r.tcode[0], KM_OK);
	assert_int_equal(p->partitions_changed, 3);
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
}

/* STOPPED survives a restart, still in the mirror; then delete, which survives a restart too. */
static void live_delete(probe *p)
{
	outcome r;
	km_state *st = open_store(p, true, NULL);

	partition_states(st, KM_MP_STOPPED, 3);
	memset(&r, 0, sizeof(r));
	km_state_delete_mirror(st, "m1", on_done, &r);
	wait_for(&r.done, 30);
	assert_int_equal(r.code, KM_OK);
	assert_int_equal(km_state_mirror_count(st), 0);
	assert_null(km_state_topic_find(st, topic, strlen(topic)));
	km_state_free(st);
	st = open_store(p, true, NULL);
	assert_int_equal(km_state_mirror_count(st), 0);
	assert_null(km_state_topic_find(st, topic, strlen(topic)));
	km_state_free(st);
}

static void test_state_live(void **state)
{
	probe p;
	km_state *st;
	const km_state_topic *t;
	km_uuid id;
	double load2;
	(void)state;
	if (!bootstrap) {
		skip();
		return;
	}
	km_log_set_level(KM_LOG_INFO);
	live_secret_refused(&p);
	id = live_create_start(&p);

	/* a new store on the same cluster reads the same state back */
	st = open_store(&p, true, &load2);
	printf("# load (reread): %.0f ms\n", load2 * 1000);
	check_mirror(st, 1);
	partition_states(st, KM_MP_PREPARING, 3);
	t = km_state_topic_find(st, topic, strlen(topic));
	assert_memory_equal(km_state_topic_id(t), &id, sizeof(id));
	assert_int_equal(km_state_topic_state(t), KM_MP_PREPARING);
	live_refusals(st);
	live_stop(st, &p);
	km_state_free(st);
	live_delete(&p);
	printf("# done\n");
}

/* Write runs (n of them) of mirror m2 and wait for the answer; the code. */
static km_err runs_write(km_state *st, const km_state_run *runs, size_t n, char *msg, size_t msglen)
{
	outcome r = {0};
	km_state_runs_write(st, "m2", runs, n, on_done, &r);
	wait_for(&r.done, 90);
	if (msg)
		snprintf(msg, msglen, "%s", r.message);
	return r.code;
}

static const km_offmap *map_of(km_state *st, int32_t partition)
{
	const km_state_topic *t = km_state_topic_find(st, topic, strlen(topic));
	assert_non_null(t);
	return km_state_topic_offmap(t, partition);
}

/* The map of partition is exactly want (n runs). */
static void map_is(km_state *st, int32_t partition, const km_offrun *want, size_t n)
{
	const km_offmap *m = map_of(st, partition);
	if (n == 0) {
		assert_true(!m || m->n == 0);
		return;
	}
	assert_non_null(m);
	if (m->n != n)
		fail_msg("partition %d: %zu runs, want %zu", (int)partition, m->n, n);
	for (size_t i = 0; i < n; i++)
		if (m->runs[i].logical != want[i].logical || m->runs[i].physical != want[i].physical ||
		    m->runs[i].prev_logical_end != want[i].prev_logical_end || m->runs[i].flags != want[i].flags)
			fail_msg("partition %d run %zu: (%lld, %lld, %lld), want (%lld, %lld, %lld)", (int)partition, i,
				 (long long)m->runs[i].logical, (long long)m->runs[i].physical,
				 (long long)m->runs[i].prev_logical_end, (long long)want[i].logical,
				 (long long)want[i].physical, (long long)want[i].prev_logical_end);
}

/*
 * Offset map runs in __mirror_state (its own state topic, so the other test's records do not
 * mix): runs of two partitions and a tombstone survive a restart exactly; 10,000 runs of one
 * partition load back (timed); a runs write of a topic the mirror does not hold is refused; a
 * DeleteMirror leaves no run record (a mirror created again under the name with the topic
 * started again gets no map back; test_state_live.py reads the topic raw too).
 */
enum { MANY = 10000 };

static const km_offrun runs_p0[2] = {{0, 0, -1}, {200, 80, 130}}, runs_p1[2] = {{5, 0, -1}, {9, 7, 8}};

/* Create m2 (without secrets) and start topic in it. */
static void runs_mirror(km_state *st)
{
	outcome r;
	const char *one[1] = {topic};
	km_state_kv kv[1] = {{"bootstrap.servers", "source-a:9092"}};

	memset(&r, 0, sizeof(r));
	km_state_create_mirror(st, "m2", kv, 1, false, on_done, &r);
	wait_for(&r.done, 90);
	if (r.code != KM_OK)
		fail_msg("create: %s %s", km_err_name(r.code), r.message);
	memset(&r, 0, sizeof(r));
	km_state_topics(st, KM_TOPIC_START, "m2", one, 1, on_done, &r);
	wait_for(&r.done, 90);
	assert_int_equal(r.tcode[0], KM_OK);
}

/* Refused before anything is written, two partitions in one write, a tombstone, the in-memory tail. */
static void runs_write_some(km_state *st)
{
	km_state_run runs[5] = {
		{.topic = topic, .partition = 0, .logical = 0, .physical = 0, .prev_logical_end = -1},
		{.topic = topic, .partition = 0, .logical = 100, .physical = 50, .prev_logical_end = 40},
		{.topic = topic, .partition = 0, .logical = 200, .physical = 80, .prev_logical_end = 130},
		{.topic = topic, .partition = 1, .logical = 5, .physical = 0, .prev_logical_end = -1},
		{.topic = topic, .partition = 1, .logical = 9, .physical = 7, .prev_logical_end = 8},
	};
	km_state_run bad[2] = {runs[0], runs[0]}, tomb = runs[1];
	km_offmap *m;
	km_state_partition_info info;
	char msg[512];
	double t0;

	/* refused before anything is written: a topic of no mirror, a bad run */
	bad[1].topic = "kmirror-no-such-topic";
	assert_int_equal(runs_write(st, bad, 2, msg, sizeof(msg)), KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION);
	printf("# runs refused: %s\n", msg);
	bad[1] = runs[1];
	bad[1].prev_logical_end = 101;
	assert_int_equal(runs_write(st, bad, 2, msg, sizeof(msg)), KM_KAFKA_INVALID_REQUEST);
	printf("# runs refused: %s\n", msg);
	map_is(st, 0, NULL, 0);
	/* two partitions in one write, then a tombstone of the middle run of partition 0 */
	t0 = now_s();
	assert_int_equal(runs_write(st, runs, 5, NULL, 0), KM_OK);
	printf("# runs write (5 runs, 2 partitions): %.0f ms\n", (now_s() - t0) * 1000);
	assert_int_equal(map_of(st, 0)->n, 3);
	tomb.physical = -1;
	assert_int_equal(runs_write(st, &tomb, 1, NULL, 0), KM_OK);
	map_is(st, 0, runs_p0, 2);
	map_is(st, 1, runs_p1, 2);
	/* the tail is the mirror module's, in memory: describe shows it while it is set */
	m = km_state_offmap_mut(st, topic, 0);
	assert_ptr_equal(m, map_of(st, 0));
	m->tail_physical = 90;
	m->tail_logical = 210;
	km_state_partition_progress(st, topic, 0, 250, 3);
	km_state_topic_partition(km_state_topic_find(st, topic, strlen(topic)), 0, &info);
	assert_int_equal(info.last_mirrored_offset, 210);
	assert_int_equal(info.skipped_records, 3);
	assert_int_equal(km_offmap_to_logical(m, 85), 205);
	assert_int_equal(km_offmap_next_to_logical(m, 90), 210);
}

/* A compacted source's map: 10,000 runs of partition 2, one write, read back by a new store (returned). */
static km_state *runs_write_many(km_state *st, probe *p)
{
	km_offrun *many = calloc(MANY, sizeof(*many));
	km_state_run *mruns = calloc(MANY, sizeof(*mruns));
	char msg[512];
	double t0, load_s;

	assert_non_null(many);
	assert_non_null(mruns);
	for (int64_t i = 0; i < MANY; i++) {
		many[i] = (km_offrun){.logical = 10 * i, .physical = 7 * i, .prev_logical_end = i ? 10 * (i - 1) + 5 : -1};
		mruns[i] = (km_state_run){.topic = topic, .partition = 2, .logical = many[i].logical,
					  .physical = many[i].physical, .prev_logical_end = many[i].prev_logical_end};
	}
	t0 = now_s();
	assert_int_equal(runs_write(st, mruns, MANY, msg, sizeof(msg)), KM_OK);
	printf("# runs write (%d runs, one partition): %.0f ms\n", MANY, (now_s() - t0) * 1000);
	map_is(st, 2, many, MANY);
	km_state_free(st);
	st = open_store_on(runs_state_topic, p, false, &load_s);
	printf("# load with %d + 4 runs: %.0f ms\n", MANY, load_s * 1000);
	map_is(st, 2, many, MANY);
	map_is(st, 0, runs_p0, 2);
	map_is(st, 1, runs_p1, 2);
	assert_int_equal(km_offmap_to_physical(map_of(st, 2), 10 * 5000 + 3), 7 * 5000 + 3);
	assert_int_equal(km_offmap_to_physical(map_of(st, 2), 10 * 5000 + 7), 7 * 5001);
	free(many);
	free(mruns);
	return st;
}

/* Stop, settle, delete: the runs' tombstones go first, every one of them. */
static void runs_delete(km_state *st)
{
	outcome r;
	const char *one[1] = {topic};
	int32_t parts[3] = {0, 1, 2};
	double t0;

	memset(&r, 0, sizeof(r));
	km_state_topics(st, KM_TOPIC_STOP, "m2", one, 1, on_done, &r);
	wait_for(&r.done, 90);
	assert_int_equal(r.tcode[0], KM_OK);
	memset(&r, 0, sizeof(r));
	km_state_partitions_set(st, "m2", topic, parts, 3, KM_MP_STOPPED, NULL, on_done, &r);
	wait_for(&r.done, 90);
	assert_int_equal(r.code, KM_OK);
	t0 = now_s();
	memset(&r, 0, sizeof(r));
	km_state_delete_mirror(st, "m2", on_done, &r);
	wait_for(&r.done, 120);
	if (r.code != KM_OK)
		fail_msg("delete: %s %s", km_err_name(r.code), r.message);
	printf("# delete with %d runs: %.0f ms\n", MANY + 4, (now_s() - t0) * 1000);
	assert_int_equal(km_state_mirror_count(st), 0);
}

static void test_runs_live(void **state)
{
	probe p;
	km_state *st;
	(void)state;
	if (!bootstrap) {
		skip();
		return;
	}
	snprintf(runs_state_topic, sizeof(runs_state_topic), "%s-runs", state_topic);

	st = open_store_on(runs_state_topic, &p, false, NULL);
	runs_mirror(st);
	runs_write_some(st);
	km_state_free(st);

	st = open_store_on(runs_state_topic, &p, false, NULL);
	map_is(st, 0, runs_p0, 2);
	map_is(st, 1, runs_p1, 2);
	map_is(st, 2, NULL, 0);
	assert_int_equal(map_of(st, 0)->tail_logical, -1); /* never persisted */
	st = runs_write_many(st, &p);
	runs_delete(st);
	/* the same name and topic again: no run comes back */
	runs_mirror(st);
	km_state_free(st);
	st = open_store_on(runs_state_topic, &p, false, NULL);
	for (int32_t i = 0; i < 3; i++)
		map_is(st, i, NULL, 0);
	km_state_free(st);
	printf("# runs done\n");
}

static void grow(km_state *st, int32_t n, outcome *r)
{
	memset(r, 0, sizeof(*r));
	km_state_topic_add_partitions(st, "m3", topic, n, on_done, r);
	wait_for(&r->done, 90);
}

/* km_state_topic_add_partitions: the source grew from 3 to 5 partitions (the destination topic has 3; the store does not look). */
static void test_grow_live(void **state)
{
	char stopic[300];
	probe p;
	outcome r;
	km_state *st;
	const char *one[1] = {topic};
	km_state_kv kv[1] = {{"bootstrap.servers", "source-a:9092"}};
	const int32_t all[5] = {0, 1, 2, 3, 4};
	(void)state;
	if (!bootstrap) {
		skip();
		return;
	}
	snprintf(stopic, sizeof(stopic), "%s-grow", state_topic);
	st = open_store_on(stopic, &p, false, NULL);
	/* Not a mirror, not a topic of it: refused. */
	grow(st, 5, &r);
	assert_int_equal(r.code, KM_MIRROR_UNKNOWN_CLUSTER_MIRROR);
	memset(&r, 0, sizeof(r));
	km_state_create_mirror(st, "m3", kv, 1, false, on_done, &r);
	wait_for(&r.done, 90);
	assert_int_equal(r.code, KM_OK);
	grow(st, 5, &r);
	assert_int_equal(r.code, KM_MIRROR_TOPIC_NOT_IN_CLUSTER_MIRROR);
	memset(&r, 0, sizeof(r));
	km_state_topics(st, KM_TOPIC_START, "m3", one, 1, on_done, &r);
	wait_for(&r.done, 90);
	assert_int_equal(r.tcode[0], KM_OK);
	assert_int_equal(p.joined, 3);
	assert_int_equal(km_state_topic_partition_count(km_state_topic_find(st, topic, strlen(topic))), 3);

	/*
	 * Grown through the mirror module, as the pipeline will: CreatePartitions on the destination
	 * (3 -> 5; the Python side checks the topic), then partitions 3 and 4 join in PREPARING, each
	 * told to the listener once. A second call while the first runs does nothing.
	 */
	p.joined = 0;
	p.joined_max = -1;
	{
		km_config cfg;
		km_mirror_opts mo;
		km_mirror *mi;
		char err[256];
		km_config_init(&cfg);
		assert_int_equal(km_config_set(&cfg, "upstream", bootstrap, err, sizeof(err)), KM_OK);
		memset(&mo, 0, sizeof(mo));
		mo.base = base;
		mo.cfg = &cfg;
		mo.instance = "test";
		mi = km_mirror_new(&mo);
		assert_non_null(mi);
		km_mirror_attach(mi, st);
		km_mirror_grow(mi, "m3", topic, 5);
		km_mirror_grow(mi, "m3", topic, 5);
		km_mirror_grow(mi, "m3", "not-a-mirror-topic", 5);
		for (double end = now_s() + 60; p.joined < 2 && now_s() < end;) {
			struct timeval tv = {0, 20000};
			event_base_loopexit(base, &tv);
			event_base_dispatch(base);
		}
		km_mirror_attach(mi, NULL); /* the store outlives the module here (kmirrord frees the store first) */
		km_mirror_free(mi);
		km_config_free(&cfg);
	}
	assert_int_equal(p.joined, 2);
	assert_int_equal(p.joined_max, 4);
	partition_states(st, KM_MP_PREPARING, 5);
	/* Idempotent: the same count again, or a smaller one, writes nothing and tells nobody. */
	p.partitions_changed = 0;
	grow(st, 5, &r);
	assert_int_equal(r.code, KM_OK);
	grow(st, 4, &r);
	assert_int_equal(r.code, KM_OK);
	assert_int_equal(p.partitions_changed, 0);
	/* Out of range. */
	grow(st, 0, &r);
	assert_int_equal(r.code, KM_KAFKA_INVALID_REQUEST);
	grow(st, 100001, &r);
	assert_int_equal(r.code, KM_KAFKA_INVALID_REQUEST);

	/* A paused topic does not grow. */
	memset(&r, 0, sizeof(r));
	km_state_partitions_set(st, "m3", topic, all, 5, KM_MP_MIRRORING, NULL, on_done, &r);
	wait_for(&r.done, 90);
	assert_int_equal(r.code, KM_OK);
	memset(&r, 0, sizeof(r));
	km_state_topics(st, KM_TOPIC_PAUSE, "m3", one, 1, on_done, &r);
	wait_for(&r.done, 90);
	assert_int_equal(r.tcode[0], KM_OK);
	p.partitions_changed = 0;
	grow(st, 6, &r);
	assert_int_equal(r.code, KM_MIRROR_INVALID_CLUSTER_MIRROR_STATES);
	assert_non_null(strstr(r.message, "PAUSING"));
	assert_int_equal(p.partitions_changed, 0);
	km_state_free(st);

	/* Persisted: read back, the topic has 5 partitions. */
	st = open_store_on(stopic, &p, false, NULL);
	partition_states(st, KM_MP_PAUSING, 5);
	km_state_free(st);
	printf("# grow done\n");
}

int main(void)
{
	const struct CMUnitTest tests[] = {cmocka_unit_test(test_state_live), cmocka_unit_test(test_runs_live),
					   cmocka_unit_test(test_grow_live)};
	bootstrap = getenv("KM_TEST_BOOTSTRAP");
	topic = getenv("KM_TEST_TOPIC");
	state_topic = getenv("KM_TEST_STATE_TOPIC");
	key_file = getenv("KM_TEST_KEY_FILE");
	password = getenv("KM_TEST_PASSWORD");
	if (!topic || !state_topic || !key_file || !password)
		bootstrap = NULL;
	base = event_base_new();
	int rc = cmocka_run_group_tests(tests, NULL, NULL);
	/* A freed store's clients are freed at the end of a loop iteration: run one. */
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_free(base);
	return rc;
}
