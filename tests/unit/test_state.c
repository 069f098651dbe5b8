/* The state store's pure parts: the transition table, configuration checks, secrets, record keys and values, the model. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include <openssl/evp.h>
#include <openssl/rand.h>

#include "kmirror/msg/mirror_state_partition_key.h"
#include "kmirror/msg/mirror_state_partition_value.h"
#include "kmirror/daemon_config.h"
#include "state/state_int.h"
#include "unit_doc.h"

/* The whole op x state table, written out: any change to the rules must change this test. */
static void test_transitions(void **state)
{
	/* allowed[op][state]: U PREP MIR PAUSING PAUSED STOPPING STOPPED FAILED */
	static const int allowed[KM_TOPIC__COUNT][KM_MP__COUNT] = {
		[KM_TOPIC_START] = {1, 0, 0, 0, 0, 0, 1, 1},
		[KM_TOPIC_STOP] = {0, 1, 1, 0, 1, 0, 0, 1},
		[KM_TOPIC_PAUSE] = {0, 0, 1, 0, 0, 0, 0, 0},
		[KM_TOPIC_RESUME] = {0, 0, 0, 0, 1, 0, 0, 0},
	};
	(void)state;
	for (int op = 0; op < KM_TOPIC__COUNT; op++)
		for (int s = 0; s < KM_MP__COUNT; s++) {
			km_err code = 12345;
			bool ok = km_topic_op_allowed((km_topic_op)op, (km_mp_state)s, &code);
			if (ok != (bool)allowed[op][s])
				fail_msg("%s from %s: got %d", km_topic_op_name((km_topic_op)op), km_mp_state_name((km_mp_state)s), ok);
			if (ok)
				assert_int_equal(code, KM_OK);
			else if (op == KM_TOPIC_START)
				assert_int_equal(code, KM_MIRROR_TOPIC_ALREADY_IN_CLUSTER_MIRROR);
			else if (op == KM_TOPIC_RESUME)
				assert_int_equal(code, KM_MIRROR_MIRROR_TOPIC_NOT_PAUSED);
			else
				assert_int_equal(code, KM_MIRROR_INVALID_CLUSTER_MIRROR_STATES);
		}
	assert_int_equal(km_topic_op_target(KM_TOPIC_START), KM_MP_PREPARING);
	assert_int_equal(km_topic_op_target(KM_TOPIC_STOP), KM_MP_STOPPING);
	assert_int_equal(km_topic_op_target(KM_TOPIC_PAUSE), KM_MP_PAUSING);
	assert_int_equal(km_topic_op_target(KM_TOPIC_RESUME), KM_MP_MIRRORING);
	assert_string_equal(km_mp_state_name(KM_MP_PAUSED), "PAUSED");
	assert_string_equal(km_mp_state_name((km_mp_state)99), "INVALID");
	assert_string_equal(km_topic_op_name(KM_TOPIC_RESUME), "resume");
}

static km_err check1(const char *k, const char *v, bool create, char *err, size_t len)
{
	km_state_kv kv[2] = {{"bootstrap.servers", "src:9092"}, {k, v}};
	err[0] = 0;
	return km_state_config_check(kv, 2, create, err, len);
}

static void expect_bad(const char *k, const char *v, const char *why)
{
	char err[512];
	assert_int_equal(check1(k, v, true, err, sizeof(err)), KM_MIRROR_INVALID_CLUSTER_MIRROR_CONFIG);
	if (!strstr(err, k) || !strstr(err, why))
		fail_msg("%s=%s: '%s' does not say '%s'", k, v, err, why);
}

/* The data plane's moves (km_state_partitions_set), checked against the committed state. */
static void test_settle_transitions(void **state)
{
	(void)state;
	assert_true(km_state_settle_allowed(KM_MP_PREPARING, KM_MP_MIRRORING));
	assert_true(km_state_settle_allowed(KM_MP_PAUSING, KM_MP_PAUSED));
	assert_true(km_state_settle_allowed(KM_MP_STOPPING, KM_MP_STOPPED));
	assert_true(km_state_settle_allowed(KM_MP_MIRRORING, KM_MP_STOPPING)); /* the source topic deleted */
	assert_false(km_state_settle_allowed(KM_MP_PAUSED, KM_MP_STOPPING));
	assert_true(km_state_settle_allowed(KM_MP_MIRRORING, KM_MP_FAILED));
	assert_true(km_state_settle_allowed(KM_MP_PREPARING, KM_MP_FAILED));
	assert_true(km_state_settle_allowed(KM_MP_MIRRORING, KM_MP_MIRRORING));
	/* the driver racing an operator: a stop (or pause) that ran first is never undone */
	assert_false(km_state_settle_allowed(KM_MP_STOPPING, KM_MP_MIRRORING));
	assert_false(km_state_settle_allowed(KM_MP_STOPPED, KM_MP_MIRRORING));
	assert_false(km_state_settle_allowed(KM_MP_MIRRORING, KM_MP_PAUSED));
	assert_false(km_state_settle_allowed(KM_MP_PAUSED, KM_MP_STOPPED));
	assert_false(km_state_settle_allowed(KM_MP_STOPPED, KM_MP_FAILED));
	assert_false(km_state_settle_allowed(KM_MP_UNKNOWN, KM_MP_MIRRORING));
	assert_false(km_state_settle_allowed(KM_MP_MIRRORING, KM_MP_PREPARING));
	assert_false(km_state_settle_allowed(KM_MP_MIRRORING, (km_mp_state)42));
}

static void test_config(void **state)
{
	char err[512];
	km_state_kv none[1] = {{"security.protocol", "SSL"}};
	(void)state;
	assert_true(km_state_config_is_secret("sasl.password"));
	assert_true(km_state_config_is_secret("sasl.jaas.config"));
	assert_true(km_state_config_is_secret("ssl.truststore.password"));
	assert_true(km_state_config_is_secret("foo.password"));
	assert_false(km_state_config_is_secret("sasl.username"));
	assert_false(km_state_config_is_secret("password"));
	assert_false(km_state_config_is_secret("bootstrap.servers"));

	assert_int_equal(check1("security.protocol", "SASL_SSL", true, err, sizeof(err)), KM_OK);
	assert_int_equal(check1("sasl.mechanism", "SCRAM-SHA-512", true, err, sizeof(err)), KM_OK);
	assert_int_equal(check1("mirror.fetch.max.bytes", "1048576", true, err, sizeof(err)), KM_OK);
	assert_int_equal(check1("mirror.topics.include", "orders-.*", true, err, sizeof(err)), KM_OK);
	assert_int_equal(check1("mirror.topics.include", "orders-.*, payments", true, err, sizeof(err)), KM_OK);
	assert_int_equal(check1("mirror.topics.exclude", ".*-internal", true, err, sizeof(err)), KM_OK);
	assert_int_equal(check1("ssl.endpoint.identification.algorithm", "", true, err, sizeof(err)), KM_OK);
	assert_int_equal(check1("sasl.password", "hunter2", true, err, sizeof(err)), KM_OK);

	expect_bad("security.protocol", "TLS", "is not one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL");
	expect_bad("sasl.mechanism", "plain", "is not one of");
	expect_bad("ssl.endpoint.identification.algorithm", "none", "is not one of");
	expect_bad("no.such.key", "1", "unknown configuration key");
	expect_bad("mirror.nope", "1", "unknown mirror option");
	expect_bad("mirror.fetch.max.bytes", "lots", "mirror.fetch.max.bytes");
	expect_bad("mirror.replication.throttled.rate", "-1", "mirror.replication.throttled.rate");
	expect_bad("mirror.start.offset", "yesterday", "mirror.start.offset");
	expect_bad("mirror.start.offset", "-5", "mirror.start.offset");
	expect_bad("mirror.groups.include", "(", "not a valid regular expression");
	assert_int_equal(check1("mirror.groups.include", "", true, err, sizeof(err)), KM_OK); /* none: off */
	expect_bad("mirror.groups.include", "a,,b", "include pattern 2 is empty");

	/* the metadata sync's filters: each option is checked by the parser the sync uses */
	assert_int_equal(check1("mirror.groups.include", "consumer-.*, app", true, err, sizeof(err)), KM_OK);
	assert_int_equal(check1("mirror.groups.exclude", "test-.*,tmp", true, err, sizeof(err)), KM_OK);
	assert_int_equal(check1("mirror.groups.exclude", "", true, err, sizeof(err)), KM_OK);
	assert_int_equal(check1("mirror.acl.include", "*", true, err, sizeof(err)), KM_OK);
	assert_int_equal(check1("mirror.acl.include", "TOPIC;orders.*,*;*;*;*;User:alice", true, err, sizeof(err)),
			 KM_OK);
	assert_int_equal(check1("mirror.acl.include", "group;consumer-.*;read;allow;User:bob", true, err, sizeof(err)),
			 KM_OK);
	expect_bad("mirror.groups.exclude", "(", "exclude pattern 1 \"(\": not a valid regular expression");
	expect_bad("mirror.groups.exclude", "a,,b", "exclude pattern 2 is empty");
	expect_bad("mirror.topics.include", "orders-(", "include pattern 1 \"orders-(\": not a valid regular expression");
	expect_bad("mirror.topics.exclude", "x,,y", "exclude pattern 2 is empty");
	expect_bad("mirror.acl.include", "*,TOPIC;x;REED", "rule 2 \"TOPIC;x;REED\": unknown operation \"REED\"");
	expect_bad("mirror.acl.include", "TOPIC;(", "resource name \"(\" is not a valid regular expression");
	expect_bad("mirror.acl.include", "*;*;*;*;*;*", "6 fields");
	assert_int_equal(check1("mirror.acl.include", "", true, err, sizeof(err)), KM_OK); /* none: off */
	/* an AlterMirror changing only these keys is checked the same way */
	{
		km_state_kv acl[1] = {{"mirror.acl.include", "TOPIC;x;REED"}};
		km_state_kv exc[1] = {{"mirror.groups.exclude", "x{"}};
		km_state_kv ok[2] = {{"mirror.acl.include", "TOPIC;orders.*"}, {"mirror.groups.exclude", "tmp-.*"}};
		assert_int_equal(km_state_config_check(acl, 1, false, err, sizeof(err)),
				 KM_MIRROR_INVALID_CLUSTER_MIRROR_CONFIG);
		assert_non_null(strstr(err, "invalid configuration mirror.acl.include: rule 1"));
		assert_int_equal(km_state_config_check(exc, 1, false, err, sizeof(err)),
				 KM_MIRROR_INVALID_CLUSTER_MIRROR_CONFIG);
		assert_non_null(strstr(err, "invalid configuration mirror.groups.exclude: exclude pattern 1"));
		assert_int_equal(km_state_config_check(ok, 2, false, err, sizeof(err)), KM_OK);
	}
	expect_bad("bootstrap.servers", "x", "given twice");
	/* Kafka's stores: PKCS12, PEM or JKS (a PKCS12 file); in place of the PEM files, not beside them */
	expect_bad("ssl.truststore.type", "JCEKS", "'JCEKS' is not one of PKCS12, PEM, JKS");
	assert_int_equal(check1("ssl.keystore.type", "PKCS12", true, err, sizeof(err)), KM_OK);
	assert_int_equal(check1("ssl.truststore.password", "changeit", true, err, sizeof(err)), KM_OK);
	assert_true(km_state_config_is_secret("ssl.truststore.password"));
	assert_true(km_state_config_is_secret("ssl.keystore.password"));
	{
		km_state_kv two[3] = {{"bootstrap.servers", "s:1"}, {"ssl.ca.location", "/d/ca.pem"},
				      {"ssl.truststore.location", "/d/ca.p12"}};
		km_state_kv keys[2] = {{"ssl.certificate.location", "/d/c.pem"}, {"ssl.keystore.location", "/d/c.p12"}};
		assert_int_equal(km_state_config_check(two, 3, true, err, sizeof(err)), KM_MIRROR_INVALID_CLUSTER_MIRROR_CONFIG);
		assert_non_null(strstr(err, "ssl.ca.location and ssl.truststore.location both say which CAs to trust"));
		assert_int_equal(km_state_config_check(keys, 2, false, err, sizeof(err)), KM_MIRROR_INVALID_CLUSTER_MIRROR_CONFIG);
		assert_non_null(strstr(err, "keep one"));
	}

	/* bootstrap.servers is required on create, must be host:port entries */
	assert_int_equal(km_state_config_check(none, 1, true, err, sizeof(err)), KM_MIRROR_INVALID_CLUSTER_MIRROR_CONFIG);
	assert_non_null(strstr(err, "bootstrap.servers"));
	assert_non_null(strstr(err, "required"));
	assert_int_equal(km_state_config_check(none, 1, false, err, sizeof(err)), KM_OK);
	{
		km_state_kv b[1] = {{"bootstrap.servers", "a:1, b:2,c:3"}};
		km_state_kv bad[1] = {{"bootstrap.servers", "a:1,nohost"}};
		km_state_kv rm[1] = {{"bootstrap.servers", NULL}};
		km_state_kv rm2[1] = {{"mirror.fetch.max.bytes", NULL}};
		assert_int_equal(km_state_config_check(b, 1, true, err, sizeof(err)), KM_OK);
		assert_int_equal(km_state_config_check(bad, 1, true, err, sizeof(err)), KM_MIRROR_INVALID_CLUSTER_MIRROR_CONFIG);
		assert_non_null(strstr(err, "'nohost' is not host:port"));
		assert_int_equal(km_state_config_check(rm, 1, false, err, sizeof(err)), KM_MIRROR_INVALID_CLUSTER_MIRROR_CONFIG);
		assert_non_null(strstr(err, "cannot be removed"));
		assert_int_equal(km_state_config_check(rm2, 1, false, err, sizeof(err)), KM_OK);
	}
	/* a refused secret never shows its value */
	{
		km_state_kv s[2] = {{"bootstrap.servers", "s:1"}, {"sasl.password", NULL}};
		assert_int_equal(km_state_config_check(s, 2, true, err, sizeof(err)), KM_MIRROR_INVALID_CLUSTER_MIRROR_CONFIG);
		assert_non_null(strstr(err, "sasl.password"));
	}
}

