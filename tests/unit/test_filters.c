/* The metadata sync's filters (kmirror/state.h): mirror.groups.include/exclude and mirror.acl.include. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kmirror/state.h"

/* Kafka's wire codes, written out here so that a wrong table in filters.c cannot agree with itself. */
enum { TOPIC = 2, GROUP = 3, CLUSTER = 4, TRANSACTIONAL_ID = 5, DELEGATION_TOKEN = 6, USER = 7 };
enum { ALL = 2, READ = 3, WRITE = 4, CREATE = 5, DESCRIBE = 8, ALTER = 7, CREATE_TOKENS = 13 };
enum { DENY = 2, ALLOW = 3 };

typedef struct binding {
	int8_t type;
	const char *name;
	int8_t op;
	int8_t perm;
	const char *principal;
} binding;

/* The fixed table every scope is checked against; the comment is the binding's index. */
static const binding bindings[] = {
	/* 0 */ {TOPIC, "orders", READ, ALLOW, "User:alice"},
	/* 1 */ {TOPIC, "orders-eu", WRITE, ALLOW, "User:bob"},
	/* 2 */ {TOPIC, "payments", READ, ALLOW, "User:app-1"},
	/* 3 */ {TOPIC, "payments", DESCRIBE, DENY, "User:carol"},
	/* 4 */ {GROUP, "consumer-1", READ, ALLOW, "User:bob"},
	/* 5 */ {GROUP, "consumer-2", READ, DENY, "User:bob"},
	/* 6 */ {GROUP, "consumers", READ, ALLOW, "User:bob"},
	/* 7 */ {CLUSTER, "kafka-cluster", ALTER, ALLOW, "User:alice"},
	/* 8 */ {TRANSACTIONAL_ID, "orders-tx", WRITE, ALLOW, "User:app-2"},
	/* 9 */ {TOPIC, "xorders", READ, ALLOW, "User:xapp-1"},
	/* 10 */ {GROUP, "orders", READ, ALLOW, "User:alice"},
	/* 11 */ {TOPIC, "audit", ALL, ALLOW, "User:carol"},
	/* 12 */ {USER, "User:bob", CREATE_TOKENS, ALLOW, "User:alice"},
	/* 13 */ {DELEGATION_TOKEN, "token-1", DESCRIBE, ALLOW, "User:app-10"},
};
#define NB (sizeof(bindings) / sizeof(bindings[0]))
#define B(i) (UINT32_C(1) << (i))

static uint32_t scope_set(const char *spec)
{
	char err[512] = "";
	km_acl_scope *s = km_acl_scope_parse(spec, err, sizeof(err));
	uint32_t got = 0;

	if (!s)
		fail_msg("'%s' refused: %s", spec, err);
	for (size_t i = 0; i < NB; i++) {
		const binding *b = &bindings[i];
		if (km_acl_scope_match(s, b->type, b->name, b->op, b->perm, b->principal))
			got |= B(i);
	}
	km_acl_scope_free(s);
	return got;
}

static void expect_scope(const char *spec, uint32_t want)
{
	uint32_t got = scope_set(spec);

	if (got != want) {
		for (size_t i = 0; i < NB; i++)
			if ((got ^ want) & B(i))
				fprintf(stderr, "'%s': binding %zu (%s, %s) %s\n", spec, i, bindings[i].name,
					bindings[i].principal,
					got & B(i) ? "matched, should not" : "not matched, should");
		fail_msg("'%s': got set %#x, want %#x", spec, (unsigned)got, (unsigned)want);
	}
}

/* Every example of the proposal's mirror.acl.include list. */
static void test_acl_examples(void **state)
{
	(void)state;
	expect_scope("*", B(NB) - 1);
	expect_scope("TOPIC;orders.*", B(0) | B(1));
	expect_scope("*;*;*;*;User:alice", B(0) | B(7) | B(10) | B(12));
	expect_scope("*;*;*;*;User:app-.*", B(2) | B(8) | B(13));
	expect_scope("TOPIC;*;READ;ALLOW", B(0) | B(2) | B(9));
	expect_scope("GROUP;consumer-.*;READ;ALLOW;User:bob", B(4));
	/* two rules: TOPIC;orders.* and *;*;*;*;User:alice */
	expect_scope("TOPIC;orders.*,*;*;*;*;User:alice", B(0) | B(1) | B(7) | B(10) | B(12));
}

