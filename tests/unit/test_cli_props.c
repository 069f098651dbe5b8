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
#include "kmirror/net.h"
#include "tls_cert.h"
#include "unit_tmpfile.h"
#include "unit_keytab.h"

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

/* rc is KM_OK when err_want is NULL, else KM_ERR_CONFIG with err containing err_want. */
static void expect_outcome(km_err rc, const char *err, const char *err_want)
{
	if (!err_want) {
		if (rc != KM_OK)
			fail_msg("unexpected error: %s", err);
		return;
	}
	assert_int_equal(rc, KM_ERR_CONFIG);
	if (!strstr(err, err_want))
		fail_msg("error '%s' does not contain '%s'", err, err_want);
}

/* Client settings of a properties text; err_want NULL: must succeed. */
static void client_of(const char *text, km_cli_client *c, const char *err_want)
{
	km_cli_kvs kv = parse_ok(text);
	char err[512] = "", warn[256];
	km_err rc = km_cli_client_from_props(&kv, c, err, sizeof(err), warn, sizeof(warn));
	km_cli_kvs_free(&kv);
	expect_outcome(rc, err, err_want);
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

	/* Java's stores: each property into its store; they do not mix with the PEM files of the same role. */
	client_of("security.protocol=SSL\nssl.truststore.location=/t.p12\nssl.truststore.type=PKCS12\n"
		  "ssl.truststore.password=tp\nssl.keystore.location=/k.p12\nssl.keystore.password=kp\n"
		  "ssl.key.password=kp\nssl.keymanager.algorithm=PKIX\n",
		  &c, NULL);
	assert_string_equal(c.truststore.location, "/t.p12");
	assert_string_equal(c.truststore.type, "PKCS12");
	assert_string_equal(c.truststore.password, "tp");
	assert_string_equal(c.keystore.location, "/k.p12");
	assert_string_equal(c.keystore.password, "kp");
	assert_string_equal(c.keystore.key_password, "kp");
	assert_null(c.keystore.type);
	assert_null(c.ca_file);
	km_cli_client_free(&c);
	client_of("security.protocol=SSL\nssl.truststore.type=PEM\nssl.truststore.certificates=-----BEGIN\n", &c, NULL);
	assert_true(km_cli_store_given(&c.truststore));
	assert_false(km_cli_store_given(&c.keystore));
	km_cli_client_free(&c);
	client_of("security.protocol=SSL\nssl.truststore.location=/x.p12\nssl.ca.location=/ca.pem\n", &c, "keep one");
	client_of("security.protocol=SSL\nssl.keystore.location=/x.p12\nssl.certificate.location=/c.pem\n"
		  "ssl.key.location=/k.pem\n",
		  &c, "keep one");
	client_of("security.protocol=SSL\nssl.key.password=x\n", &c, "unencrypted PEM key");
	client_of("security.protocol=SSL\nssl.certificate.location=/c.pem\n", &c, "go together");
	client_of("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=GSSAPI\nsasl.username=u\nsasl.password=p\n", &c,
		  "GSSAPI takes no sasl.username or sasl.password");
	client_of("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=XOAUTH2\n", &c,
		  "sasl.mechanism 'XOAUTH2' is not supported: use PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, GSSAPI or OAUTHBEARER");
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

/* GSSAPI: Kafka's Krb5LoginModule line or librdkafka's sasl.kerberos.*, checked against the keytab before connecting. */
static void test_client_kerberos(void **state)
{
	char *kt = make_keytab("kmirror-cli@KMIRROR.TEST"), text[1024];
	km_cli_client c;
	(void)state;

	snprintf(text, sizeof(text),
		 "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=GSSAPI\nsasl.kerberos.service.name=kafka\n"
		 "sasl.jaas.config=com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true "
		 "storeKey=true keyTab=\"%s\" principal=\"kmirror-cli@KMIRROR.TEST\";\n"
		 "sasl.kerberos.min.time.before.relogin=60000\n",
		 kt);
	client_of(text, &c, NULL);
	assert_true(c.sasl);
	assert_string_equal(c.sasl_mechanism, "GSSAPI");
	assert_string_equal(c.krb5_keytab, kt);
	assert_string_equal(c.krb5_principal, "kmirror-cli@KMIRROR.TEST");
	assert_string_equal(c.krb5_service, "kafka");
	assert_null(c.username);
	km_cli_client_free(&c);

	/* librdkafka's names; the service name defaults (NULL: kafka). */
	snprintf(text, sizeof(text),
		 "security.protocol=SASL_SSL\nsasl.mechanism=GSSAPI\nsasl.kerberos.keytab=%s\n"
		 "sasl.kerberos.principal=kmirror-cli@KMIRROR.TEST\n",
		 kt);
	client_of(text, &c, NULL);
	assert_string_equal(c.krb5_principal, "kmirror-cli@KMIRROR.TEST");
	assert_null(c.krb5_service);
	km_cli_client_free(&c);

	/* kinit's ticket cache. */
	client_of("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=GSSAPI\nsasl.jaas.config=com.sun.security.auth.module."
		  "Krb5LoginModule required useTicketCache=true;\n",
		  &c, NULL);
	assert_null(c.krb5_keytab);
	km_cli_client_free(&c);

	/* Each mistake is one line saying what to do. */
	client_of("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=GSSAPI\nsasl.jaas.config=com.sun.security.auth.module."
		  "Krb5LoginModule required useKeyTab=true keyTab=\"/nonexistent/k.keytab\" principal=\"u@R\";\n",
		  &c, "sasl.jaas.config: keytab /nonexistent/k.keytab: No such file or directory: give a keytab file");
	snprintf(text, sizeof(text),
		 "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=GSSAPI\nsasl.jaas.config=com.sun.security.auth."
		 "module.Krb5LoginModule required useKeyTab=true keyTab=\"%s\" principal=\"someone@KMIRROR.TEST\";\n",
		 kt);
	client_of(text, &c, "holds no key for someone@KMIRROR.TEST: name the principal it holds (klist -k");
	client_of("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=GSSAPI\nsasl.jaas.config=com.sun.security.auth.module."
		  "Krb5LoginModule required useKeyTab=true principal=\"u@R\";\n",
		  &c, "useKeyTab=true needs keyTab=");
	client_of("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=GSSAPI\nsasl.jaas.config=org.apache.kafka.common."
		  "security.plain.PlainLoginModule required username=\"u\" password=\"p\";\n",
		  &c, "GSSAPI takes com.sun.security.auth.module.Krb5LoginModule");
	client_of("security.protocol=SASL_PLAINTEXT\nsasl.jaas.config=com.sun.security.auth.module.Krb5LoginModule "
		  "required useTicketCache=true;\n",
		  &c, "is for sasl.mechanism=GSSAPI");
	client_of("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.kerberos.service.name=kafka\n"
		  "sasl.username=u\nsasl.password=p\n",
		  &c, "sasl.kerberos.* properties are for sasl.mechanism=GSSAPI");
	client_of("sasl.kerberos.keytab=/k\n", &c, "need security.protocol SASL_PLAINTEXT or SASL_SSL");
	unlink(kt);
	free(kt);
}

/* A store of s into a fresh client context: KM_OK, or the error containing err_want. */
static void store_of(const km_net_tls_store *s, bool keystore, const char *err_want)
{
	km_net_tls_files f = {0};
	char err[512] = "";
	SSL_CTX *ctx;

	if (keystore)
		f.keystore = *s;
	else
		f.truststore = *s;
	ctx = km_net_tls_client_ctx(&f, true, err, sizeof(err));
	SSL_CTX_free(ctx);
	expect_outcome(ctx ? KM_OK : KM_ERR_CONFIG, err, err_want);
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	char *buf = calloc(1, 65536);
	assert_non_null(f);
	assert_non_null(buf);
	assert_true(fread(buf, 1, 65535, f) > 0);
	fclose(f);
	return buf;
}

/* The store formats the net layer tells apart, and what it says of each mistake. */
static void test_tls_stores(void **state)
{
	char dir[] = "/tmp/km-stores-XXXXXX", cmd[1024], path[256], jks_hint[512];
	char *jks = write_tmp("\xfe\xed\xfe\xed"), *junk = write_tmp("not a store"), *pem, *key;
	const char *one_line;
	(void)state;

	if (!km_test_make_cert(dir))
		skip();
	/* A PKCS12 store as openssl pkcs12 -export makes it, and a key with its certificate in one PEM file. */
	snprintf(cmd, sizeof(cmd),
		 "cd %s && openssl pkcs12 -export -in cert.pem -inkey key.pem -passout pass:changeit -out ks.p12 && "
		 "cat key.pem cert.pem >ks.pem && openssl pkey -in key.pem -aes256 -passout pass:kpw -out enc.pem && "
		 "cat enc.pem cert.pem >ks-enc.pem",
		 dir);
	assert_int_equal(system(cmd), 0);
#define IN(name) (snprintf(path, sizeof(path), "%s/%s", dir, name), path)
	store_of(&(km_net_tls_store){.location = IN("ks.p12"), .password = "changeit"}, true, NULL);
	store_of(&(km_net_tls_store){.location = IN("ks.p12"), .type = "pkcs12", .password = "changeit"}, false, NULL);
	store_of(&(km_net_tls_store){.location = IN("ks.p12"), .password = "nope"}, false,
		 "cannot open the PKCS12 truststore");
	store_of(&(km_net_tls_store){.location = IN("ks.p12"), .password = "nope"}, true,
		 "wrong password? (mac verify failure)");
	store_of(&(km_net_tls_store){.location = IN("ks.p12"), .password = "changeit", .key_password = "other"}, true,
		 "a PKCS12 store has one password");
	store_of(&(km_net_tls_store){.location = IN("cert.pem"), .password = "x"}, false, "set its type to PEM");
	store_of(&(km_net_tls_store){.location = IN("cert.pem"), .type = "PEM"}, false, NULL);
	store_of(&(km_net_tls_store){.location = IN("cert.pem"), .type = "PEM"}, true, "private key of the PEM keystore");
	store_of(&(km_net_tls_store){.location = IN("ks.pem"), .type = "PEM"}, true, NULL);
	store_of(&(km_net_tls_store){.location = IN("ks-enc.pem"), .type = "PEM", .key_password = "kpw"}, true, NULL);
	store_of(&(km_net_tls_store){.location = IN("ks-enc.pem"), .type = "PEM", .key_password = "bad"}, true,
		 "(wrong key password?)");
	store_of(&(km_net_tls_store){.location = IN("nope.p12")}, false, "cannot read the truststore");
	store_of(&(km_net_tls_store){.location = IN("ks.p12"), .type = "BCFKS"}, false, "type 'BCFKS' is not supported");
	snprintf(jks_hint, sizeof(jks_hint), "-srckeystore %s -destkeystore %s.p12 -deststoretype PKCS12", jks, jks);
	store_of(&(km_net_tls_store){.location = jks, .type = "JKS", .password = "changeit"}, false, "is a JKS keystore");
	store_of(&(km_net_tls_store){.location = jks}, true, jks_hint);
	store_of(&(km_net_tls_store){.location = junk}, false, "is not a PKCS12 file");

	/* Inline PEM as a properties value joined by continuations has it: a block on one line. */
	pem = slurp(IN("cert.pem"));
	key = slurp(IN("key.pem"));
	for (char *p = pem; *p; p++)
		if (*p == '\n')
			*p = ' ';
	one_line = pem;
	store_of(&(km_net_tls_store){.type = "PEM", .certificates = one_line}, false, NULL);
	store_of(&(km_net_tls_store){.type = "PEM", .certificates = one_line, .key = key}, true, NULL);
	store_of(&(km_net_tls_store){.type = "PEM", .certificates = one_line}, true, "needs a file or its inline");
	one_line = "-----BEGIN CERTIFICATE----- AAAA -----END CERTIFICATE-----";
	store_of(&(km_net_tls_store){.type = "PEM", .certificates = one_line}, false, "holds no certificate");
#undef IN
	free(pem);
	free(key);
	unlink(jks);
	unlink(junk);
	free(jks);
	free(junk);
	km_test_remove_cert(dir);
}

/* OAUTHBEARER: Kafka's token endpoint property with a file URL, checked before connecting; the JAAS line's module. */
static void test_client_oauth(void **state)
{
	char *tok = write_tmp("eyJhbGciOiJub25lIn0.eyJleHAiOjQxMDI0NDQ4MDAsInN1YiI6ImNsaSJ9.\n");
	char text[1024], expired[1024];
	km_cli_client c;
	(void)state;

	/* {"exp":4102444800,"sub":"cli"}: 2100-01-01 */
	snprintf(text, sizeof(text),
		 "security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\nsasl.oauthbearer.token.endpoint.url=file://%s\n"
		 "sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required ;\n"
		 "sasl.login.callback.handler.class=org.apache.kafka.common.security.oauthbearer."
		 "OAuthBearerLoginCallbackHandler\nsasl.login.refresh.buffer.seconds=300\n",
		 tok);
	client_of(text, &c, NULL);
	assert_true(c.sasl);
	assert_string_equal(c.sasl_mechanism, "OAUTHBEARER");
	assert_non_null(strstr(c.oauth_url, tok));
	assert_null(c.username);
	assert_null(c.password);
	km_cli_client_free(&c);
	/* The JAAS line alone is not enough (the token comes from the endpoint). */
	client_of("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\n", &c,
		  "needs sasl.oauthbearer.token.endpoint.url=file:///PATH");
	client_of("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\nsasl.username=u\n"
		  "sasl.oauthbearer.token.endpoint.url=file:///t\n",
		  &c, "OAUTHBEARER takes no sasl.username");
	client_of("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\n"
		  "sasl.oauthbearer.token.endpoint.url=https://idp.example/token\n",
		  &c, "needs a client id and secret (sasl.jaas.config's clientId and clientSecret)");
	client_of("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\n"
		  "sasl.oauthbearer.token.endpoint.url=ldap://idp.example/token\n",
		  &c, "is not a token endpoint: use file:///PATH/TO/TOKEN");
	/* A token endpoint: the JAAS line's client credentials, asked at the first connection. */
	client_of("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\n"
		  "sasl.oauthbearer.token.endpoint.url=https://idp.example/oauth2/token\n"
		  "sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
		  "clientId=\"op\" clientSecret=\"op-secret\" scope=\"kafka\";\n",
		  &c, NULL);
	assert_string_equal(c.oauth_url, "https://idp.example/oauth2/token");
	assert_string_equal(c.oauth_client_id, "op");
	assert_string_equal(c.oauth_client_secret, "op-secret");
	assert_string_equal(c.oauth_scope, "kafka");
	km_cli_client_free(&c);
	/* Kafka 4.1's names (KIP-1139), alone or over the JAAS line's options. */
	client_of("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\n"
		  "sasl.oauthbearer.token.endpoint.url=https://idp.example/oauth2/token\n"
		  "sasl.oauthbearer.client.credentials.client.id=op41\n"
		  "sasl.oauthbearer.client.credentials.client.secret=op41-secret\nsasl.oauthbearer.scope=kafka41\n",
		  &c, NULL);
	assert_string_equal(c.oauth_client_id, "op41");
	assert_string_equal(c.oauth_client_secret, "op41-secret");
	assert_string_equal(c.oauth_scope, "kafka41");
	km_cli_client_free(&c);
	client_of("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\n"
		  "sasl.oauthbearer.token.endpoint.url=https://idp.example/oauth2/token\n"
		  "sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
		  "clientId=\"op\" clientSecret=\"op-secret\" scope=\"kafka\";\n"
		  "sasl.oauthbearer.client.credentials.client.secret=newer-secret\n",
		  &c, NULL);
	assert_string_equal(c.oauth_client_id, "op");
	assert_string_equal(c.oauth_client_secret, "newer-secret");
	assert_string_equal(c.oauth_scope, "kafka");
	km_cli_client_free(&c);
	client_of("security.protocol=SASL_PLAINTEXT\nsasl.oauthbearer.scope=kafka\n", &c,
		  "sasl.oauthbearer.scope is for sasl.mechanism=OAUTHBEARER (it is not set)");
	client_of("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\n"
		  "sasl.oauthbearer.token.endpoint.url=file:///nonexistent/km/token\n",
		  &c, "sasl.oauthbearer.token.endpoint.url: cannot read /nonexistent/km/token");
	client_of("security.protocol=SASL_PLAINTEXT\nsasl.oauthbearer.token.endpoint.url=file:///t\n", &c,
		  "is for sasl.mechanism=OAUTHBEARER (it is not set)");
	client_of("security.protocol=SASL_PLAINTEXT\nsasl.jaas.config=org.apache.kafka.common.security.oauthbearer."
		  "OAuthBearerLoginModule required;\n",
		  &c, "OAuthBearerLoginModule is for sasl.mechanism=OAUTHBEARER");
	client_of("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\n"
		  "sasl.oauthbearer.token.endpoint.url=file:///t\nsasl.jaas.config=org.apache.kafka.common.security."
		  "plain.PlainLoginModule required username=\"u\" password=\"p\";\n",
		  &c, "OAUTHBEARER takes org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule");
	client_of("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\n"
		  "sasl.oauthbearer.jwks.endpoint.url=https://idp/jwks\n",
		  &c, "use sasl.oauthbearer.token.endpoint.url (file:///PATH, or an http(s) token endpoint");
	client_of("sasl.oauthbearer.token.endpoint.url=file:///t\n", &c, "need security.protocol SASL_PLAINTEXT");
	/* {"exp":1000}: long expired */
	snprintf(expired, sizeof(expired), "eyJhbGciOiJub25lIn0.eyJleHAiOjEwMDB9.\n");
	{
		FILE *f = fopen(tok, "w");
		assert_non_null(f);
		fputs(expired, f);
		fclose(f);
	}
	client_of(text, &c, "expired at 1970-01-01T00:16:40Z");
	unlink(tok);
	free(tok);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_properties_syntax),
		cmocka_unit_test(test_properties_errors),
		cmocka_unit_test(test_jaas),
		cmocka_unit_test(test_client_props),
		cmocka_unit_test(test_client_kerberos),
		cmocka_unit_test(test_client_oauth),
		cmocka_unit_test(test_tls_stores),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