static void test_mirror_option_table(void **state)
{
	const km_opt_table *t = km_state_mirror_option_table();
	km_mirror_options o;
	char *gen;
	size_t glen;
	FILE *f;
	(void)state;
	assert_int_equal(km_opt_init(t, &o), KM_OK);
	assert_int_equal(o.metadata_refresh_interval_ms, 30000);
	assert_string_equal(o.groups_include, ".*");
	assert_null(o.groups_exclude);
	assert_null(o.acl_include); /* the ACL sync is off unless a scope is given */
	assert_int_equal(o.fetch_max_bytes, 52428800);
	assert_int_equal(o.fetch_partition_max_bytes, 10485760);
	assert_int_equal(o.throttle_bytes_per_sec, 0);
	assert_null(o.topics_include);
	assert_string_equal(o.start_offset, "earliest");
	km_opt_free(t, &o);
	/* docs/configuration.md shows the table */
	f = open_memstream(&gen, &glen);
	km_opt_write_doc(t, f);
	fclose(f);
	assert_doc_shows("configuration.md", "<!-- BEGIN MIRROR OPTIONS -->\n", "<!-- END MIRROR OPTIONS -->", gen, glen,
			 "regenerate it from km_state_mirror_option_table(); tests/unit/test_state prints it");
	free(gen);
}

static void test_secrets(void **state)
{
	uint8_t key[KM_STATE_KEY_BYTES], other[KM_STATE_KEY_BYTES], *sealed, *sealed2;
	size_t len, len2;
	char buf[256];
	bool legacy = true;
	(void)state;
	for (int i = 0; i < KM_STATE_KEY_BYTES; i++) {
		key[i] = (uint8_t)i;
		other[i] = (uint8_t)(i + 1);
	}
	assert_int_equal(km_state_seal(key, "m1", "sasl.password", "hunter2-secret", &sealed, &len), KM_OK);
	assert_int_equal(len, 1 + KM_STATE_NONCE_BYTES + strlen("hunter2-secret") + KM_STATE_TAG_BYTES);
	assert_int_equal(sealed[0], KM_STATE_SEAL_V1);
	assert_null(memmem(sealed, len, "hunter2", 7));
	assert_int_equal(km_state_open(key, "m1", "sasl.password", sealed, len, buf, sizeof(buf), &legacy), KM_OK);
	assert_string_equal(buf, "hunter2-secret");
	assert_false(legacy);
	/* a fresh nonce every time */
	assert_int_equal(km_state_seal(key, "m1", "sasl.password", "hunter2-secret", &sealed2, &len2), KM_OK);
	assert_int_equal(len, len2);
	assert_memory_not_equal(sealed, sealed2, len);
	/* wrong key, other mirror, other name (associated data), tampered version, nonce, ciphertext or tag, short input */
	assert_int_equal(km_state_open(other, "m1", "sasl.password", sealed, len, buf, sizeof(buf), NULL), KM_ERR_DECODE);
	assert_int_equal(km_state_open(key, "m2", "sasl.password", sealed, len, buf, sizeof(buf), NULL), KM_ERR_DECODE);
	assert_int_equal(km_state_open(key, "m1", "ssl.key.password", sealed, len, buf, sizeof(buf), NULL), KM_ERR_DECODE);
	/* the lengths go into the associated data: "m1" + "xsasl.password" is not "m1x" + "sasl.password" */
	assert_int_equal(km_state_open(key, "m1x", "sasl.password", sealed, len, buf, sizeof(buf), NULL), KM_ERR_DECODE);
	for (size_t pos = 0; pos < len; pos += 3) {
		sealed[pos] ^= 0x01;
		assert_int_equal(km_state_open(key, "m1", "sasl.password", sealed, len, buf, sizeof(buf), NULL),
				 KM_ERR_DECODE);
		sealed[pos] ^= 0x01;
	}
	assert_int_equal(km_state_open(key, "m1", "sasl.password", sealed, 20, buf, sizeof(buf), NULL), KM_ERR_DECODE);
	assert_int_equal(km_state_open(key, "m1", "sasl.password", sealed, len, buf, 4, NULL), KM_ERR_TOO_LARGE);
	/* exactly the text's size plus its terminator is enough */
	assert_int_equal(km_state_open(key, "m1", "sasl.password", sealed, len, buf, 15, NULL), KM_OK);
	free(sealed);
	free(sealed2);
}

/* Format 0 as kmirrord wrote it before formats: nonce, ciphertext, tag; the key's name as associated data. */
static void seal_v0(const uint8_t *key, const char *name, const char *clear, uint8_t *out, size_t *outlen)
{
	EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
	size_t clen = strlen(clear);
	int l = 0, l2 = 0;

	assert_int_equal(RAND_bytes(out, KM_STATE_NONCE_BYTES), 1);
	assert_int_equal(EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, key, out), 1);
	assert_int_equal(EVP_EncryptUpdate(ctx, NULL, &l, (const uint8_t *)name, (int)strlen(name)), 1);
	assert_int_equal(EVP_EncryptUpdate(ctx, out + KM_STATE_NONCE_BYTES, &l, (const uint8_t *)clear, (int)clen), 1);
	assert_int_equal(EVP_EncryptFinal_ex(ctx, out + KM_STATE_NONCE_BYTES + l, &l2), 1);
	assert_int_equal(EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, KM_STATE_TAG_BYTES,
					     out + KM_STATE_NONCE_BYTES + clen), 1);
	EVP_CIPHER_CTX_free(ctx);
	*outlen = KM_STATE_NONCE_BYTES + clen + KM_STATE_TAG_BYTES;
}

/* Values of format 0 still open (in any mirror: they name none) and are sealed again in format 1. */
static void test_secrets_format0(void **state)
{
	uint8_t key[KM_STATE_KEY_BYTES], v0[128], *again, *none;
	size_t len0, len, nlen;
	char buf[128];
	bool legacy = false;
	int first_one = 0;
	(void)state;
	memset(key, 7, sizeof(key));
	/* many values: some nonces begin with format 1's version byte, and must still open as format 0 */
	for (int i = 0; i < 2000; i++) {
		seal_v0(key, "sasl.password", "old-secret", v0, &len0);
		first_one += v0[0] == KM_STATE_SEAL_V1;
		assert_int_equal(km_state_open(key, "m1", "sasl.password", v0, len0, buf, sizeof(buf), &legacy), KM_OK);
		assert_string_equal(buf, "old-secret");
		assert_true(legacy);
		assert_int_equal(km_state_open(key, "m1", "sasl.jaas.config", v0, len0, buf, sizeof(buf), NULL),
				 KM_ERR_DECODE);
	}
	assert_true(first_one > 0);
	assert_int_equal(km_state_reseal(key, "m1", "sasl.password", v0, len0, &again, &len), KM_OK);
	assert_non_null(again);
	assert_int_equal(len, len0 + 1);
	assert_int_equal(again[0], KM_STATE_SEAL_V1);
	assert_int_equal(km_state_open(key, "m1", "sasl.password", again, len, buf, sizeof(buf), &legacy), KM_OK);
	assert_string_equal(buf, "old-secret");
	assert_false(legacy);
	assert_int_equal(km_state_open(key, "m2", "sasl.password", again, len, buf, sizeof(buf), NULL), KM_ERR_DECODE);
	/* already format 1: nothing to do; does not open: left as it is */
	assert_int_equal(km_state_reseal(key, "m1", "sasl.password", again, len, &none, &nlen), KM_OK);
	assert_null(none);
	assert_int_equal(km_state_reseal(key, "m2", "sasl.password", again, len, &none, &nlen), KM_ERR_DECODE);
	assert_null(none);
	free(again);
}

static void test_key_file(void **state)
{
	char path[] = "/tmp/km-test-key-XXXXXX", err[512];
	uint8_t key[KM_STATE_KEY_BYTES];
	bool loose;
	int fd = mkstemp(path);
	FILE *f;
	(void)state;
	assert_true(fd >= 0);
	close(fd);
	f = fopen(path, "w");
	fprintf(f, "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1F\n");
	fclose(f);
	chmod(path, 0600);
	assert_int_equal(km_state_key_load(path, true, key, &loose, err, sizeof(err)), KM_OK);
	assert_false(loose);
	assert_int_equal(key[0], 0);
	assert_int_equal(key[31], 0x1f);
	/* group or others may read it: refused, saying what to run; allowed with the check off */
	for (int i = 0; i < 3; i++) {
		static const mode_t modes[] = {0644, 0640, 0602};
		char want[300];
		chmod(path, modes[i]);
		assert_int_equal(km_state_key_load(path, true, key, &loose, err, sizeof(err)), KM_ERR_CONFIG);
		snprintf(want, sizeof(want), "run chmod 600 %s", path);
		assert_non_null(strstr(err, want));
		assert_non_null(strstr(err, "secret_file_mode_check = false"));
		assert_int_equal(km_state_key_load(path, false, key, &loose, err, sizeof(err)), KM_OK);
		assert_true(loose);
		assert_non_null(strstr(err, "secret_file_mode_check is false"));
	}
	chmod(path, 0400);
	assert_int_equal(km_state_key_load(path, true, key, &loose, err, sizeof(err)), KM_OK);
	chmod(path, 0600);
	f = fopen(path, "w");
	fprintf(f, "too short");
	fclose(f);
	assert_int_equal(km_state_key_load(path, true, key, &loose, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "not a key"));
	f = fopen(path, "w");
	for (int i = 0; i < 32; i++)
		fputc(200 + (i % 50), f);
	fclose(f);
	assert_int_equal(km_state_key_load(path, true, key, &loose, err, sizeof(err)), KM_OK);
	assert_int_equal(key[1], 201);
	f = fopen(path, "w");
	for (int i = 0; i < 100; i++)
		fputc('a', f);
	fclose(f);
	assert_int_equal(km_state_key_load(path, true, key, &loose, err, sizeof(err)), KM_ERR_CONFIG);
	unlink(path);
	assert_int_equal(km_state_key_load(path, true, key, &loose, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "No such file"));
}

static void test_keys(void **state)
{
	km_state_key k = {.type = KM_STATE_REC_PARTITION, .mirror = km_str_c("m1"), .topic = km_str_c("orders"),
			  .partition = 7}, d;
	km_wr w;
	(void)state;
	km_wr_init(&w);
	km_state_key_encode(&w, &k);
	assert_true(km_wr_ok(&w));
	/* int16 type 1, then MirrorStatePartitionKey v0: int16-length strings and int32 */
	static const uint8_t want[] = {0, 1, 0, 2, 'm', '1', 0, 6, 'o', 'r', 'd', 'e', 'r', 's', 0, 0, 0, 7};
	assert_int_equal(w.len, sizeof(want));
	assert_memory_equal(w.buf, want, sizeof(want));
	assert_int_equal(km_state_key_decode(w.buf, w.len, &d), KM_OK);
	assert_int_equal(d.type, 1);
	assert_true(km_str_eq_c(d.mirror, "m1"));
	assert_true(km_str_eq_c(d.topic, "orders"));
	assert_int_equal(d.partition, 7);
	assert_int_equal(km_state_key_decode(w.buf, w.len - 1, &d), KM_ERR_DECODE);
	w.buf[1] = 9; /* unknown type */
	assert_int_equal(km_state_key_decode(w.buf, w.len, &d), KM_ERR_DECODE);
	km_wr_free(&w);

	/* Kafka's murmur2 (the Java client's Utils.murmur2) of known inputs */
	assert_int_equal(km_state_murmur2((const uint8_t *)"21", 2), (uint32_t)-973932308);
	assert_int_equal(km_state_murmur2((const uint8_t *)"foobar", 6), (uint32_t)-790332482);
	assert_int_equal(km_state_murmur2((const uint8_t *)"a-little-bit-long-string", 24), (uint32_t)-985981536);
	assert_int_equal(km_state_murmur2((const uint8_t *)"", 0), 275646681u);
	for (int n = 1; n < 50; n++) {
		int32_t p = km_state_key_partition((const uint8_t *)"abc", 3, n);
		assert_true(p >= 0 && p < n);
	}
}

static void rec(km_state_model *m, const km_state_key *k, km_wr *val, km_state_change *chg)
{
	km_wr kw;
	km_wr_init(&kw);
	km_state_key_encode(&kw, k);
	assert_int_equal(km_state_model_apply(m, kw.buf, kw.len, val ? val->buf : NULL, val ? val->len : 0, val == NULL, chg),
			 KM_OK);
	km_wr_free(&kw);
}