static void test_acl_fields(void **state)
{
	(void)state;
	/* whole-match anchoring of names and principals */
	expect_scope("TOPIC;orders", B(0));
	expect_scope("TOPIC;orders(-eu)?", B(0) | B(1));
	expect_scope("*;orders", B(0) | B(10));
	expect_scope("*;.*orders", B(0) | B(9) | B(10));
	expect_scope("*;*;*;*;User:app-1", B(2));
	expect_scope("*;*;*;*;app-.*", 0);
	/* missing trailing fields are `*` */
	expect_scope("TOPIC;orders.*;*;*;*", B(0) | B(1));
	expect_scope("TOPIC", B(0) | B(1) | B(2) | B(3) | B(9) | B(11));
	/* Kafka's names are case-insensitive; the regexes are not */
	expect_scope("topic;*;read;allow", B(0) | B(2) | B(9));
	expect_scope("Topic;*;Read;Allow", B(0) | B(2) | B(9));
	expect_scope("TOPIC;ORDERS", 0);
	expect_scope("*;*;*;*;user:alice", 0);
	/* ALL names the ALL operation, not any operation */
	expect_scope("*;*;ALL", B(11));
	expect_scope("*;*;*;DENY", B(3) | B(5));
	expect_scope("CLUSTER;kafka-cluster;ALTER", B(7));
	expect_scope("TRANSACTIONAL_ID", B(8));
	expect_scope("USER;User:.*;CREATE_TOKENS", B(12));
	expect_scope("delegation_token;token-[0-9]+", B(13));
	/* spaces around fields and rules */
	expect_scope("  TOPIC ; orders.* ,\t*;*;*;*; User:alice ", B(0) | B(1) | B(7) | B(10) | B(12));
	/* a lone ')' is a literal: "a)|b" is that regex, not "^(a)|b)$" (which would match names starting with a) */
	expect_scope("*;orders)|x", 0);
	expect_scope("*;*;*;*;User:alice)|User:bob", B(1) | B(4) | B(5) | B(6));
	/* every field must match: a rule no binding satisfies selects nothing */
	expect_scope("GROUP;orders;WRITE", 0);
}

/* Each name maps to its wire code (and only to it). */
static void test_acl_codes(void **state)
{
	static const struct {
		const char *field; /* spec prefix: the name goes in the field after it */
		const char *name;
		int8_t code;
	} names[] = {
		{"", "TOPIC", 2},
		{"", "GROUP", 3},
		{"", "CLUSTER", 4},
		{"", "TRANSACTIONAL_ID", 5},
		{"", "DELEGATION_TOKEN", 6},
		{"", "USER", 7},
		{"*;*;", "ALL", 2},
		{"*;*;", "READ", 3},
		{"*;*;", "WRITE", 4},
		{"*;*;", "CREATE", 5},
		{"*;*;", "DELETE", 6},
		{"*;*;", "ALTER", 7},
		{"*;*;", "DESCRIBE", 8},
		{"*;*;", "CLUSTER_ACTION", 9},
		{"*;*;", "DESCRIBE_CONFIGS", 10},
		{"*;*;", "ALTER_CONFIGS", 11},
		{"*;*;", "IDEMPOTENT_WRITE", 12},
		{"*;*;", "CREATE_TOKENS", 13},
		{"*;*;", "DESCRIBE_TOKENS", 14},
		{"*;*;", "TWO_PHASE_COMMIT", 15},
		{"*;*;*;", "DENY", 2},
		{"*;*;*;", "ALLOW", 3},
	};
	(void)state;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		char spec[64], err[512];
		km_acl_scope *s;
		int which = names[i].field[0] == 0 ? 0 : strlen(names[i].field) == 4 ? 1 : 2;

		snprintf(spec, sizeof(spec), "%s%s", names[i].field, names[i].name);
		s = km_acl_scope_parse(spec, err, sizeof(err));
		if (!s)
			fail_msg("'%s' refused: %s", spec, err);
		for (int8_t c = 0; c <= 16; c++) {
			int8_t t = which == 0 ? c : TOPIC, o = which == 1 ? c : READ, p = which == 2 ? c : ALLOW;
			bool want = c == names[i].code;
			if (km_acl_scope_match(s, t, "x", o, p, "User:x") != want)
				fail_msg("'%s' with code %d: match should be %d", spec, c, want);
		}
		km_acl_scope_free(s);
	}
}

