/* kmirror CLI properties: .properties syntax, sasl.jaas.config, and Kafka tool client properties to connection settings. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "cli/cli.h"

static km_cli_kvs parse_ok(const char *text)
{
	km_cli_kvs kv = {0};
	char err[256];
	assert_int_equal(km_cli_props_parse(text, strlen(text), &kv, err, sizeof(err)), KM_OK);
	return kv;
}

static const char *get(const km_cli_kvs *kv, const char *k)
{
	const km_cli_kv *e = km_cli_kvs_get(kv, k);
	return e ? e->value : NULL;
}

static void test_properties_syntax(void **state)
{
	km_cli_kvs kv = parse_ok("# comment\n"
				 "! also a comment\n"
				 "\n"
				 "   a=1\n"
				 "b : two words  \n"
				 "c three\n"
				 "d=\n"
				 "e\n"
				 "long=first \\\n"
				 "      second\\\r\n"
				 "  third\n"
				 "esc=tab\\there\\nnl\\\\back\\=eq\\u00e9\n"
				 "key\\ with\\ spaces=v\n"
				 "a=override\r\n"
				 "last=no newline");
	(void)state;

	assert_string_equal(get(&kv, "a"), "override"); /* the later line wins */
	assert_string_equal(get(&kv, "b"), "two words  "); /* trailing space is kept, as Java does */
	assert_string_equal(get(&kv, "c"), "three");
	assert_string_equal(get(&kv, "d"), "");
	assert_string_equal(get(&kv, "e"), "");
	assert_string_equal(get(&kv, "long"), "first secondthird");
	assert_string_equal(get(&kv, "esc"), "tab\there\nnl\\back=eq\xc3\xa9");
	assert_string_equal(get(&kv, "key with spaces"), "v");
	assert_string_equal(get(&kv, "last"), "no newline");
	assert_null(get(&kv, "# comment"));
	assert_int_equal(kv.count, 9);
	km_cli_kvs_free(&kv);
}

static void test_properties_errors(void **state)
{
	km_cli_kvs kv = {0};
	char err[256];
	(void)state;

	assert_int_equal(km_cli_props_parse("a=1\nb=\\u12\n", 11, &kv, err, sizeof(err)), KM_ERR_CONFIG);
	assert_string_equal(err, "line 2: bad \\u escape");
	km_cli_kvs_free(&kv);
	assert_int_equal(km_cli_props_load("/nonexistent/client.properties", &kv, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "/nonexistent/client.properties: cannot open"));
	km_cli_kvs_free(&kv);
}

static void test_jaas(void **state)
{
	char *u, *p, err[256];
	const char *fam;
	(void)state;

	assert_int_equal(km_cli_jaas_parse("org.apache.kafka.common.security.plain.PlainLoginModule required "
					   "username=\"alice\" password=\"al\\\"ice;secret\";",
					   &u, &p, &fam, err, sizeof(err)),
			 KM_OK);
	assert_string_equal(u, "alice");
	assert_string_equal(p, "al\"ice;secret"); /* a quoted ';' and an escaped quote stay in the value */
	assert_string_equal(fam, "PLAIN");
	free(u);
	free(p);

	assert_int_equal(km_cli_jaas_parse("  org.apache.kafka.common.security.scram.ScramLoginModule required\n"
					   "  password=bare  tokenauth=\"false\" username=bob ;",
					   &u, &p, &fam, err, sizeof(err)),
			 KM_OK);
	assert_string_equal(u, "bob");
	assert_string_equal(p, "bare");
	assert_string_equal(fam, "SCRAM");
	free(u);
	free(p);

	assert_int_equal(km_cli_jaas_parse("com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true;", &u,
					   &p, &fam, err, sizeof(err)),
			 KM_ERR_CONFIG);
	assert_non_null(strstr(err, "Krb5LoginModule' is not supported"));
	assert_int_equal(km_cli_jaas_parse("org.apache.kafka.common.security.plain.PlainLoginModule username=\"a\" "
					   "password=\"b\";",
					   &u, &p, &fam, err, sizeof(err)),
			 KM_ERR_CONFIG);
	assert_non_null(strstr(err, "expected 'required'"));
	assert_int_equal(km_cli_jaas_parse("org.apache.kafka.common.security.plain.PlainLoginModule required "
					   "username=\"a\" password=\"b\"",
					   &u, &p, &fam, err, sizeof(err)),
			 KM_ERR_CONFIG);
	assert_non_null(strstr(err, "missing ';'"));
	assert_int_equal(km_cli_jaas_parse("org.apache.kafka.common.security.plain.PlainLoginModule required "
					   "username=\"a\";",
					   &u, &p, &fam, err, sizeof(err)),
			 KM_ERR_CONFIG);
	assert_non_null(strstr(err, "no password="));
	assert_int_equal(km_cli_jaas_parse("org.apache.kafka.common.security.plain.PlainLoginModule required "
					   "username=\"a;",
					   &u, &p, &fam, err, sizeof(err)),
			 KM_ERR_CONFIG);
	assert_non_null(strstr(err, "unterminated"));
	assert_null(u);
	assert_null(p);
	/* What was found before the error is dropped too. */
	assert_int_equal(km_cli_jaas_parse("org.apache.kafka.common.security.plain.PlainLoginModule required "
					   "username=\"a\" password=\"b\" =x;",
					   &u, &p, &fam, err, sizeof(err)),
			 KM_ERR_CONFIG);
	assert_non_null(strstr(err, "expected key=\"value\""));
	assert_null(u);
	assert_null(p);
}