/* Values encode and decode through the model as load and commit both use it. */
static void test_values_and_model(void **state)
{
	km_state_model m;
	km_state_cfg_entry cfg[2] = {{.name = "bootstrap.servers", .value = "s:9092"},
				     {.name = "sasl.password", .sealed = (uint8_t *)"0123456789abcdefghijklmnopqrstu", .sealed_len = 31}};
	km_state_mirror mi = {.name = "m1", .created_ms = 111, .modified_ms = 222, .cfg = cfg, .ncfg = 2};
	km_state_key mk = {.type = KM_STATE_REC_MIRROR, .mirror = km_str_c("m1")};
	km_state_key pk = {.type = KM_STATE_REC_PARTITION, .mirror = km_str_c("m1"), .topic = km_str_c("t"), .partition = 2};
	km_state_topic tt = {.name = "t", .mirror = &mi};
	km_state_part p = {.state = KM_MP_PREPARING, .state_change_ms = 5, .last_mirrored_offset = 42,
			   .last_mirrored_epoch = 3, .last_error = "boom", .last_error_ms = 6};
	km_state_change chg;
	const km_state_mirror *got;
	const km_state_topic *t;
	km_state_partition_info info;
	const char *name, *value;
	bool secret;
	km_wr w;
	(void)state;

	memset(tt.id.b, 0xab, 16);
	km_state_model_init(&m);
	/* a partition before its mirror is dropped (a deleted mirror's leftovers) */
	km_wr_init(&w);
	assert_int_equal(km_state_partition_value_encode(&w, &tt, &p), KM_OK);
	assert_int_equal(km_be16(w.buf), 0); /* value version */
	rec(&m, &pk, &w, &chg);
	assert_false(chg.changed);
	assert_int_equal(m.nmirrors, 0);

	km_wr w2;
	km_wr_init(&w2);
	assert_int_equal(km_state_mirror_value_encode(&w2, &mi), KM_OK);
	rec(&m, &mk, &w2, &chg);
	assert_int_equal(m.nmirrors, 1);
	rec(&m, &pk, &w, &chg);
	assert_true(chg.changed);
	assert_int_equal(chg.from, KM_MP_UNKNOWN);
	assert_int_equal(chg.to, KM_MP_PREPARING);
	assert_string_equal(chg.topic, "t");
	assert_int_equal(chg.partition, 2);
	assert_int_equal(km_state_model_index(&m), KM_OK);

	got = km_state_model_mirror(&m, "m1");
	assert_non_null(got);
	assert_int_equal(km_state_mirror_created_ms(got), 111);
	assert_string_equal(km_state_mirror_source(got), "s:9092");
	assert_int_equal(km_state_mirror_config_count(got), 2);
	km_state_mirror_config_at(got, 1, &name, &value, &secret);
	assert_string_equal(name, "sasl.password");
	assert_null(value);
	assert_true(secret);
	t = km_state_model_topic(&m, "t", 1);
	assert_non_null(t);
	assert_ptr_equal(km_state_model_topic_id(&m, &tt.id), t);
	assert_int_equal(km_state_topic_partition_count(t), 1);
	km_state_topic_partition(t, 0, &info);
	assert_int_equal(info.partition, 2);
	assert_int_equal(info.last_mirrored_offset, 42);
	assert_int_equal(info.last_mirrored_epoch, 3);
	assert_string_equal(info.last_error, "boom");
	assert_int_equal(km_state_topic_state(t), KM_MP_PREPARING);
	assert_true(km_state_topic_read_only(t, 2));
	assert_true(km_state_topic_read_only(t, 5)); /* unknown partition: the topic's state */

	/* STOPPED is writable and still in the mirror */
	p.state = KM_MP_STOPPED;
	km_wr_free(&w);
	km_wr_init(&w);
	assert_int_equal(km_state_partition_value_encode(&w, &tt, &p), KM_OK);
	rec(&m, &pk, &w, &chg);
	assert_int_equal(chg.from, KM_MP_PREPARING);
	assert_int_equal(chg.to, KM_MP_STOPPED);
	assert_false(km_state_topic_read_only(t, 2));
	assert_int_equal(km_state_topic_state(t), KM_MP_STOPPED);

	/* a malformed value is refused, the state kept */
	{
		km_wr kw;
		uint8_t bad[3] = {0, 0, 9};
		km_wr_init(&kw);
		km_state_key_encode(&kw, &pk);
		assert_int_equal(km_state_model_apply(&m, kw.buf, kw.len, bad, 3, false, &chg), KM_ERR_DECODE);
		km_wr_free(&kw);
		assert_int_equal(km_state_topic_state(t), KM_MP_STOPPED);
	}
	/* tombstones: the partition, then the mirror */
	rec(&m, &pk, NULL, &chg);
	assert_true(chg.changed);
	assert_int_equal(km_state_model_index(&m), KM_OK);
	assert_null(km_state_model_topic(&m, "t", 1));
	rec(&m, &mk, NULL, &chg);
	assert_int_equal(m.nmirrors, 0);
	km_wr_free(&w);
	km_wr_free(&w2);
	km_state_model_free(&m);
}

/* A mirror record, its key encoded here, whatever the model answers. */
static km_err apply_mirror_value(km_state_model *m, const char *name, const uint8_t *val, size_t vlen)
{
	km_state_key k = {.type = KM_STATE_REC_MIRROR, .mirror = km_str_c(name)};
	km_state_change chg;
	km_wr kw;
	km_err rc;

	km_wr_init(&kw);
	km_state_key_encode(&kw, &k);
	rc = km_state_model_apply(m, kw.buf, kw.len, val, vlen, false, &chg);
	km_wr_free(&kw);
	return rc;
}

/*
 * A mirror value whose configuration entries do not decode (cut inside them, or more of them than
 * a mirror may have) is refused, and the mirror stays as it was; a new mirror is not created.
 */
static void test_mirror_value_refused(void **state)
{
	static km_state_cfg_entry many[KM_STATE_MAX_CONFIGS + 1];
	static char names[KM_STATE_MAX_CONFIGS + 1][16];
	km_state_cfg_entry cfg[2] = {{.name = "bootstrap.servers", .value = "s:9092"},
				     {.name = "mirror.fetch.max.bytes", .value = "2048"}};
	km_state_mirror mi = {.name = "m1", .created_ms = 111, .modified_ms = 222, .cfg = cfg, .ncfg = 2};
	km_state_mirror big = {.name = "m1", .created_ms = 333, .modified_ms = 444, .cfg = many,
			       .ncfg = KM_STATE_MAX_CONFIGS + 1};
	km_state_model m;
	const km_state_mirror *got;
	km_wr w, wbig;
	(void)state;

	for (size_t i = 0; i < KM_STATE_MAX_CONFIGS + 1; i++) {
		snprintf(names[i], sizeof(names[i]), "c%zu", i);
		many[i] = (km_state_cfg_entry){.name = names[i], .value = "v"};
	}
	km_state_model_init(&m);
	km_wr_init(&w);
	km_wr_init(&wbig);
	assert_int_equal(km_state_mirror_value_encode(&w, &mi), KM_OK);
	assert_int_equal(km_state_mirror_value_encode(&wbig, &big), KM_OK);
	assert_int_equal(apply_mirror_value(&m, "m1", w.buf, w.len), KM_OK);

	/* Cut inside the second entry: the count decoded, the entries not. */
	assert_int_equal(apply_mirror_value(&m, "m1", w.buf, w.len - 4), KM_ERR_DECODE);
	/* One entry more than a mirror may have. */
	assert_int_equal(apply_mirror_value(&m, "m1", wbig.buf, wbig.len), KM_ERR_DECODE);
	assert_int_equal(km_state_model_index(&m), KM_OK);
	got = km_state_model_mirror(&m, "m1");
	assert_non_null(got);
	assert_int_equal(km_state_mirror_created_ms(got), 111);
	assert_int_equal(km_state_mirror_config_count(got), 2);
	assert_string_equal(km_state_mirror_source(got), "s:9092");

	/* Neither creates a mirror that was not there. */
	assert_int_equal(apply_mirror_value(&m, "m2", w.buf, w.len - 4), KM_ERR_DECODE);
	assert_int_equal(apply_mirror_value(&m, "m2", wbig.buf, wbig.len), KM_ERR_DECODE);
	assert_int_equal(m.nmirrors, 1);
	km_wr_free(&w);
	km_wr_free(&wbig);
	km_state_model_free(&m);
}

/*
 * A topic whose partition records carry the zero id (Kafka's "no id") is found by its name only:
 * the zero id is what a request that names its topics carries, and it matches no topic.
 */
static void test_zero_topic_id(void **state)
{
	static const km_uuid zero;
	km_state_mirror mi = {.name = "m1"};
	km_state_key mk = {.type = KM_STATE_REC_MIRROR, .mirror = km_str_c("m1")};
	km_state_key pk = {.type = KM_STATE_REC_PARTITION, .mirror = km_str_c("m1"), .topic = km_str_c("t")};
	km_state_topic tt = {.name = "t", .mirror = &mi};
	km_state_part p = {.state = KM_MP_MIRRORING, .last_mirrored_offset = -1, .last_mirrored_epoch = -1};
	km_state_change chg;
	km_state_model m;
	km_wr w;
	(void)state;

	km_state_model_init(&m);
	km_wr_init(&w);
	assert_int_equal(km_state_mirror_value_encode(&w, &mi), KM_OK);
	rec(&m, &mk, &w, &chg);
	km_wr_free(&w);
	km_wr_init(&w);
	assert_int_equal(km_state_partition_value_encode(&w, &tt, &p), KM_OK);
	rec(&m, &pk, &w, &chg);
	km_wr_free(&w);
	assert_int_equal(km_state_model_index(&m), KM_OK);
	assert_non_null(km_state_model_topic(&m, "t", 1));
	assert_null(km_state_model_topic_id(&m, &zero));
	km_state_model_free(&m);
}

/* A model of mirror m1 with topic t, partitions 0 and 1 in states s0 and s1 (s1 UNKNOWN: no record). */
static void model_with(km_state_model *m, km_mp_state s0, km_mp_state s1)
{
	km_state_cfg_entry cfg[1] = {{.name = "bootstrap.servers", .value = "s:9092"}};
	km_state_mirror mi = {.name = "m1", .cfg = cfg, .ncfg = 1};
	km_state_key mk = {.type = KM_STATE_REC_MIRROR, .mirror = km_str_c("m1")};
	km_state_topic tt = {.name = "t", .mirror = &mi};
	km_state_change chg;
	km_wr w;

	km_state_model_init(m);
	km_wr_init(&w);
	assert_int_equal(km_state_mirror_value_encode(&w, &mi), KM_OK);
	rec(m, &mk, &w, &chg);
	km_wr_free(&w);
	for (int32_t i = 0; i < 2; i++) {
		km_state_key pk = {.type = KM_STATE_REC_PARTITION, .mirror = km_str_c("m1"), .topic = km_str_c("t"),
				   .partition = i};
		km_state_part p = {.state = i ? s1 : s0, .last_mirrored_offset = -1, .last_mirrored_epoch = -1};
		if (p.state == KM_MP_UNKNOWN)
			continue;
		km_wr_init(&w);
		assert_int_equal(km_state_partition_value_encode(&w, &tt, &p), KM_OK);
		rec(m, &pk, &w, &chg);
		km_wr_free(&w);
	}
	assert_int_equal(km_state_model_index(m), KM_OK);
}

typedef struct reload_probe {
	int ready, rereads, changes;
	int changes_at_reread; /* changes told before the last on_reread */
	int32_t partition[4];
	km_mp_state from[4], to[4];
} reload_probe;

static void reload_ready(void *arg)
{
	((reload_probe *)arg)->ready++;
}

static void reload_reread(void *arg)
{
	reload_probe *p = arg;
	p->rereads++;
	p->changes_at_reread = p->changes;
}

static void reload_partition(void *arg, const char *mirror, const char *topic, int32_t partition, km_mp_state from,
			     km_mp_state to)
{
	reload_probe *p = arg;
	assert_string_equal(mirror, "m1");
	assert_string_equal(topic, "t");
	if (p->changes < 4) {
		p->partition[p->changes] = partition;
		p->from[p->changes] = from;
		p->to[p->changes] = to;
	}
	p->changes++;
}

/*
 * A reread after a failed write (part of which may have landed) tells on_partition what changed,
 * so the driver settles a partition the landed part left PREPARING; on_ready fires only once, and
 * on_reread after each reread (the proxy's requests that waited for the store go on from there),
 * once the changes are told.
 */