static void expect_acl_bad(const char *spec, const char *want)
{
	char err[512] = "";
	km_acl_scope *s = km_acl_scope_parse(spec, err, sizeof(err));

	if (s) {
		km_acl_scope_free(s);
		fail_msg("'%s' accepted", spec ? spec : "(null)");
	}
	if (!strstr(err, want))
		fail_msg("'%s': '%s' does not say '%s'", spec ? spec : "(null)", err, want);
}

static void test_acl_bad(void **state)
{
	char err[16];
	(void)state;
	expect_acl_bad("*,TOPIC;x;REED",
		       "rule 2 \"TOPIC;x;REED\": unknown operation \"REED\" (one of ALL, READ, WRITE, CREATE, DELETE, "
		       "ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, "
		       "CREATE_TOKENS, DESCRIBE_TOKENS, TWO_PHASE_COMMIT; * for any)");
	expect_acl_bad("TOPICS;x", "rule 1 \"TOPICS;x\": unknown resource type \"TOPICS\" (one of TOPIC, GROUP, "
				   "CLUSTER, TRANSACTIONAL_ID, DELEGATION_TOKEN, USER; * for any)");
	expect_acl_bad("TOPIC;*;READ;PERMIT", "rule 1 \"TOPIC;*;READ;PERMIT\": unknown permission type \"PERMIT\" "
					      "(one of DENY, ALLOW; * for any)");
	/* ANY is the filters' wildcard on the wire, not a name of a binding */
	expect_acl_bad("ANY", "unknown resource type \"ANY\"");
	expect_acl_bad("*;*;ANY", "unknown operation \"ANY\"");
	expect_acl_bad("TOPIC;a;READ;ALLOW;User:x, GROUP;(", "rule 2 \"GROUP;(\": resource name \"(\" is not a "
							     "valid regular expression");
	expect_acl_bad("*;*;*;*;User:[", "rule 1 \"*;*;*;*;User:[\": principal \"User:[\" is not a valid regular "
					 "expression");
	expect_acl_bad("*;*;*;*;**", "principal \"**\" is not a valid regular expression");
	expect_acl_bad("TOPIC;a;READ;ALLOW;User:x;host", "rule 1 \"TOPIC;a;READ;ALLOW;User:x;host\": 6 fields (at "
							 "most 5: resourceType;resourceName;operation;"
							 "permissionType;principal)");
	expect_acl_bad("*,*;*;*;*;*;*;*", "rule 2 \"*;*;*;*;*;*;*\": 7 fields");
	expect_acl_bad("TOPIC;a,,GROUP;b", "rule 2 is empty");
	expect_acl_bad("TOPIC;a, ,GROUP;b", "rule 2 is empty");
	expect_acl_bad("*,", "rule 2 is empty");
	expect_acl_bad(",*", "rule 1 is empty");
	expect_acl_bad("TOPIC;;READ", "rule 1 \"TOPIC;;READ\": empty resource name");
	expect_acl_bad("TOPIC;a;READ;", "rule 1 \"TOPIC;a;READ;\": empty permission type");
	/* an empty scope is accepted and holds no binding: the ACL sync is off */
	expect_scope("", 0);
	expect_scope("   ", 0);
	{
		char why[256];
		km_acl_scope *none = km_acl_scope_parse(NULL, why, sizeof(why));
		assert_non_null(none);
		assert_false(km_acl_scope_match(none, 2, "orders", 3, 3, "User:alice"));
		km_acl_scope_free(none);
	}
	/* a long rule is quoted in part, and a short buffer still ends in a NUL */
	{
		char spec[400], big[512];
		memset(spec, 'x', sizeof(spec) - 1);
		spec[sizeof(spec) - 1] = 0;
		assert_null(km_acl_scope_parse(spec, big, sizeof(big)));
		assert_true(strlen(big) < 300);
		assert_non_null(strstr(big, "unknown resource type"));
	}
	assert_null(km_acl_scope_parse("*;*;REED", err, sizeof(err)));
	assert_int_equal(strlen(err), sizeof(err) - 1);
}

static km_name_filter *filter(const char *inc, const char *exc)
{
	char err[512] = "";
	km_name_filter *f = km_name_filter_parse(inc, exc, err, sizeof(err));

	if (!f)
		fail_msg("include '%s' exclude '%s' refused: %s", inc, exc ? exc : "(null)", err);
	return f;
}