/* Client settings of a properties text; err_want NULL: must succeed. */
static void client_of(const char *text, km_cli_client *c, const char *err_want)
{
	km_cli_kvs kv = parse_ok(text);
	char err[512] = "", warn[256];
	km_err rc = km_cli_client_from_props(&kv, c, err, sizeof(err), warn, sizeof(warn));
	km_cli_kvs_free(&kv);
	if (!err_want) {
		if (rc != KM_OK)
			fail_msg("unexpected error: %s", err);
		return;
	}
	assert_int_equal(rc, KM_ERR_CONFIG);
	if (!strstr(err, err_want))
		fail_msg("error '%s' does not contain '%s'", err, err_want);
}

static void test_client_props(void **state)
{
	km_cli_client c;
	km_cli_kvs kv;
	char err[256], warn[256];
	(void)state;

	client_of("", &c, NULL);
	assert_false(c.tls);
	assert_false(c.sasl);
	km_cli_client_free(&c);

	client_of("security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
		  "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
		  "username=\"admin\" password=\"admin-secret\";\n"
		  "ssl.ca.location=/etc/ca.pem\nssl.endpoint.identification.algorithm=\n",
		  &c, NULL);
	assert_true(c.tls);
	assert_true(c.sasl);
	assert_false(c.verify_host);
	assert_string_equal(c.sasl_mechanism, "SCRAM-SHA-512");
	assert_string_equal(c.username, "admin");
	assert_string_equal(c.password, "admin-secret");
	assert_string_equal(c.ca_file, "/etc/ca.pem");
	km_cli_client_free(&c);

	/* PlainLoginModule implies PLAIN; librdkafka-style sasl.username/password work too. */
	client_of("security.protocol=SASL_PLAINTEXT\nsasl.jaas.config=org.apache.kafka.common.security.plain."
		  "PlainLoginModule required username=\"u\" password=\"p\";\n",
		  &c, NULL);
	assert_string_equal(c.sasl_mechanism, "PLAIN");
	assert_true(c.verify_host);
	km_cli_client_free(&c);
	client_of("security.protocol=sasl_plaintext\nsasl.mechanism=SCRAM-SHA-256\nsasl.username=u\nsasl.password=p\n",
		  &c, NULL);
	assert_string_equal(c.username, "u");
	assert_string_equal(c.password, "p");
	km_cli_client_free(&c);

	client_of("security.protocol=SSL\nssl.truststore.location=/x.jks\n", &c, "use ssl.ca.location=FILE.pem");
	client_of("security.protocol=SSL\nssl.keystore.location=/x.jks\n", &c, "ssl.certificate.location=FILE.pem");
	client_of("security.protocol=SSL\nssl.key.password=x\n", &c, "unencrypted PEM key");
	client_of("security.protocol=SSL\nssl.certificate.location=/c.pem\n", &c, "go together");
	client_of("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=GSSAPI\nsasl.username=u\nsasl.password=p\n", &c,
		  "sasl.mechanism 'GSSAPI' is not supported");
	client_of("security.protocol=SASL_PLAINTEXT\nsasl.jaas.config=org.apache.kafka.common.security.scram."
		  "ScramLoginModule required username=\"u\" password=\"p\";\n",
		  &c, "sasl.mechanism is required");
	client_of("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.jaas.config=org.apache.kafka.common."
		  "security.scram.ScramLoginModule required username=\"u\" password=\"p\";\n",
		  &c, "does not match the SCRAM login module");
	client_of("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n", &c, "needs a username and password");
	client_of("sasl.mechanism=PLAIN\n", &c, "need security.protocol SASL_PLAINTEXT or SASL_SSL");
	client_of("security.protocol=KERBEROS\n", &c, "security.protocol 'KERBEROS'");
	client_of("ssl.endpoint.identification.algorithm=ldap\n", &c, "expected https or empty");

	/* Unknown properties are named in the warning; common harmless ones are not. */
	kv = parse_ok("request.timeout.ms=1000\nfoo.bar=1\nbaz=2\n");
	assert_int_equal(km_cli_client_from_props(&kv, &c, err, sizeof(err), warn, sizeof(warn)), KM_OK);
	assert_string_equal(warn, "foo.bar, baz");
	km_cli_client_free(&c);
	km_cli_kvs_free(&kv);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_properties_syntax),
		cmocka_unit_test(test_properties_errors),
		cmocka_unit_test(test_jaas),
		cmocka_unit_test(test_client_props),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