static void test_reload_tells_changes(void **state)
{
	struct event_base *base = event_base_new();
	km_config cfg;
	km_state_opts o;
	km_state *st;
	km_state_model m;
	reload_probe p = {0};
	char err[256];
	(void)state;

	km_config_init(&cfg);
	/* nothing listens there: the store's own load never completes during the test (the loop is not run) */
	assert_int_equal(km_config_set(&cfg, "upstream", "127.0.0.1:1", err, sizeof(err)), KM_OK);
	memset(&o, 0, sizeof(o));
	o.base = base;
	o.cfg = &cfg;
	o.on_ready = reload_ready;
	o.on_reread = reload_reread;
	o.on_partition = reload_partition;
	o.arg = &p;
	st = km_state_new(&o, err, sizeof(err));
	km_config_free(&cfg);
	assert_non_null(st);

	/* the start-up read: on_ready, no per-partition calls */
	model_with(&m, KM_MP_MIRRORING, KM_MP_UNKNOWN);
	km_state_loaded(st, &m);
	assert_int_equal(p.ready, 1);
	assert_int_equal(p.rereads, 0);
	assert_int_equal(p.changes, 0);
	assert_int_equal(km_state_read_only_topics(st), 1);

	/* a reread: partition 0 is STOPPING now (a stop landed), partition 1 appeared PREPARING */
	model_with(&m, KM_MP_STOPPING, KM_MP_PREPARING);
	km_state_loaded(st, &m);
	assert_int_equal(p.ready, 1);
	assert_int_equal(p.rereads, 1);
	assert_int_equal(p.changes, 2);
	assert_int_equal(p.changes_at_reread, 2);
	assert_int_equal(p.partition[0], 0);
	assert_int_equal(p.from[0], KM_MP_MIRRORING);
	assert_int_equal(p.to[0], KM_MP_STOPPING);
	assert_int_equal(p.partition[1], 1);
	assert_int_equal(p.from[1], KM_MP_UNKNOWN);
	assert_int_equal(p.to[1], KM_MP_PREPARING);

	/* a reread without the mirror: its partitions are gone (UNKNOWN); the same again tells nothing */
	km_state_model_init(&m);
	km_state_loaded(st, &m);
	assert_int_equal(p.changes, 4);
	assert_int_equal(p.to[2], KM_MP_UNKNOWN);
	assert_int_equal(p.to[3], KM_MP_UNKNOWN);
	km_state_model_init(&m);
	km_state_loaded(st, &m);
	assert_int_equal(p.changes, 4);
	assert_int_equal(p.rereads, 3);
	assert_int_equal(p.ready, 1);
	km_state_free(st);
	event_base_loop(base, EVLOOP_NONBLOCK); /* the store's clients are freed at the end of a loop iteration */
	event_base_free(base);
}

typedef struct again_probe {
	km_state *st;
	int answered;
	km_err code[2];
} again_probe;

/* The first answer asks again, as a mirror.name request with a second topic does. */
static void ask_again(void *arg, const km_state_result *res)
{
	again_probe *p = arg;
	static const char *const one[1] = {"t"};
	if (p->answered < 2)
		p->code[p->answered] = res->code;
	if (++p->answered == 1)
		km_state_topics(p->st, KM_TOPIC_STOP, "m1", one, 1, ask_again, p);
}

/* km_state_free answers every pending mutation, those asked from an answer's callback too. */
static void test_free_answers_all(void **state)
{
	struct event_base *base = event_base_new();
	km_config cfg;
	km_state_opts o;
	km_state_model m;
	again_probe p = {0};
	char err[256];
	static const char *const one[1] = {"t"};
	(void)state;

	km_config_init(&cfg);
	assert_int_equal(km_config_set(&cfg, "upstream", "127.0.0.1:1", err, sizeof(err)), KM_OK);
	memset(&o, 0, sizeof(o));
	o.base = base;
	o.cfg = &cfg;
	p.st = km_state_new(&o, err, sizeof(err));
	km_config_free(&cfg);
	assert_non_null(p.st);
	model_with(&m, KM_MP_MIRRORING, KM_MP_UNKNOWN);
	km_state_loaded(p.st, &m);
	/* queued, not run: the loop never turns */
	km_state_topics(p.st, KM_TOPIC_PAUSE, "m1", one, 1, ask_again, &p);
	km_state_free(p.st);
	assert_int_equal(p.answered, 2);
	assert_int_equal(p.code[0], KM_MIRROR_STATE_UNAVAILABLE);
	assert_int_equal(p.code[1], KM_MIRROR_STATE_UNAVAILABLE);
	event_base_loop(base, EVLOOP_NONBLOCK); /* the store's clients are freed at the end of a loop iteration */
	event_base_free(base);
}

/* cleanup.policy lists: compact alone is the only one kept, whatever the spacing. */
static void test_policy(void **state)
{
	static const char *const ok[] = {"compact", " compact ", "compact,", ",compact"};
	static const char *const refused[] = {"delete", "compact,delete", "delete,compact", " compact , delete ", "",
					      ",", "Compact", "compacted", "compact,foo"};
	char msg[1024];
	(void)state;

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
		assert_true(km_state_policy_compacted(ok[i]));
	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++)
		assert_false(km_state_policy_compacted(refused[i]));
	assert_false(km_state_policy_compacted(NULL));

	/* The message names the topic, the policy, why, and the command that fixes it. */
	km_state_policy_message("__mirror_state", "delete", msg, sizeof(msg));
	assert_string_equal(msg, "__mirror_state has cleanup.policy=delete: kmirrord keeps its state there only in a "
				 "compacted topic (delete would expire every mirror after retention.ms); fix it with "
				 "kafka-configs --alter --entity-type topics --entity-name __mirror_state --add-config "
				 "cleanup.policy=compact, or point mirror_state_topic at another topic");
	km_state_policy_message("s", "compact,delete", msg, sizeof(msg));
	assert_non_null(strstr(msg, "s has cleanup.policy=compact,delete: "));
	assert_non_null(strstr(msg, "(its delete part would still expire every mirror after retention.ms)"));
	km_state_policy_message("s", "", msg, sizeof(msg));
	assert_non_null(strstr(msg, "s has cleanup.policy=(empty): "));
	assert_non_null(strstr(msg, "(it is not compacted)"));
}

typedef struct fatal_probe {
	int fatal, ready, answered;
	char message[1024];
	km_err code;
	char answer[512];
} fatal_probe;

static void fatal_seen(void *arg, const char *message)
{
	fatal_probe *p = arg;
	p->fatal++;
	snprintf(p->message, sizeof(p->message), "%s", message);
}

static void fatal_ready(void *arg)
{
	((fatal_probe *)arg)->ready++;
}

static void fatal_answer(void *arg, const km_state_result *res)
{
	fatal_probe *p = arg;
	p->answered++;
	p->code = res->code;
	snprintf(p->answer, sizeof(p->answer), "%s", res->message ? res->message : "");
}

/*
 * The store stopped for good (km_state_fatal, as the policy check does): not ready, on_fatal told
 * once and from the loop (never from inside the call), every mutation then refused with the
 * message rather than "loading; retry", and a later read back does nothing.
 */
static void test_fatal(void **state)
{
	struct event_base *base = event_base_new();
	km_config cfg;
	km_state_opts o;
	km_state *st;
	km_state_model m;
	fatal_probe p = {0};
	char err[256];
	const char *why = "__mirror_state has cleanup.policy=delete: fix it";
	(void)state;

	km_config_init(&cfg);
	assert_int_equal(km_config_set(&cfg, "upstream", "127.0.0.1:1", err, sizeof(err)), KM_OK);
	memset(&o, 0, sizeof(o));
	o.base = base;
	o.cfg = &cfg;
	o.on_ready = fatal_ready;
	o.on_fatal = fatal_seen;
	o.arg = &p;
	st = km_state_new(&o, err, sizeof(err));
	km_config_free(&cfg);
	assert_non_null(st);
	assert_null(km_state_fatal_message(st));

	km_state_fatal(st, why);
	assert_false(km_state_ready(st));
	assert_string_equal(km_state_fatal_message(st), why);
	assert_int_equal(p.fatal, 0); /* not from inside the call */
	km_state_fatal(st, "another reason");
	event_base_loop(base, EVLOOP_NONBLOCK);
	assert_int_equal(p.fatal, 1);
	assert_string_equal(p.message, why);

	km_state_create_mirror(st, "m1", NULL, 0, false, fatal_answer, &p);
	event_base_loop(base, EVLOOP_NONBLOCK);
	assert_int_equal(p.answered, 1);
	assert_int_equal(p.code, KM_MIRROR_STATE_UNAVAILABLE);
	assert_string_equal(p.answer, why);
	assert_int_equal(p.fatal, 1);

	/* A load that finishes anyway, or is asked again, does not make it ready, nor fire on_ready. */
	model_with(&m, KM_MP_MIRRORING, KM_MP_UNKNOWN);
	km_state_loaded(st, &m);
	km_state_persist_load(st->io);
	assert_string_equal(km_state_fatal_message(st), why);
	assert_false(km_state_ready(st));
	assert_int_equal(p.ready, 0);
	km_state_free(st);
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_free(base);
}

/* A run record into m: physical -1 writes its tombstone. */
static void run_rec_flags(km_state_model *m, const char *topic, int32_t partition, int64_t logical, int64_t physical,
			  int64_t prev, uint8_t flags)
{
	km_state_key rk = {.type = KM_STATE_REC_RUN, .mirror = km_str_c("m1"), .topic = km_str_c(topic),
			   .partition = partition, .logical = logical};
	km_state_change chg;
	km_wr w;

	km_wr_init(&w);
	if (physical >= 0)
		assert_int_equal(km_state_run_value_encode(&w, physical, prev, flags), KM_OK);
	rec(m, &rk, physical >= 0 ? &w : NULL, &chg);
	assert_false(chg.changed); /* runs are no state change */
	km_wr_free(&w);
}

static void run_rec(km_state_model *m, const char *topic, int32_t partition, int64_t logical, int64_t physical,
		    int64_t prev)
{
	run_rec_flags(m, topic, partition, logical, physical, prev, 0);
}

/* Record type 2: the key's bytes, the value, and the model's maps from records in any order. */
static void test_run_records(void **state)
{
	km_state_key k = {.type = KM_STATE_REC_RUN, .mirror = km_str_c("m1"), .topic = km_str_c("t"), .partition = 3,
			  .logical = 0x0102030405LL}, d;
	km_state_model m;
	km_state_change chg;
	const km_state_topic *t;
	const km_offmap *map;
	km_wr w;
	(void)state;

	km_wr_init(&w);
	km_state_key_encode(&w, &k);
	/* int16 type 2, then MirrorStateRunKey v0: strings, int32 partition, int64 logical start */
	static const uint8_t want[] = {0, 2, 0, 2, 'm', '1', 0, 1, 't', 0, 0, 0, 3, 0, 0, 0, 1, 2, 3, 4, 5};
	assert_int_equal(w.len, sizeof(want));
	assert_memory_equal(w.buf, want, sizeof(want));
	assert_int_equal(km_state_key_decode(w.buf, w.len, &d), KM_OK);
	assert_int_equal(d.type, KM_STATE_REC_RUN);
	assert_int_equal(d.partition, 3);
	assert_int_equal(d.logical, 0x0102030405LL);
	assert_int_equal(km_state_key_decode(w.buf, w.len - 1, &d), KM_ERR_DECODE);
	w.buf[13] = 0x80; /* a negative logical start */
	assert_int_equal(km_state_key_decode(w.buf, w.len, &d), KM_ERR_DECODE);
	km_wr_free(&w);
	km_wr_init(&w);
	assert_int_equal(km_state_run_value_encode(&w, 7, -1, 0), KM_OK);
	/* version 0, PhysicalStart, PrevLogicalEnd, no tagged fields */
	static const uint8_t wantv[] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0};
	assert_int_equal(w.len, sizeof(wantv));
	assert_memory_equal(w.buf, wantv, sizeof(wantv));
	km_wr_free(&w);
	/* A LogAppendTime run: the flag is tagged field 0 (older readers skip it). */
	km_wr_init(&w);
	assert_int_equal(km_state_run_value_encode(&w, 7, -1, KM_OFFRUN_LOG_APPEND_TIME), KM_OK);
	static const uint8_t wantl[] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
					1, 0, 1, 1};
	assert_int_equal(w.len, sizeof(wantl));
	assert_memory_equal(w.buf, wantl, sizeof(wantl));
	km_wr_free(&w);

	model_with(&m, KM_MP_MIRRORING, KM_MP_UNKNOWN);
	t = km_state_model_topic(&m, "t", 1);
	assert_null(km_state_topic_offmap(t, 0));
	/* runs of a topic the mirror does not hold are dropped (a deleted topic's leftovers) */
	run_rec(&m, "other", 0, 0, 0, -1);
	assert_null(km_state_model_topic(&m, "other", 5));
	/* out of order, as a load reads them; partition 1 has no record of its own yet */
	run_rec(&m, "t", 0, 50, 30, 40);
	run_rec(&m, "t", 0, 0, 0, -1);
	run_rec(&m, "t", 0, 20, 10, 10);
	run_rec(&m, "t", 1, 5, 0, -1);
	map = km_state_topic_offmap(t, 0);
	assert_non_null(map);
	assert_int_equal(map->n, 3);
	assert_int_equal(map->runs[0].logical, 0);
	assert_int_equal(map->runs[1].logical, 20);
	assert_int_equal(map->runs[2].logical, 50);
	assert_int_equal(km_offmap_to_physical(map, 45), 30);
	assert_int_equal(km_state_topic_offmap(t, 1)->n, 1);
	assert_int_equal(km_state_topic_partition_count(t), 1); /* runs make no partition */
	/* a tombstone removes; one for a run not there changes nothing */
	run_rec(&m, "t", 0, 20, -1, -1);
	run_rec(&m, "t", 0, 21, -1, -1);
	assert_int_equal(map->n, 2);
	assert_int_equal(map->runs[1].logical, 50);
	assert_int_equal(km_offmap_find_logical(map, 20), 0); /* run 0 now runs to 50's physical start */
	assert_int_equal(km_offmap_find_logical(map, 30), -1);
	/* malformed values are refused, the map kept: negative physical, prev end past the start, bad version */
	{
		km_state_key rk = {.type = KM_STATE_REC_RUN, .mirror = km_str_c("m1"), .topic = km_str_c("t"),
				   .partition = 0, .logical = 60};
		km_wr kw, vw;
		km_wr_init(&kw);
		km_state_key_encode(&kw, &rk);
		km_wr_init(&vw);
		assert_int_equal(km_state_run_value_encode(&vw, -5, -1, 0), KM_OK);
		assert_int_equal(km_state_model_apply(&m, kw.buf, kw.len, vw.buf, vw.len, false, &chg), KM_ERR_DECODE);
		km_wr_free(&vw);
		km_wr_init(&vw);
		assert_int_equal(km_state_run_value_encode(&vw, 40, 61, 0), KM_OK);
		assert_int_equal(km_state_model_apply(&m, kw.buf, kw.len, vw.buf, vw.len, false, &chg), KM_ERR_DECODE);
		vw.buf[1] = 1;
		assert_int_equal(km_state_model_apply(&m, kw.buf, kw.len, vw.buf, vw.len, false, &chg), KM_ERR_DECODE);
		km_wr_free(&vw);
		km_wr_free(&kw);
		assert_int_equal(map->n, 2);
	}
	assert_int_equal(km_state_model_mirror_runs(km_state_model_mirror(&m, "m1")), 3);
	/* the partition's tombstone takes its map with it (valgrind sees none left) */
	{
		km_state_key pk = {.type = KM_STATE_REC_PARTITION, .mirror = km_str_c("m1"), .topic = km_str_c("t")};
		rec(&m, &pk, NULL, &chg);
	}
	km_state_model_free(&m);
}