static void test_name_filter(void **state)
{
	km_name_filter *f;
	(void)state;

	f = filter(".*", "");
	assert_true(km_name_filter_match(f, "anything"));
	assert_true(km_name_filter_match(f, ""));
	km_name_filter_free(f);

	f = filter(".*", NULL);
	assert_true(km_name_filter_match(f, "consumer-1"));
	km_name_filter_free(f);

	/* some include matches, no exclude matches; each pattern matches the whole name */
	f = filter("consumer-.*,app", "consumer-test.*,.*-tmp");
	assert_true(km_name_filter_match(f, "consumer-1"));
	assert_true(km_name_filter_match(f, "consumer-"));
	assert_true(km_name_filter_match(f, "app"));
	assert_false(km_name_filter_match(f, "consumer-test"));
	assert_false(km_name_filter_match(f, "consumer-test-7"));
	assert_false(km_name_filter_match(f, "consumer-1-tmp"));
	assert_false(km_name_filter_match(f, "app-1"));
	assert_false(km_name_filter_match(f, "my-app"));
	assert_false(km_name_filter_match(f, "xconsumer-1"));
	assert_false(km_name_filter_match(f, "consumers"));
	/* an exclude pattern matching part of the name does not exclude it */
	assert_true(km_name_filter_match(f, "consumer-tmp-1"));
	km_name_filter_free(f);

	/* exclude wins over an include that names the group exactly */
	f = filter("orders", "orders");
	assert_false(km_name_filter_match(f, "orders"));
	km_name_filter_free(f);

	/* spaces around patterns, and an all-blank exclude is none */
	f = filter(" orders , payments ", "  ");
	assert_true(km_name_filter_match(f, "orders"));
	assert_true(km_name_filter_match(f, "payments"));
	assert_false(km_name_filter_match(f, " orders"));
	km_name_filter_free(f);

	/* alternation and anchors written by the operator */
	f = filter("a|b,^c$", NULL);
	assert_true(km_name_filter_match(f, "a"));
	assert_true(km_name_filter_match(f, "b"));
	assert_true(km_name_filter_match(f, "c"));
	assert_false(km_name_filter_match(f, "ab"));
	km_name_filter_free(f);

	/* a lone ')' is a literal; wrapping it as ^(a)|b)$ would match "abc" */
	f = filter("a)|b", NULL);
	assert_true(km_name_filter_match(f, "a)"));
	assert_true(km_name_filter_match(f, "b"));
	assert_false(km_name_filter_match(f, "abc"));
	assert_false(km_name_filter_match(f, "xb)"));
	km_name_filter_free(f);
}

static void expect_filter_bad(const char *inc, const char *exc, const char *want)
{
	char err[512] = "";
	km_name_filter *f = km_name_filter_parse(inc, exc, err, sizeof(err));

	if (f) {
		km_name_filter_free(f);
		fail_msg("include '%s' exclude '%s' accepted", inc ? inc : "(null)", exc ? exc : "(null)");
	}
	if (!strstr(err, want))
		fail_msg("include '%s' exclude '%s': '%s' does not say '%s'", inc ? inc : "(null)",
			 exc ? exc : "(null)", err, want);
}

static void test_name_filter_bad(void **state)
{
	(void)state;
	expect_filter_bad("a,(", NULL, "include pattern 2 \"(\": not a valid regular expression");
	expect_filter_bad(".*", "ok,x{", "exclude pattern 2 \"x{\": not a valid regular expression");
	expect_filter_bad("*", NULL, "include pattern 1 \"*\": not a valid regular expression");
	expect_filter_bad("a,,b", NULL, "include pattern 2 is empty");
	expect_filter_bad("a,", NULL, "include pattern 2 is empty");
	expect_filter_bad(".*", "x, ,y", "exclude pattern 2 is empty");
	expect_filter_bad(".*", ",", "exclude pattern 1 is empty");
	/* an empty include is accepted and matches no group: the offset sync is off */
	{
		const char *empty[] = {"", "  ", NULL};
		for (size_t i = 0; i < 3; i++) {
			char err[256];
			km_name_filter *f = km_name_filter_parse(empty[i], NULL, err, sizeof(err));
			assert_non_null(f);
			assert_false(km_name_filter_match(f, "app-1"));
			assert_false(km_name_filter_match(f, ""));
			km_name_filter_free(f);
		}
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_acl_examples), cmocka_unit_test(test_acl_fields),
		cmocka_unit_test(test_acl_codes),    cmocka_unit_test(test_acl_bad),
		cmocka_unit_test(test_name_filter),  cmocka_unit_test(test_name_filter_bad),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
