/* Which source topic configs a destination topic created by the mirror gets (km_mirror_config_copied). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kmirror/mirror.h"

/* DescribeConfigs' ConfigSource values. */
enum { UNKNOWN = 0, DYNAMIC_TOPIC = 1, DYNAMIC_BROKER = 2, DYNAMIC_DEFAULT_BROKER = 3, STATIC_BROKER = 4, DEFAULT = 5 };

static bool copied(const char *name, int8_t source, const char *value, const char **out)
{
	const char *v = value;
	bool r = km_mirror_config_copied(name, source, &v);
	if (out)
		*out = v;
	return r;
}

/* Only what the source reports as set on the topic itself. */
static void test_sources(void **state)
{
	(void)state;
	assert_true(copied("retention.ms", DYNAMIC_TOPIC, "3600000", NULL));
	for (int s = 0; s <= 6; s++)
		if (s != DYNAMIC_TOPIC)
			assert_false(copied("retention.ms", (int8_t)s, "3600000", NULL));
	/* A sensitive or null value is never copied. */
	assert_false(copied("retention.ms", DYNAMIC_TOPIC, NULL, NULL));
	assert_false(copied("", DYNAMIC_TOPIC, "1", NULL));
	assert_false(copied(NULL, DYNAMIC_TOPIC, "1", NULL));
}

/* The configs a destination topic takes as the source has them. */
static void test_copied(void **state)
{
	static const char *const keep[] = {"cleanup.policy", "max.message.bytes", "retention.ms", "retention.bytes",
					   "segment.bytes", "segment.ms", "delete.retention.ms", "min.compaction.lag.ms",
					   "max.compaction.lag.ms", "min.cleanable.dirty.ratio", "unclean.leader.election.enable",
					   "message.timestamp.type", "index.interval.bytes", "flush.messages"};
	const char *v;
	(void)state;
	for (size_t i = 0; i < sizeof(keep) / sizeof(*keep); i++) {
		assert_true(copied(keep[i], DYNAMIC_TOPIC, "x", &v));
		assert_string_equal(v, "x");
	}
}

static void test_never_copied(void **state)
{
	static const char *const drop[] = {"leader.replication.throttled.replicas", "follower.replication.throttled.replicas",
					   "message.format.version", "message.downconversion.enable",
					   "message.timestamp.difference.max.ms", "message.timestamp.before.max.ms",
					   "message.timestamp.after.max.ms", "min.insync.replicas", "remote.storage.enable",
					   "local.retention.ms", "local.retention.bytes", "compression.type",
					   "confluent.placement.constraints", "confluent.tier.enable", "mirror.name"};
	(void)state;
	for (size_t i = 0; i < sizeof(drop) / sizeof(*drop); i++)
		if (copied(drop[i], DYNAMIC_TOPIC, "1", NULL))
			fail_msg("%s is copied", drop[i]);
	/* A prefix match only for confluent.*: a key that merely contains it is copied. */
	assert_true(copied("x.confluent.y", DYNAMIC_TOPIC, "1", NULL));
}

/* LogAppendTime becomes CreateTime: the destination keeps the source's timestamps. */
static void test_timestamp_type(void **state)
{
	const char *v;
	(void)state;
	assert_true(copied("message.timestamp.type", DYNAMIC_TOPIC, "LogAppendTime", &v));
	assert_string_equal(v, "CreateTime");
	assert_true(copied("message.timestamp.type", DYNAMIC_TOPIC, "CreateTime", &v));
	assert_string_equal(v, "CreateTime");
}

int main(void)
{
	const struct CMUnitTest tests[] = {cmocka_unit_test(test_sources), cmocka_unit_test(test_copied),
					   cmocka_unit_test(test_never_copied), cmocka_unit_test(test_timestamp_type)};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