typedef struct runs_probe {
	int answered;
	km_err code;
	char message[512];
} runs_probe;

static void runs_done(void *arg, const km_state_result *res)
{
	runs_probe *p = arg;
	p->answered++;
	p->code = res->code;
	snprintf(p->message, sizeof(p->message), "%s", res->message ? res->message : "");
}

/* Ask one runs write and turn the loop until it is answered (refusals never reach the destination). */
static km_err runs_ask(struct event_base *base, km_state *st, const char *mirror, const km_state_run *runs, size_t n,
		       runs_probe *p)
{
	memset(p, 0, sizeof(*p));
	km_state_runs_write(st, mirror, runs, n, runs_done, p);
	for (int i = 0; i < 100 && !p->answered; i++)
		event_base_loop(base, EVLOOP_NONBLOCK);
	assert_int_equal(p->answered, 1);
	return p->code;
}

static km_state *store_unreachable(struct event_base *base)
{
	km_config cfg;
	km_state_opts o;
	km_state *st;
	char err[256];

	km_config_init(&cfg);
	assert_int_equal(km_config_set(&cfg, "upstream", "127.0.0.1:1", err, sizeof(err)), KM_OK);
	memset(&o, 0, sizeof(o));
	o.base = base;
	o.cfg = &cfg;
	st = km_state_new(&o, err, sizeof(err));
	km_config_free(&cfg);
	assert_non_null(st);
	return st;
}

/* km_state_runs_write's validation: every refusal before anything is written, the maps untouched. */
static void test_runs_validation(void **state)
{
	struct event_base *base = event_base_new();
	km_state *st = store_unreachable(base);
	km_state_model m;
	runs_probe p;
	const km_state_topic *t;
	km_state_run ok = {.topic = "t", .partition = 0, .logical = 10, .physical = 0, .prev_logical_end = -1};
	(void)state;

	/* before the load: like every mutation */
	assert_int_equal(runs_ask(base, st, "m1", &ok, 1, &p), KM_KAFKA_COORDINATOR_LOAD_IN_PROGRESS);
	model_with(&m, KM_MP_MIRRORING, KM_MP_UNKNOWN);
	run_rec(&m, "t", 0, 0, 0, -1);
	km_state_loaded(st, &m);
	t = km_state_topic_find(st, "t", 1);
	assert_non_null(t);

	assert_int_equal(runs_ask(base, st, "nope", &ok, 1, &p), KM_MIRROR_UNKNOWN_CLUSTER_MIRROR);
	assert_non_null(strstr(p.message, "nope"));
	{
		km_state_run r[2] = {ok, ok};
		r[1].topic = "u";
		assert_int_equal(runs_ask(base, st, "m1", r, 2, &p), KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION);
		assert_non_null(strstr(p.message, "Topic u is not in cluster mirror 'm1'"));
		r[1] = ok;
		r[1].partition = -1;
		assert_int_equal(runs_ask(base, st, "m1", r, 2, &p), KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION);
		r[1].partition = KM_STATE_MAX_PARTITIONS;
		assert_int_equal(runs_ask(base, st, "m1", r, 2, &p), KM_KAFKA_UNKNOWN_TOPIC_OR_PARTITION);
		r[1] = ok;
		r[1].logical = -1;
		assert_int_equal(runs_ask(base, st, "m1", r, 2, &p), KM_KAFKA_INVALID_REQUEST);
		r[1] = ok;
		r[1].physical = -2;
		assert_int_equal(runs_ask(base, st, "m1", r, 2, &p), KM_KAFKA_INVALID_REQUEST);
		r[1] = ok;
		r[1].prev_logical_end = -2;
		assert_int_equal(runs_ask(base, st, "m1", r, 2, &p), KM_KAFKA_INVALID_REQUEST);
		r[1].prev_logical_end = 11; /* closes the previous run past this one's start */
		assert_int_equal(runs_ask(base, st, "m1", r, 2, &p), KM_KAFKA_INVALID_REQUEST);
		assert_non_null(strstr(p.message, "t-0"));
	}
	{
		size_t n = KM_STATE_MAX_RUNS_WRITE + 1;
		km_state_run *many = calloc(n, sizeof(*many));
		assert_non_null(many);
		for (size_t i = 0; i < n; i++) {
			many[i] = ok;
			many[i].logical = (int64_t)i;
		}
		assert_int_equal(runs_ask(base, st, "m1", many, n, &p), KM_KAFKA_INVALID_REQUEST);
		free(many);
	}
	/* nothing asked, nothing written */
	assert_int_equal(runs_ask(base, st, "m1", NULL, 0, &p), KM_OK);
	/* every refusal left the map as it was loaded */
	assert_int_equal(km_state_topic_offmap(t, 0)->n, 1);
	assert_int_equal(km_state_topic_offmap(t, 0)->runs[0].logical, 0);
	km_state_free(st);
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_free(base);
}

/*
 * The mirror module's handles: km_state_offmap_mut makes a map for a partition of a held topic
 * (only), the tail and the progress figures show in the partition's info, and a reread keeps the
 * map object (the pointer the pipeline holds, its tail) while taking the runs read back.
 */
static void test_offmap_handles(void **state)
{
	struct event_base *base = event_base_new();
	km_state *st = store_unreachable(base);
	km_state_model m;
	km_state_partition_info info;
	const km_state_topic *t;
	km_offmap *map;
	(void)state;

	model_with(&m, KM_MP_MIRRORING, KM_MP_UNKNOWN);
	km_state_loaded(st, &m);
	t = km_state_topic_find(st, "t", 1);
	assert_null(km_state_offmap_mut(st, "u", 0));
	assert_null(km_state_offmap_mut(st, "t", -1));
	assert_null(km_state_topic_offmap(t, 0));
	map = km_state_offmap_mut(st, "t", 0);
	assert_non_null(map);
	assert_ptr_equal(km_state_offmap_mut(st, "t", 0), map);
	assert_ptr_equal(km_state_topic_offmap(t, 0), map);
	assert_int_equal(map->n, 0);
	assert_int_equal(map->tail_logical, -1);

	km_state_topic_partition(t, 0, &info);
	assert_int_equal(info.last_mirrored_offset, -1);
	assert_int_equal(info.skipped_records, 0);
	assert_int_equal(info.source_log_end, -1);
	map->tail_held = true; /* as the pipeline sets it */
	map->tail_physical = 12;
	map->tail_logical = 112;
	km_state_partition_progress(st, "t", 0, 500, 7);
	km_state_partition_progress(st, "t", 0, -1, -1); /* -1 leaves both */
	km_state_partition_progress(st, "nope", 0, 1, 1); /* ignored */
	km_state_topic_partition(t, 0, &info);
	assert_int_equal(info.last_mirrored_offset, 112);
	assert_int_equal(info.source_log_end, 500);
	assert_int_equal(info.skipped_records, 7);

	/* a reread with two runs for partition 0: same object, the tail and the figures kept */
	model_with(&m, KM_MP_MIRRORING, KM_MP_UNKNOWN);
	run_rec(&m, "t", 0, 100, 0, -1);
	run_rec(&m, "t", 0, 105, 3, 103);
	km_state_loaded(st, &m);
	t = km_state_topic_find(st, "t", 1);
	assert_ptr_equal(km_state_topic_offmap(t, 0), map);
	assert_int_equal(map->n, 2);
	assert_int_equal(map->runs[1].physical, 3);
	assert_int_equal(map->tail_logical, 112);
	assert_int_equal(km_offmap_to_logical(map, 4), 106);
	km_state_topic_partition(t, 0, &info);
	assert_int_equal(info.skipped_records, 7);
	assert_int_equal(info.source_log_end, 500);
	assert_int_equal(info.last_mirrored_offset, 112);
	/* the pipeline gone (tail unset): the persisted figure again */
	map->tail_physical = map->tail_logical = -1;
	km_state_topic_partition(t, 0, &info);
	assert_int_equal(info.last_mirrored_offset, -1);
	km_state_free(st);
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_free(base);
}

/*
 * Partition 0 of t in state s with a persisted last mirrored offset (epoch 4), the start of the
 * transaction then open (-1: none), and runs (100 -> 0, 105 -> 3 closing at 103).
 */
static void model_progress_open(km_state_model *m, km_mp_state s, int64_t last, int64_t open)
{
	km_state_cfg_entry cfg[1] = {{.name = "bootstrap.servers", .value = "s:9092"}};
	km_state_mirror mi = {.name = "m1", .cfg = cfg, .ncfg = 1};
	km_state_topic tt = {.name = "t", .mirror = &mi};
	km_state_key pk = {.type = KM_STATE_REC_PARTITION, .mirror = km_str_c("m1"), .topic = km_str_c("t")};
	km_state_part p = {.state = s, .last_mirrored_offset = last, .last_mirrored_epoch = 4,
			   .has_open_txn = open >= 0, .open_txn_offset = open};
	km_state_change chg;
	km_wr w;

	model_with(m, s, KM_MP_UNKNOWN);
	km_wr_init(&w);
	assert_int_equal(km_state_partition_value_encode(&w, &tt, &p), KM_OK);
	rec(m, &pk, &w, &chg);
	km_wr_free(&w);
	run_rec(m, "t", 0, 100, 0, -1);
	run_rec(m, "t", 0, 105, 3, 103);
	assert_int_equal(km_state_model_index(m), KM_OK);
}

static void model_progress(km_state_model *m, km_mp_state s, int64_t last)
{
	model_progress_open(m, s, last, -1);
}

/*
 * What a reader is shown where no local pipeline holds the tail: the open run ends at the persisted
 * progress (a batch past it, the pipeline's next or anyone's, stays hidden); a STOPPED partition has
 * no bound (local writes continue it); a tail the pipeline holds is left alone, and once released
 * the progress bounds it again.
 */
static void test_progress_bounds_readers(void **state)
{
	struct event_base *base = event_base_new();
	km_state *st = store_unreachable(base);
	km_state_model m;
	const km_offmap *map;
	km_offmap *mut;
	(void)state;

	model_progress(&m, KM_MP_MIRRORING, 107);
	km_state_loaded(st, &m);
	map = km_state_topic_offmap(km_state_topic_find(st, "t", 1), 0);
	assert_non_null(map);
	assert_int_equal(map->tail_logical, 107);
	assert_int_equal(map->tail_physical, 5);
	assert_int_equal(km_offmap_to_logical(map, 4), 106);   /* mirrored: shown */
	assert_int_equal(km_offmap_next_to_logical(map, 9), 107); /* a high watermark past it: the progress */
	assert_int_equal(km_offmap_to_logical(map, 5), 107);   /* past it: hidden */
	assert_int_equal(km_offmap_to_physical(map, 200), 5);  /* a reader ahead waits at it */

	/* The pipeline here holds its own tail: a reread leaves it. */
	mut = km_state_offmap_mut(st, "t", 0);
	mut->tail_held = true;
	mut->tail_physical = 8;
	mut->tail_logical = 110;
	model_progress(&m, KM_MP_MIRRORING, 107);
	km_state_loaded(st, &m);
	assert_int_equal(map->tail_logical, 110);
	/* Released: the progress again. */
	km_state_offmap_release(st, "t", 0);
	assert_false(map->tail_held);
	assert_int_equal(map->tail_logical, 107);

	/* STOPPED: no bound, the destination's writes after the stop continue the offsets. */
	model_progress(&m, KM_MP_STOPPED, 107);
	km_state_loaded(st, &m);
	assert_int_equal(map->tail_logical, -1);
	assert_int_equal(km_offmap_to_logical(map, 9), 111);
	/* No progress persisted (a state written before progress was): no bound either. */
	model_progress(&m, KM_MP_MIRRORING, -1);
	km_state_loaded(st, &m);
	assert_int_equal(map->tail_logical, -1);
	km_state_free(st);
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_free(base);
}

/*
 * What another instance shows stops where something may still be taken back (docs/state.md, "What
 * a reader is shown"). The runner's earliest open destination transaction, persisted with its
 * progress: a fence may abort it and mirror it again, so a reader shown past it (an abort marker
 * moving the last stable offset) would find those offsets gone and ask out of range. A fence run,
 * written before the abort: the progress persisted earlier lies past it, and mapped through the
 * fence run's physical start (a lower bound: the log's end then) it would point past the log.
 */
static void test_open_transaction_bounds_readers(void **state)
{
	struct event_base *base = event_base_new();
	km_state *st = store_unreachable(base);
	km_state_model m;
	const km_offmap *map;
	(void)state;

	/* Progress 110 (physical 8), a transaction open from 107 (physical 5), through the record: shown up to 107. */
	model_progress_open(&m, KM_MP_MIRRORING, 110, 107);
	km_state_loaded(st, &m);
	map = km_state_topic_offmap(km_state_topic_find(st, "t", 1), 0);
	assert_non_null(map);
	assert_int_equal(map->tail_logical, 107);
	assert_int_equal(map->tail_physical, 5);
	assert_int_equal(map->tail_epoch, -1); /* the batch before 107 is not the one progress names */
	assert_int_equal(km_offmap_next_to_logical(map, 9), 107); /* the abort marker's LSO: still 107 */
	assert_int_equal(km_offmap_to_logical(map, 6), 107);      /* the open transaction's records: hidden */
	assert_int_equal(km_offmap_to_physical(map, 109), 5);     /* a reader asks at the transaction's start */
	/* A transaction that starts past the progress bounds nothing: the progress does, with its epoch. */
	model_progress_open(&m, KM_MP_MIRRORING, 110, 112);
	km_state_loaded(st, &m);
	assert_int_equal(map->tail_logical, 110);
	assert_int_equal(map->tail_physical, 8);
	assert_int_equal(map->tail_epoch, 4);

	/*
	 * A fence run at 107 (physical 12, the log's end when it was written): progress 110 would map to
	 * physical 15, past that end. The tail is the fence run's start.
	 */
	model_progress_open(&m, KM_MP_MIRRORING, 110, -1);
	run_rec_flags(&m, "t", 0, 107, 12, 107, KM_OFFRUN_FENCE);
	assert_int_equal(km_state_model_index(&m), KM_OK);
	km_state_loaded(st, &m);
	assert_int_equal(map->tail_logical, 107);
	assert_int_equal(map->tail_physical, 12);
	assert_int_equal(km_offmap_to_physical(map, 109), 12); /* a reader past it waits at the log's end */
	assert_int_equal(km_offmap_next_to_logical(map, 14), 107);
	km_state_free(st);
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_free(base);
}

/* Partition 0 of t in m: its record (progress figures last, open), written as this kmirrord writes it. */
static void part_rec_started(km_state_model *m, km_mp_state s, int64_t changed_ms, int64_t last, bool apart,
			     int64_t started);

static void part_rec_at(km_state_model *m, km_mp_state s, int64_t changed_ms, int64_t last, bool apart)
{
	part_rec_started(m, s, changed_ms, last, apart, 0);
}

/* As part_rec_at, the partition last started at started (StartedTimeMs). */
static void part_rec_started(km_state_model *m, km_mp_state s, int64_t changed_ms, int64_t last, bool apart,
			     int64_t started)
{
	km_state_cfg_entry cfg[1] = {{.name = "bootstrap.servers", .value = "s:9092"}};
	km_state_mirror mi = {.name = "m1", .cfg = cfg, .ncfg = 1};
	km_state_topic tt = {.name = "t", .mirror = &mi, .id = {{7}}};
	km_state_key pk = {.type = KM_STATE_REC_PARTITION, .mirror = km_str_c("m1"), .topic = km_str_c("t")};
	km_state_part p = {.state = s, .state_change_ms = changed_ms, .last_mirrored_offset = last,
			   .last_mirrored_epoch = 4, .open_txn_offset = -1, .started_ms = started};
	km_mirror_state_partition_value v;
	km_state_change chg;
	km_arena a;
	km_wr w;
	km_rd r;
	int16_t ver;

	km_wr_init(&w);
	assert_int_equal(km_state_partition_value_encode(&w, &tt, &p), KM_OK);
	if (!apart) {
		/* As an older kmirrord writes it: without ProgressApart. */
		km_arena_init(&a, 4096);
		km_rd_init(&r, w.buf, w.len);
		assert_true(km_rd_i16(&r, "Version", &ver));
		km_mirror_state_partition_value_init(&v);
		assert_int_equal(km_mirror_state_partition_value_decode(&r, 0, &v, &a), KM_OK);
		assert_true(v.progress_apart);
		v.progress_apart = false;
		w.len = 0;
		km_wr_i16(&w, 0);
		km_mirror_state_partition_value_encode(&w, 0, &v);
		km_arena_free(&a);
	}
	rec(m, &pk, &w, &chg);
	km_wr_free(&w);
}

/* Partition 0 of t in m: a pipeline's progress record, under a partition record changed at changed_ms. */
static void progress_rec_at(km_state_model *m, int64_t changed_ms, int64_t last, int64_t open)
{
	km_state_cfg_entry cfg[1] = {{.name = "bootstrap.servers", .value = "s:9092"}};
	km_state_mirror mi = {.name = "m1", .cfg = cfg, .ncfg = 1};
	km_state_topic tt = {.name = "t", .mirror = &mi, .id = {{7}}};
	km_state_key gk = {.type = KM_STATE_REC_PROGRESS, .mirror = km_str_c("m1"), .topic = km_str_c("t")};
	km_state_part p = {.rec.state_change_ms = changed_ms};
	km_state_change chg;
	km_wr w;

	km_wr_init(&w);
	assert_int_equal(km_state_progress_value_encode(&w, &tt, &p, last, 5, open), KM_OK);
	rec(m, &gk, &w, &chg);
	assert_false(chg.changed); /* progress is no state change */
	km_wr_free(&w);
}

static const km_state_part *part0(km_state_model *m)
{
	km_state_topic *t = km_state_model_topic(m, "t", 1);
	assert_non_null(t);
	return &t->parts[0];
}

/* Partition 0 of t in m: its writer record (type 5) under the start of started; pid -1: its tombstone. */
static void writer_rec_of(km_state_model *m, int64_t started, int64_t pid, int64_t start)
{
	km_state_cfg_entry cfg[1] = {{.name = "bootstrap.servers", .value = "s:9092"}};
	km_state_mirror mi = {.name = "m1", .cfg = cfg, .ncfg = 1};
	km_state_topic tt = {.name = "t", .mirror = &mi, .id = {{7}}};
	km_state_key gk = {.type = KM_STATE_REC_WRITER, .mirror = km_str_c("m1"), .topic = km_str_c("t")};
	km_state_change chg;
	km_wr w;

	km_wr_init(&w);
	if (pid >= 0)
		assert_int_equal(km_state_writer_value_encode(&w, &tt, started, pid, 3, start), KM_OK);
	rec(m, &gk, pid >= 0 ? &w : NULL, &chg);
	assert_false(chg.changed);
	km_wr_free(&w);
}

/* The same under the start of the partition record that stands. */
static void writer_rec(km_state_model *m, int64_t pid, int64_t start)
{
	writer_rec_of(m, part0(m)->started_ms, pid, start);
}

/* Partition 0 of t in m: the runner's settle to s at settled_ms (a progress record) under a partition record changed at changed_ms. */
static void settle_rec_at(km_state_model *m, int64_t changed_ms, km_mp_state s, int64_t settled_ms)
{
	km_state_cfg_entry cfg[1] = {{.name = "bootstrap.servers", .value = "s:9092"}};
	km_state_mirror mi = {.name = "m1", .cfg = cfg, .ncfg = 1};
	km_state_topic tt = {.name = "t", .mirror = &mi, .id = {{7}}};
	km_state_key gk = {.type = KM_STATE_REC_PROGRESS, .mirror = km_str_c("m1"), .topic = km_str_c("t")};
	km_state_part p = {.rec.state_change_ms = changed_ms, .state = s, .state_change_ms = settled_ms};
	km_state_change chg;
	km_wr w;

	km_wr_init(&w);
	assert_int_equal(km_state_progress_value_encode(&w, &tt, &p, 60, 4, -1), KM_OK);
	rec(m, &gk, &w, &chg);
	km_wr_free(&w);
}

/*
 * The same race with the runner's settle (PREPARING -> MIRRORING) and a stop through another
 * kmirrord that landed first: the settle goes in the runner's record, under the partition record it
 * was made from, so the stop stands in either order; the runner's settle under the stop's record
 * (STOPPED) stands over it.
 */
static void test_runner_settle_keeps_a_stop(void **state)
{
	km_state_model m;
	(void)state;

	for (int order = 0; order < 2; order++) {
		model_with(&m, KM_MP_PREPARING, KM_MP_UNKNOWN);
		part_rec_at(&m, KM_MP_PREPARING, 1000, 50, true);
		if (order == 0) {
			part_rec_at(&m, KM_MP_STOPPING, 2000, 60, true);
			settle_rec_at(&m, 1000, KM_MP_MIRRORING, 1500);
		} else {
			settle_rec_at(&m, 1000, KM_MP_MIRRORING, 1500);
			assert_int_equal(part0(&m)->state, KM_MP_MIRRORING);
			assert_int_equal(part0(&m)->state_change_ms, 1500);
			part_rec_at(&m, KM_MP_STOPPING, 2000, 60, true);
		}
		assert_int_equal(part0(&m)->state, KM_MP_STOPPING);
		assert_int_equal(part0(&m)->state_change_ms, 2000);
		settle_rec_at(&m, 2000, KM_MP_STOPPED, 2500);
		assert_int_equal(part0(&m)->state, KM_MP_STOPPED);
		assert_int_equal(part0(&m)->state_change_ms, 2500);
		km_state_model_free(&m);
	}
}

/* A runner's record value of t's partition 0 under the partition record of changed_ms, at offset last. */
static void progress_value(km_wr *w, int64_t changed_ms, int64_t last, uint8_t topic)
{
	km_state_cfg_entry cfg[1] = {{.name = "bootstrap.servers", .value = "s:9092"}};
	km_state_mirror mi = {.name = "m1", .cfg = cfg, .ncfg = 1};
	km_state_topic tt = {.name = "t", .mirror = &mi, .id = {{topic}}};
	km_state_part p = {.rec.state_change_ms = changed_ms, .state = KM_MP_STOPPED, .state_change_ms = changed_ms + 1};

	km_wr_init(w);
	assert_int_equal(km_state_progress_value_encode(w, &tt, &p, last, 4, -1), KM_OK);
}

/*
 * Finding 29: the former owner's runner's record, written under the start (its view: MIRRORING,
 * 3800) and held in a cut link, arrived after the new owner had settled the stop (STOPPED at 3900,
 * under the stop's partition record). Last for its key, it replaced the new owner's record and the
 * settle with it: the partition was STOPPING again at the partition record's figures, and the new
 * owner settled it there, below where the mirror stood. A runner's record under an earlier
 * partition record than the one kept (of the same topic) does not replace it.
 */
/* Sync group records (type 6): one per configured group, the last one kept, a tombstone back to the group itself. */
static void test_sync_group_records(void **state)
{
	km_state_sync_group g = {.base = "__kmirror-sync", .generation = 1, .group = "__kmirror-sync.1",
				 .moved_ms = 1234, .moved_by = "h@127.0.0.1:8080", .reason = "GROUP_ID_NOT_FOUND"};
	km_state_key k = {.type = KM_STATE_REC_SYNC_GROUP, .group = km_str_c("__kmirror-sync")};
	km_state_key other = {.type = KM_STATE_REC_SYNC_GROUP, .group = km_str_c("other")};
	const km_state_sync_group *got;
	km_state_change chg;
	km_state_model m;
	km_state_key dk;
	km_wr w, kw;

	(void)state;
	km_state_model_init(&m);
	assert_null(km_state_model_sync_group(&m, "__kmirror-sync"));
	km_wr_init(&w);
	assert_int_equal(km_state_sync_group_value_encode(&w, &g), KM_OK);
	rec(&m, &k, &w, &chg);
	assert_false(chg.changed);
	km_wr_free(&w);
	got = km_state_model_sync_group(&m, "__kmirror-sync");
	assert_non_null(got);
	assert_int_equal(got->generation, 1);
	assert_string_equal(got->group, "__kmirror-sync.1");
	assert_int_equal(got->moved_ms, 1234);
	assert_string_equal(got->moved_by, "h@127.0.0.1:8080");
	assert_string_equal(got->reason, "GROUP_ID_NOT_FOUND");
	assert_null(km_state_model_sync_group(&m, "other"));
	/* A later move replaces it; another configured group's record stands apart. */
	g.generation = 3;
	g.group = "__kmirror-sync.3";
	km_wr_init(&w);
	assert_int_equal(km_state_sync_group_value_encode(&w, &g), KM_OK);
	rec(&m, &k, &w, &chg);
	km_wr_free(&w);
	g.group = "other.3";
	km_wr_init(&w);
	assert_int_equal(km_state_sync_group_value_encode(&w, &g), KM_OK);
	rec(&m, &other, &w, &chg);
	km_wr_free(&w);
	assert_int_equal(m.nsync_groups, 2);
	assert_string_equal(km_state_model_sync_group(&m, "__kmirror-sync")->group, "__kmirror-sync.3");
	/* The key round-trips; an empty group name is refused. */
	km_wr_init(&kw);
	km_state_key_encode(&kw, &k);
	assert_int_equal(km_state_key_decode(kw.buf, kw.len, &dk), KM_OK);
	assert_int_equal(dk.type, KM_STATE_REC_SYNC_GROUP);
	assert_true(km_str_eq_c(dk.group, "__kmirror-sync"));
	km_wr_free(&kw);
	/* A group that is not the base's generation is refused: empty, another base's, another generation's. */
	{
		const char *bad[] = {"", "other.3", "__kmirror-sync.2", "__kmirror-sync", "__kmirror-sync.3x"};
		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			g.group = (char *)bad[i];
			km_wr_init(&w);
			assert_int_equal(km_state_sync_group_value_encode(&w, &g), KM_OK);
			km_wr_init(&kw);
			km_state_key_encode(&kw, &k);
			assert_int_equal(km_state_model_apply(&m, kw.buf, kw.len, w.buf, w.len, false, &chg), KM_ERR_DECODE);
			km_wr_free(&kw);
			km_wr_free(&w);
		}
	}
	assert_string_equal(km_state_model_sync_group(&m, "__kmirror-sync")->group, "__kmirror-sync.3");
	/* The names of a base's generations, and which names are one of them (never synced). */
	{
		char name[64];
		assert_int_equal(km_state_sync_group_name(km_str_c("g"), 0, name, sizeof(name)), 1);
		assert_string_equal(name, "g");
		assert_int_equal(km_state_sync_group_name(km_str_c("g"), 12, name, sizeof(name)), 4);
		assert_string_equal(name, "g.12");
		assert_int_equal(km_state_sync_group_name(km_str_c("g"), 12, name, 4), -1);
		assert_true(km_state_is_sync_group("__kmirror-sync", "__kmirror-sync"));
		assert_true(km_state_is_sync_group("__kmirror-sync", "__kmirror-sync.3"));
		assert_false(km_state_is_sync_group("__kmirror-sync", "__kmirror-sync."));
		assert_false(km_state_is_sync_group("__kmirror-sync", "__kmirror-sync.3x"));
		assert_false(km_state_is_sync_group("__kmirror-sync", "__kmirror-syncx"));
		assert_false(km_state_is_sync_group("__kmirror-sync", "__kmirror-syn"));
	}
	rec(&m, &k, NULL, &chg);
	assert_null(km_state_model_sync_group(&m, "__kmirror-sync"));
	assert_non_null(km_state_model_sync_group(&m, "other"));
	km_state_model_free(&m);
}

static void test_stale_runner_record_is_not_kept(void **state)
{
	km_wr cur, late, next, other;
	(void)state;

	progress_value(&cur, 2000, 3900, 7);   /* the new owner's, under the stop */
	progress_value(&late, 1000, 3800, 7);  /* the former owner's, under the start */
	progress_value(&next, 3000, 3900, 7);  /* a later change's */
	progress_value(&other, 1000, 10, 8);   /* a topic of the same name created again */
	assert_true(km_state_progress_stale(cur.buf, cur.len, late.buf, late.len));
	assert_false(km_state_progress_stale(cur.buf, cur.len, next.buf, next.len));
	assert_false(km_state_progress_stale(cur.buf, cur.len, cur.buf, cur.len));
	assert_false(km_state_progress_stale(late.buf, late.len, cur.buf, cur.len));
	assert_false(km_state_progress_stale(cur.buf, cur.len, other.buf, other.len));
	assert_false(km_state_progress_stale(NULL, 0, late.buf, late.len));
	km_wr_free(&cur);
	km_wr_free(&late);
	km_wr_free(&next);
	km_wr_free(&other);
}

/*
 * The soak's finding 24: the runner persisted its writer by rewriting the partition record from
 * its view (MIRRORING) while a stop through another kmirrord landed first: applied after it, the
 * rewrite put the partition back to MIRRORING, and the stop, answered, was lost. The writer now goes
 * in the progress record, which only the runner writes: the stop stands, and so does the writer,
 * in either order of the two records (they sit in different partitions of the state topic, and a
 * compacted topic keeps only the last of each key).
 */
static void test_writer_apart_keeps_a_stop(void **state)
{
	km_state_model m;
	(void)state;

	for (int order = 0; order < 2; order++) {
		model_with(&m, KM_MP_MIRRORING, KM_MP_UNKNOWN);
		part_rec_at(&m, KM_MP_MIRRORING, 1000, 50, true);
		if (order == 0) {
			part_rec_at(&m, KM_MP_STOPPING, 2000, 60, true); /* the stop, through another kmirrord */
			writer_rec(&m, 42, 70);                  /* the writer, from the view before it */
		} else {
			writer_rec(&m, 42, 70);
			part_rec_at(&m, KM_MP_STOPPING, 2000, 60, true);
		}
		assert_int_equal(part0(&m)->state, KM_MP_STOPPING);
		assert_int_equal(part0(&m)->last_mirrored_offset, 60);
		assert_true(part0(&m)->has_writer);
		assert_int_equal(part0(&m)->writer_pid, 42);
		assert_int_equal(part0(&m)->writer_start, 70);
		km_state_model_free(&m);
	}
	/* A start after the stop writes both records again, without a writer: the old one stands no more. */
	model_with(&m, KM_MP_MIRRORING, KM_MP_UNKNOWN);
	part_rec_at(&m, KM_MP_STOPPED, 2000, 60, true);
	writer_rec(&m, 42, 70);
	assert_true(part0(&m)->has_writer);
	part_rec_started(&m, KM_MP_PREPARING, 3000, 60, true, 3000);
	/* The start's partition record read before the writer record's tombstone (another state partition). */
	assert_int_equal(part0(&m)->state, KM_MP_PREPARING);
	assert_false(part0(&m)->has_writer);
	progress_rec_at(&m, 3000, 60, -1);
	writer_rec(&m, -1, -1);
	assert_false(part0(&m)->has_writer);
	writer_rec(&m, 43, 80); /* this start's writer */
	assert_true(part0(&m)->has_writer);
	assert_int_equal(part0(&m)->writer_pid, 43);
	part_rec_started(&m, KM_MP_STOPPING, 4000, 90, true, 3000); /* a stop keeps it */
	assert_int_equal(part0(&m)->writer_pid, 43);
	km_state_model_free(&m);
	/*
	 * The hour run's case: a progress written on a view with an older writer (a former owner's,
	 * landed late) after the new writer's record: the progress record holds no writer, so the new
	 * one stands.
	 */
	model_with(&m, KM_MP_MIRRORING, KM_MP_UNKNOWN);
	part_rec_at(&m, KM_MP_MIRRORING, 1000, 50, true);
	writer_rec(&m, 42, 9156);
	progress_rec_at(&m, 1000, 9384, -1);
	assert_true(part0(&m)->has_writer);
	assert_int_equal(part0(&m)->writer_start, 9156);
	km_state_model_free(&m);
	/* A partition record with its own writer and no writer in the progress (an older kmirrord): its own. */
	model_with(&m, KM_MP_MIRRORING, KM_MP_UNKNOWN);
	part_rec_at(&m, KM_MP_MIRRORING, 1000, 50, true);
	progress_rec_at(&m, 1000, 80, -1);
	assert_false(part0(&m)->has_writer);
	km_state_model_free(&m);
}

/*
 * The pipeline's progress in a record of its own (finding 11): it stands for the partition record's
 * figures while it was written under that record (the same state change time, the same topic id),
 * whichever of the two is read first; a progress written on a view that had not seen a stop does not
 * undo the stop, and stands for nothing under it; a partition record of an older kmirrord (no
 * ProgressApart) keeps its own figures.
 */
static void test_progress_apart(void **state)
{
	km_state_key gk = {.type = KM_STATE_REC_PROGRESS, .mirror = km_str_c("m1"), .topic = km_str_c("t"),
			   .partition = 3};
	km_state_key back;
	km_state_model m;
	km_wr w;
	uint8_t *kb;
	size_t kl;
	(void)state;

	/* The key: type 4, and back. */
	km_wr_init(&w);
	km_state_key_encode(&w, &gk);
	kb = km_wr_take(&w, &kl);
	assert_int_equal(km_state_key_decode(kb, kl, &back), KM_OK);
	assert_int_equal(back.type, KM_STATE_REC_PROGRESS);
	assert_int_equal(back.partition, 3);
	assert_int_equal(back.topic.len, 1);
	free(kb);

	/* MIRRORING since 1000, progress 50 in the record; the pipeline's progress 80 under it stands. */
	model_with(&m, KM_MP_MIRRORING, KM_MP_UNKNOWN);
	part_rec_at(&m, KM_MP_MIRRORING, 1000, 50, true);
	progress_rec_at(&m, 1000, 80, 70);
	assert_int_equal(part0(&m)->last_mirrored_offset, 80);
	assert_int_equal(part0(&m)->last_mirrored_epoch, 5);
	assert_true(part0(&m)->has_open_txn);
	assert_int_equal(part0(&m)->open_txn_offset, 70);
	/* A stop through another kmirrord (changed at 2000, its view at 60): the owner's next progress, on its old view, changes nothing. */
	part_rec_at(&m, KM_MP_STOPPING, 2000, 60, true);
	assert_int_equal(part0(&m)->state, KM_MP_STOPPING);
	assert_int_equal(part0(&m)->last_mirrored_offset, 60);
	assert_false(part0(&m)->has_open_txn);
	progress_rec_at(&m, 1000, 90, -1);
	assert_int_equal(part0(&m)->state, KM_MP_STOPPING);
	assert_int_equal(part0(&m)->last_mirrored_offset, 60);
	/* Once the owner has seen the stop, its progress stands again. */
	progress_rec_at(&m, 2000, 95, -1);
	assert_int_equal(part0(&m)->last_mirrored_offset, 95);
	km_state_model_free(&m);

	/* Read the other way round (a rebuild: the two sit in different state partitions): the same. */
	model_with(&m, KM_MP_MIRRORING, KM_MP_UNKNOWN);
	part_rec_at(&m, KM_MP_STOPPING, 2000, 60, true);
	progress_rec_at(&m, 1000, 90, -1);
	assert_int_equal(part0(&m)->last_mirrored_offset, 60);
	km_state_model_free(&m);

	/* A record an older kmirrord wrote (no ProgressApart): its own figures stand. */
	model_with(&m, KM_MP_MIRRORING, KM_MP_UNKNOWN);
	part_rec_at(&m, KM_MP_MIRRORING, 1000, 50, false);
	progress_rec_at(&m, 1000, 80, -1);
	assert_int_equal(part0(&m)->last_mirrored_offset, 50);
	/* Written again by this kmirrord: the progress stands. */
	part_rec_at(&m, KM_MP_MIRRORING, 1000, 50, true);
	assert_int_equal(part0(&m)->last_mirrored_offset, 80);
	km_state_model_free(&m);
}

/*
 * Another kmirrord's progress read before the run it needs (finding 19): the runner's map had a run
 * at logical 60 (physical 59: the source's 59, a marker the mirror does not carry, is a hole) when
 * it wrote progress 80, and the run sits in another partition of the state topic. A reader here,
 * without that run, would be shown physical 59 on as logical 59 on: each record one offset early.
 * Nothing past 59 is shown until the run is in; then the progress.
 */
static void test_progress_waits_for_its_run(void **state)
{
	struct event_base *base = event_base_new();
	km_state *st = store_unreachable(base);
	km_state_cfg_entry cfg[1] = {{.name = "bootstrap.servers", .value = "s:9092"}};
	km_state_mirror mi = {.name = "m1", .cfg = cfg, .ncfg = 1};
	km_state_topic tt = {.name = "t", .mirror = &mi, .id = {{7}}};
	km_state_key gk = {.type = KM_STATE_REC_PROGRESS, .mirror = km_str_c("m1"), .topic = km_str_c("t")};
	km_offrun runs[2] = {{0, 0, -1, 0}, {60, 59, 59, 0}};
	km_offmap runner = {runs, 2, 2, -1, -1};
	km_state_part rp = {.rec.state_change_ms = 1000, .map = &runner};
	const km_offmap *map;
	km_state_model m;
	km_state_change chg;
	km_wr w;
	(void)state;

	model_with(&m, KM_MP_MIRRORING, KM_MP_UNKNOWN);
	part_rec_at(&m, KM_MP_MIRRORING, 1000, 50, true);
	run_rec(&m, "t", 0, 0, 0, -1);
	km_wr_init(&w);
	assert_int_equal(km_state_progress_value_encode(&w, &tt, &rp, 80, 5, -1), KM_OK);
	rec(&m, &gk, &w, &chg);
	km_wr_free(&w);
	assert_int_equal(km_state_model_index(&m), KM_OK);
	km_state_loaded(st, &m);
	map = km_state_topic_offmap(km_state_topic_find(st, "t", 1), 0);
	assert_non_null(map);
	assert_int_equal(map->tail_logical, 59);
	assert_int_equal(map->tail_physical, 59);
	assert_int_equal(km_offmap_to_logical(map, 58), 58); /* before the missing run: shown */
	assert_int_equal(km_offmap_to_logical(map, 59), 59); /* the source's 60: hidden, at the tail */

	/* The run comes in: the progress stands whole, each record at its offset. */
	model_with(&m, KM_MP_MIRRORING, KM_MP_UNKNOWN);
	part_rec_at(&m, KM_MP_MIRRORING, 1000, 50, true);
	run_rec(&m, "t", 0, 0, 0, -1);
	run_rec(&m, "t", 0, 60, 59, 59);
	km_wr_init(&w);
	assert_int_equal(km_state_progress_value_encode(&w, &tt, &rp, 80, 5, -1), KM_OK);
	rec(&m, &gk, &w, &chg);
	km_wr_free(&w);
	assert_int_equal(km_state_model_index(&m), KM_OK);
	km_state_loaded(st, &m);
	assert_int_equal(map->tail_logical, 80);
	assert_int_equal(map->tail_physical, 79);
	assert_int_equal(km_offmap_to_logical(map, 59), 60);

	/* The same through a transition the runner wrote (PAUSED at 80: the partition record's figures stand). */
	{
		km_state_key pk = {.type = KM_STATE_REC_PARTITION, .mirror = km_str_c("m1"), .topic = km_str_c("t")};
		km_state_part pp = {.state = KM_MP_PAUSED, .state_change_ms = 3000, .last_mirrored_offset = 80,
				    .last_mirrored_epoch = 4, .open_txn_offset = -1, .map = &runner};
		for (int with_run = 0; with_run < 2; with_run++) {
			model_with(&m, KM_MP_PAUSED, KM_MP_UNKNOWN);
			run_rec(&m, "t", 0, 0, 0, -1);
			if (with_run)
				run_rec(&m, "t", 0, 60, 59, 59);
			km_wr_init(&w);
			assert_int_equal(km_state_partition_value_encode(&w, &tt, &pp), KM_OK);
			rec(&m, &pk, &w, &chg);
			km_wr_free(&w);
			assert_int_equal(km_state_model_index(&m), KM_OK);
			km_state_loaded(st, &m);
			assert_int_equal(map->tail_logical, with_run ? 80 : 59);
			assert_int_equal(map->tail_physical, with_run ? 79 : 59);
		}
	}
	km_state_free(st);
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_free(base);
}

static uint64_t owns_none(void *arg, const char *mirror)
{
	(*(int *)arg)++;
	return strcmp(mirror, "m1") != 0;
}

/*
 * A pipeline's writes (runs, progress, transitions) are made only while this kmirrord runs the
 * mirror: asked when the write is about to go, refused with a message (a stale owner's queued
 * write), nothing sent. Other writes (a start, a create) are not asked about.
 */
static void test_owner_check(void **state)
{
	struct event_base *base = event_base_new();
	km_state *st = store_unreachable(base);
	km_state_model m;
	runs_probe p;
	km_state_run r = {.topic = "t", .partition = 0, .logical = 10, .physical = 0, .prev_logical_end = -1};
	km_state_progress g = {"t", 0, 12, -1, -1};
	int asked = 0;
	(void)state;

	model_with(&m, KM_MP_MIRRORING, KM_MP_UNKNOWN);
	km_state_loaded(st, &m);
	km_state_owner_check(st, owns_none, &asked);
	assert_int_equal(runs_ask(base, st, "m1", &r, 1, &p), KM_MIRROR_STATE_UNAVAILABLE);
	assert_non_null(strstr(p.message, "no longer runs mirror 'm1'"));
	memset(&p, 0, sizeof(p));
	km_state_progress_write(st, "m1", &g, 1, runs_done, &p);
	for (int i = 0; i < 100 && !p.answered; i++)
		event_base_loop(base, EVLOOP_NONBLOCK);
	assert_int_equal(p.code, KM_MIRROR_STATE_UNAVAILABLE);
	memset(&p, 0, sizeof(p));
	km_state_partition_set(st, "m1", "t", 0, KM_MP_FAILED, "x", runs_done, &p);
	for (int i = 0; i < 100 && !p.answered; i++)
		event_base_loop(base, EVLOOP_NONBLOCK);
	assert_int_equal(p.code, KM_MIRROR_STATE_UNAVAILABLE);
	assert_int_equal(asked, 6); /* each: when asked for (its term), and when about to go */
	assert_int_equal(km_state_topic_state(km_state_topic_find(st, "t", 1)), KM_MP_MIRRORING);
	/* Another mirror's write is asked about too, and goes on (to the unreachable destination here). */
	assert_int_equal(runs_ask(base, st, "m2", &r, 1, &p), KM_MIRROR_UNKNOWN_CLUSTER_MIRROR);
	assert_int_equal(asked, 8);
	km_state_free(st);
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_free(base);
}

static uint64_t term_now(void *arg, const char *mirror)
{
	(void)mirror;
	return *(uint64_t *)arg;
}

/*
 * A pipeline's write is made only in the ownership term it was asked in: one asked before this
 * kmirrord lost the mirror and took it again is dropped even though it runs the mirror now (a
 * former life's writer record landing after the new life's reconcile read the writer:
 * docs/reliability.md, finding 37). The write ticket is reached once every write asked before it
 * is answered.
 */
static void test_owner_term(void **state)
{
	struct event_base *base = event_base_new();
	km_state *st = store_unreachable(base);
	km_state_model m;
	runs_probe old, cur;
	uint64_t term = 1, ticket;
	(void)state;

	model_with(&m, KM_MP_MIRRORING, KM_MP_UNKNOWN);
	km_state_loaded(st, &m);
	km_state_owner_check(st, term_now, &term);
	memset(&old, 0, sizeof(old));
	memset(&cur, 0, sizeof(cur));
	ticket = km_state_write_ticket(st);
	km_state_partition_writer(st, "m1", "t", 0, 2000, 57, 35840, runs_done, &old);
	term = 2; /* lost and taken again before the write went */
	km_state_partition_writer(st, "m1", "t", 0, 2000, 59, 36948, runs_done, &cur);
	assert_int_equal(km_state_write_ticket(st), ticket + 2);
	for (int i = 0; i < 100 && !old.answered; i++)
		event_base_loop(base, EVLOOP_NONBLOCK);
	assert_int_equal(old.code, KM_MIRROR_STATE_UNAVAILABLE);
	assert_non_null(strstr(old.message, "has lost and taken again mirror 'm1'"));
	assert_true(km_state_write_reached(st, ticket + 1));
	/* The one of this term goes on to the (unreachable) destination: not answered yet. */
	for (int i = 0; i < 20; i++)
		event_base_loop(base, EVLOOP_NONBLOCK);
	assert_int_equal(cur.answered, 0);
	assert_false(km_state_write_reached(st, ticket + 2));
	km_state_free(st);
	event_base_loop(base, EVLOOP_NONBLOCK);
	assert_int_equal(cur.answered, 1);
	event_base_free(base);
}

/* The store's metrics as /metrics shows them: gauges counted from a model, writes and their latency. */
static void test_metrics(void **state)
{
	km_state_model m;
	km_state_cfg_entry cfg[1] = {{.name = "bootstrap.servers", .value = "s:9092"}};
	km_state_mirror mi = {.name = "m1", .cfg = cfg, .ncfg = 1};
	km_state_key mk = {.type = KM_STATE_REC_MIRROR, .mirror = km_str_c("m1")};
	km_state_topic tt = {.name = "t", .mirror = &mi};
	km_state_counters c;
	km_state_change chg;
	km_metrics *reg = km_metrics_new();
	char *text = NULL;
	size_t len;
	FILE *f;
	km_wr w;
	(void)state;

	memset(&c, 0, sizeof(c));
	assert_int_equal(km_state_counters_register(&c, reg), KM_OK);
	assert_int_not_equal(km_state_counters_register(&c, reg), KM_OK); /* one store per registry */
	km_state_model_init(&m);
	km_wr_init(&w);
	assert_int_equal(km_state_mirror_value_encode(&w, &mi), KM_OK);
	rec(&m, &mk, &w, &chg);
	km_wr_free(&w);
	/* topic t: partitions 0-2 MIRRORING, 3 PAUSED; topic u: partition 0 FAILED */
	for (int32_t i = 0; i < 5; i++) {
		km_state_key pk = {.type = KM_STATE_REC_PARTITION, .mirror = km_str_c("m1"),
				   .topic = km_str_c(i < 4 ? "t" : "u"), .partition = i < 4 ? i : 0};
		km_state_part p = {.state = i < 3 ? KM_MP_MIRRORING : i == 3 ? KM_MP_PAUSED : KM_MP_FAILED,
				   .last_mirrored_offset = -1, .last_mirrored_epoch = -1};
		km_wr_init(&w);
		assert_int_equal(km_state_partition_value_encode(&w, &tt, &p), KM_OK);
		rec(&m, &pk, &w, &chg);
		km_wr_free(&w);
	}
	km_state_counters_count(&c, &m);
	km_state_counters_write(&c, true, 0.003);
	km_state_counters_write(&c, true, 0.2);
	km_state_counters_write(&c, false, 31.0); /* a failure: counted, not in the latency */
	c.records_loaded = 7;
	c.load_ms = 80;
	c.ready = 1;

	f = open_memstream(&text, &len);
	assert_int_equal(km_metrics_render(reg, f), KM_OK);
	fclose(f);
	assert_non_null(strstr(text, "# TYPE kmirror_state_writes_total counter\nkmirror_state_writes_total 2\n"));
	assert_non_null(strstr(text, "kmirror_state_write_failures_total 1\n"));
	assert_non_null(strstr(text, "kmirror_state_records_loaded_total 7\n"));
	assert_non_null(strstr(text, "# TYPE kmirror_state_load_duration_seconds gauge\nkmirror_state_load_duration_seconds 0.08\n"));
	assert_non_null(strstr(text, "kmirror_state_ready 1\n"));
	assert_non_null(strstr(text, "kmirror_state_mirrors 1\n"));
	assert_non_null(strstr(text, "kmirror_state_mirror_topics 2\n"));
	assert_non_null(strstr(text, "# TYPE kmirror_state_partitions gauge\nkmirror_state_partitions{state=\"PREPARING\"} 0\n"
				     "kmirror_state_partitions{state=\"MIRRORING\"} 3\n"
				     "kmirror_state_partitions{state=\"PAUSING\"} 0\n"
				     "kmirror_state_partitions{state=\"PAUSED\"} 1\n"));
	assert_non_null(strstr(text, "kmirror_state_partitions{state=\"FAILED\"} 1\n"));
	assert_null(strstr(text, "state=\"UNKNOWN\""));
	assert_non_null(strstr(text, "kmirror_state_write_latency_seconds_bucket{le=\"0.0025\"} 0\n"
				     "kmirror_state_write_latency_seconds_bucket{le=\"0.005\"} 1\n"));
	assert_non_null(strstr(text, "kmirror_state_write_latency_seconds_bucket{le=\"0.25\"} 2\n"));
	assert_non_null(strstr(text, "kmirror_state_write_latency_seconds_bucket{le=\"+Inf\"} 2\n"
				     "kmirror_state_write_latency_seconds_sum 0.203000\n"
				     "kmirror_state_write_latency_seconds_count 2\n"));
	free(text);
	/* the gauges follow the model: a partition gone is no longer counted */
	{
		km_state_key pk = {.type = KM_STATE_REC_PARTITION, .mirror = km_str_c("m1"), .topic = km_str_c("u")};
		rec(&m, &pk, NULL, &chg);
	}
	km_state_counters_count(&c, &m);
	assert_int_equal(c.partitions[KM_MP_FAILED], 0);
	assert_int_equal(c.topics, 1);
	km_state_model_free(&m);
	km_metrics_free(reg);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_transitions), cmocka_unit_test(test_settle_transitions), cmocka_unit_test(test_config),
		cmocka_unit_test(test_mirror_option_table), cmocka_unit_test(test_secrets),
		cmocka_unit_test(test_progress_bounds_readers),
		cmocka_unit_test(test_open_transaction_bounds_readers),
		cmocka_unit_test(test_progress_apart),
		cmocka_unit_test(test_writer_apart_keeps_a_stop), cmocka_unit_test(test_runner_settle_keeps_a_stop),
		cmocka_unit_test(test_stale_runner_record_is_not_kept),
		cmocka_unit_test(test_sync_group_records),
		cmocka_unit_test(test_progress_waits_for_its_run),
		cmocka_unit_test(test_owner_check),
		cmocka_unit_test(test_owner_term),
		cmocka_unit_test(test_secrets_format0),
		cmocka_unit_test(test_key_file), cmocka_unit_test(test_keys),
		cmocka_unit_test(test_values_and_model), cmocka_unit_test(test_mirror_value_refused),
		cmocka_unit_test(test_zero_topic_id),
		cmocka_unit_test(test_metrics), cmocka_unit_test(test_reload_tells_changes), cmocka_unit_test(test_free_answers_all),
		cmocka_unit_test(test_run_records), cmocka_unit_test(test_runs_validation),
		cmocka_unit_test(test_offmap_handles), cmocka_unit_test(test_policy), cmocka_unit_test(test_fatal),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
