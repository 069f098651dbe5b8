/* Unit tests for the SASL client providers: PLAIN token, SCRAM-SHA-256 against the RFC 7677 example, tampering; GSSAPI's JAAS line and keytab checks; OAUTHBEARER's exchange, JWT claims, JAAS line and token files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include <event2/event.h>
#include <openssl/evp.h>

#include "kmirror/net.h"
#include "unit_keytab.h"
#include "unit_tmpfile.h"

static void test_plain(void **state)
{
	km_sasl *s = km_sasl_new("PLAIN", "alice", "pw");
	km_wr w;
	bool done = true;
	assert_non_null(s);
	km_wr_init(&w);
	assert_int_equal(km_sasl_step(s, NULL, 0, &w, &done), KM_OK);
	assert_false(done);
	assert_int_equal(w.len, 9);
	assert_memory_equal(w.buf, "\0alice\0pw", 9);
	km_wr_free(&w);
	km_wr_init(&w);
	assert_int_equal(km_sasl_step(s, (const uint8_t *)"", 0, &w, &done), KM_OK);
	assert_true(done);
	assert_int_equal(w.len, 0);
	km_wr_free(&w);
	km_sasl_free(s);
	assert_null(km_sasl_new("GSSAPI", "a", "b")); /* km_sasl_new_gssapi makes it */
	assert_true(km_sasl_mechanism_supported("GSSAPI"));
	assert_true(km_sasl_mechanism_supported("SCRAM-SHA-512"));
	assert_true(km_sasl_mechanism_supported("OAUTHBEARER"));
	assert_false(km_sasl_mechanism_supported("oauthbearer"));
}

/* RFC 7677 section 3: user "user", password "pencil". */
static const char *server_first =
	"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";

static km_sasl *scram_to_final(km_wr *final)
{
	km_sasl *s = km_sasl_new("SCRAM-SHA-256", "user", "pencil");
	km_wr w;
	bool done = true;
	km_sasl_set_nonce(s, "rOprNGfwEbeRWgbNEkqO");
	km_wr_init(&w);
	assert_int_equal(km_sasl_step(s, NULL, 0, &w, &done), KM_OK);
	assert_false(done);
	assert_int_equal(w.len, strlen("n,,n=user,r=rOprNGfwEbeRWgbNEkqO"));
	assert_memory_equal(w.buf, "n,,n=user,r=rOprNGfwEbeRWgbNEkqO", w.len);
	km_wr_free(&w);
	km_wr_init(final);
	assert_int_equal(km_sasl_step(s, (const uint8_t *)server_first, strlen(server_first), final, &done), KM_OK);
	assert_false(done);
	return s;
}

static void test_scram_sha256_rfc7677(void **state)
{
	static const char *client_final = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
					  "p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
	static const char *server_final = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";
	km_wr w;
	bool done = false;
	km_sasl *s = scram_to_final(&w);
	assert_int_equal(w.len, strlen(client_final));
	assert_memory_equal(w.buf, client_final, w.len);
	km_wr_free(&w);
	km_wr_init(&w);
	assert_int_equal(km_sasl_step(s, (const uint8_t *)server_final, strlen(server_final), &w, &done), KM_OK);
	assert_true(done);
	km_wr_free(&w);
	km_sasl_free(s);
}

static void test_scram_rejects_bad_server(void **state)
{
	km_wr w;
	bool done = false;
	km_sasl *s = scram_to_final(&w);
	/* a server that does not know the password cannot produce the signature */
	static const char *forged = "v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";
	km_wr_free(&w);
	km_wr_init(&w);
	assert_int_equal(km_sasl_step(s, (const uint8_t *)forged, strlen(forged), &w, &done), KM_ERR_SASL);
	assert_false(done);
	km_wr_free(&w);
	km_sasl_free(s);

	/* a server nonce that does not extend ours, and absurd iteration counts, are refused */
	s = km_sasl_new("SCRAM-SHA-512", "user", "pencil");
	km_sasl_set_nonce(s, "abc");
	km_wr_init(&w);
	assert_int_equal(km_sasl_step(s, NULL, 0, &w, &done), KM_OK);
	km_wr_free(&w);
	km_wr_init(&w);
	assert_int_equal(km_sasl_step(s, (const uint8_t *)"r=xyz123,s=QUJD,i=4096", 22, &w, &done), KM_ERR_SASL);
	assert_int_equal(km_sasl_step(s, (const uint8_t *)"r=abc123,s=QUJD,i=999999999", 27, &w, &done), KM_ERR_SASL);
	assert_int_equal(km_sasl_step(s, (const uint8_t *)"r=abc123,i=4096", 15, &w, &done), KM_ERR_SASL);
	km_wr_free(&w);
	km_sasl_free(s);
}

#define KRB5_MODULE "com.sun.security.auth.module.Krb5LoginModule required "

/* A JAAS line: KM_OK with what it names, or the error containing err_want. */
static void jaas_of(const char *jaas, const char *kt_want, const char *pr_want, const char *svc_want,
		    const char *err_want)
{
	char *kt, *pr, *svc, err[400] = "";
	km_err rc = km_sasl_krb5_jaas(jaas, &kt, &pr, &svc, err, sizeof(err));

	if (err_want) {
		assert_int_equal(rc, KM_ERR_CONFIG);
		if (!strstr(err, err_want))
			fail_msg("error '%s' does not contain '%s'", err, err_want);
		assert_null(kt);
		assert_null(pr);
		assert_null(svc);
		return;
	}
	if (rc != KM_OK)
		fail_msg("unexpected error: %s", err);
#define SAME(got, want)                                   \
	do {                                              \
		if (want)                                 \
			assert_string_equal(got, want);   \
		else                                      \
			assert_null(got);                 \
	} while (0)
	SAME(kt, kt_want);
	SAME(pr, pr_want);
	SAME(svc, svc_want);
#undef SAME
	free(kt);
	free(pr);
	free(svc);
}

static void test_krb5_jaas(void **state)
{
	(void)state;
	jaas_of(KRB5_MODULE "useKeyTab=true storeKey=true keyTab=\"/etc/kmirror/k.keytab\" "
			    "principal=\"kmirror/host.example.com@EXAMPLE.COM\";",
		"/etc/kmirror/k.keytab", "kmirror/host.example.com@EXAMPLE.COM", NULL, NULL);
	/* Bare values, serviceName, other options ignored, a short class name, escapes in quotes. */
	jaas_of("Krb5LoginModule required debug=true useKeyTab=TRUE keyTab=/k/a\\\"b principal=\"u\\\\x@R\" "
		"serviceName=\"kafka2\" ;",
		"/k/a\\\"b", "u\\x@R", "kafka2", NULL);
	/* The ticket cache: no keytab, and the cache decides the principal. */
	jaas_of(KRB5_MODULE "useTicketCache=true principal=\"u@R\";", NULL, NULL, NULL, NULL);
	jaas_of("org.apache.kafka.common.security.plain.PlainLoginModule required username=\"u\" password=\"p\";", NULL,
		NULL, NULL, "GSSAPI takes com.sun.security.auth.module.Krb5LoginModule");
	jaas_of("x.NotKrb5LoginModule required useKeyTab=true;", NULL, NULL, NULL, "GSSAPI takes");
	jaas_of(KRB5_MODULE "useKeyTab=true principal=\"u@R\";", NULL, NULL, NULL, "useKeyTab=true needs keyTab=");
	jaas_of(KRB5_MODULE "useKeyTab=true keyTab=\"/k\";", NULL, NULL, NULL, "useKeyTab=true needs principal=");
	jaas_of(KRB5_MODULE "keyTab=\"/k\" principal=\"u@R\";", NULL, NULL, NULL, "only with useKeyTab=true");
	jaas_of(KRB5_MODULE "storeKey=true;", NULL, NULL, NULL, "needs useKeyTab=true with keyTab and principal");
	jaas_of(KRB5_MODULE "useKeyTab=true keyTab=\"/k\" principal=\"u@R\"", NULL, NULL, NULL, "missing ';'");
	jaas_of(KRB5_MODULE "useKeyTab=true keyTab=\"/k principal=\"u@R\";", NULL, NULL, NULL, "expected key=");
	jaas_of("com.sun.security.auth.module.Krb5LoginModule useKeyTab=true;", NULL, NULL, NULL, "expected 'required'");
}

/* km_sasl_krb5_check's outcome: KM_OK, or one line containing each of the wanted pieces. */
static void check_of(const km_sasl_krb5 *k, const char *w1, const char *w2, const char *w3)
{
	char err[600] = "";
	km_err rc = km_sasl_krb5_check(k, err, sizeof(err));
	const char *want[3] = {w1, w2, w3};

	if (!w1) {
		if (rc != KM_OK)
			fail_msg("unexpected error: %s", err);
		return;
	}
	assert_int_equal(rc, KM_ERR_CONFIG);
	assert_null(strchr(err, '\n'));
	for (int i = 0; i < 3; i++)
		if (want[i] && !strstr(err, want[i]))
			fail_msg("error '%s' does not contain '%s'", err, want[i]);
}

static void test_krb5_keytab_check(void **state)
{
	char *kt = make_keytab("kmirror/host@KMIRROR.TEST"), *conf, err[600];
	km_sasl_krb5 k = {NULL, kt, "kmirror/host@KMIRROR.TEST", "upstream_sasl_kerberos_keytab"};
	km_sasl *s;
	(void)state;

	check_of(&k, NULL, NULL, NULL);
	/* Another principal than the keytab's: named, with the command that lists what it holds. */
	k.principal = "other@KMIRROR.TEST";
	check_of(&k, "upstream_sasl_kerberos_keytab", "holds no key for other@KMIRROR.TEST", "klist -k");
	/* A keytab that is not there, or not a keytab. */
	k.principal = "kmirror/host@KMIRROR.TEST";
	k.keytab = "/nonexistent/kmirror.keytab";
	check_of(&k, "keytab /nonexistent/kmirror.keytab: No such file or directory", "give a keytab file", NULL);
	k.keytab = "/etc/hostname";
	check_of(&k, "keytab /etc/hostname", "give a keytab file", NULL);
	/* Half an identity. */
	k.keytab = kt;
	k.principal = NULL;
	check_of(&k, "without a principal", NULL, NULL);
	k.keytab = NULL;
	k.principal = "u@R";
	check_of(&k, "without a keytab", NULL, NULL);
	/* Neither: the default credentials cache, found when connecting. */
	k.principal = NULL;
	check_of(&k, NULL, NULL, NULL);

	/* A GSSAPI exchange refuses to begin with a keytab it cannot use, saying why. */
	k = (km_sasl_krb5){"kafka", "/nonexistent/kmirror.keytab", "u@R", "sasl.jaas.config"};
	s = km_sasl_new_gssapi("broker.example.com", &k, err, sizeof(err));
	assert_null(s);
	assert_non_null(strstr(err, "sasl.jaas.config: keytab /nonexistent/kmirror.keytab"));
	/* A usable one, but no KDC for its realm: the credentials are asked for at once, and the KDC's absence named. */
	conf = write_tmp("[libdefaults]\n default_realm = KMIRROR.TEST\n dns_lookup_kdc = false\n");
	setenv("KRB5_CONFIG", conf, 1);
	k = (km_sasl_krb5){NULL, kt, "kmirror/host@KMIRROR.TEST", "sasl.jaas.config"};
	s = km_sasl_new_gssapi("broker.example.com", &k, err, sizeof(err));
	assert_null(s);
	if (!strstr(err, "credentials of kmirror/host@KMIRROR.TEST from keytab") ||
	    !strstr(err, "Cannot find KDC for realm \"KMIRROR.TEST\""))
		fail_msg("unexpected error: %s", err);
	unsetenv("KRB5_CONFIG");
	unlink(conf);
	free(conf);
	unlink(kt);
	free(kt);
}

/* ---- OAUTHBEARER ---- */

/* base64url without padding of text into out. */
static void b64url(const char *text, char *out)
{
	int n = EVP_EncodeBlock((unsigned char *)out, (const unsigned char *)text, (int)strlen(text));
	while (n > 0 && out[n - 1] == '=')
		n--;
	out[n] = 0;
	for (char *p = out; *p; p++)
		*p = *p == '+' ? '-' : *p == '/' ? '_' : *p;
}

/* An unsigned JWT (alg none, as Kafka's unsecured tokens) with this payload. */
static char *jwt_of(const char *payload)
{
	char h[200], p[2000], *out = malloc(2300);
	b64url("{\"alg\":\"none\"}", h);
	b64url(payload, p);
	snprintf(out, 2300, "%s.%s.", h, p);
	return out;
}

static void test_oauthbearer_exchange(void **state)
{
	static const char want[] = "n,,\x01" "auth=Bearer abc.def.\x01\x01";
	static const char refusal[] = "{\"status\":\"invalid_token\",\"scope\":\"kafka\",\"openid-configuration\":\"\"}";
	km_sasl *s = km_sasl_new("OAUTHBEARER", NULL, "abc.def.");
	km_wr w;
	bool done = true;

	assert_non_null(s);
	km_wr_init(&w);
	assert_int_equal(km_sasl_step(s, NULL, 0, &w, &done), KM_OK);
	assert_false(done);
	assert_int_equal(w.len, sizeof(want) - 1);
	assert_memory_equal(w.buf, want, sizeof(want) - 1);
	km_wr_free(&w);
	/* Accepted: the server's answer is empty. */
	km_wr_init(&w);
	assert_int_equal(km_sasl_step(s, (const uint8_t *)"", 0, &w, &done), KM_OK);
	assert_true(done);
	assert_int_equal(w.len, 0);
	assert_string_equal(km_sasl_reason(s), "");
	km_wr_free(&w);
	km_sasl_free(s);

	/* Refused: the JSON error is answered with a lone 0x01, and its status and scope kept. */
	s = km_sasl_new("OAUTHBEARER", NULL, "abc.def.");
	km_wr_init(&w);
	assert_int_equal(km_sasl_step(s, NULL, 0, &w, &done), KM_OK);
	km_wr_free(&w);
	km_wr_init(&w);
	assert_int_equal(km_sasl_step(s, (const uint8_t *)refusal, strlen(refusal), &w, &done), KM_OK);
	assert_false(done);
	assert_int_equal(w.len, 1);
	assert_int_equal(w.buf[0], 1);
	assert_string_equal(km_sasl_reason(s), "the broker refused the token: status invalid_token, scope kafka");
	km_wr_free(&w);
	/* A server that goes on after that is not believed. */
	km_wr_init(&w);
	assert_int_equal(km_sasl_step(s, (const uint8_t *)"", 0, &w, &done), KM_ERR_SASL);
	km_wr_free(&w);
	km_sasl_free(s);
}

static void jwt_is(const char *payload, int64_t exp_want, int64_t iat_want, const char *why_want)
{
	char *t = jwt_of(payload), why[200] = "";
	int64_t exp = -1, iat = -1;
	km_err rc = km_sasl_oauth_jwt(t, strlen(t), &exp, &iat, why, sizeof(why));

	if (why_want) {
		assert_int_equal(rc, KM_ERR_INVAL);
		if (!strstr(why, why_want))
			fail_msg("%s: '%s' has no '%s'", payload, why, why_want);
	} else {
		if (rc != KM_OK)
			fail_msg("%s: %s", payload, why);
		assert_int_equal(exp, exp_want);
		assert_int_equal(iat, iat_want);
	}
	free(t);
}

static void test_oauth_jwt(void **state)
{
	char why[200];
	int64_t exp, iat;

	jwt_is("{\"sub\":\"alice\",\"exp\":1900000000,\"iat\":1800000000}", 1900000000, 1800000000, NULL);
	/* Nested values and strings holding quotes and braces are skipped whole; no iat reads as 0. */
	jwt_is("{\"aud\":[\"a\",\"b}\"],\"x\":{\"exp\":1},\"s\":\"q\\\"}\",\"exp\":1700000000.0}", 1700000000, 0, NULL);
	/* base64url lengths of each remainder (the payload's length decides the padding left out) */
	jwt_is("{\"exp\":12}", 12, 0, NULL);
	jwt_is("{\"exp\":123}", 123, 0, NULL);
	jwt_is("{\"exp\":1234}", 1234, 0, NULL);
	jwt_is("{\"sub\":\"alice\"}", 0, 0, "numeric exp");
	jwt_is("{\"exp\":\"1900000000\"}", 0, 0, "numeric exp");
	jwt_is("[1,2]", 0, 0, "numeric exp");
	jwt_is("{\"exp\":-5}", 0, 0, "numeric exp");
	assert_int_equal(km_sasl_oauth_jwt("abc", 3, &exp, &iat, why, sizeof(why)), KM_ERR_INVAL);
	assert_non_null(strstr(why, "not a JWT"));
	assert_int_equal(km_sasl_oauth_jwt("a.b.c.d", 7, &exp, &iat, why, sizeof(why)), KM_ERR_INVAL);
	assert_int_equal(km_sasl_oauth_jwt("a..c", 4, &exp, &iat, why, sizeof(why)), KM_ERR_INVAL);
	assert_int_equal(km_sasl_oauth_jwt("eyJ.e+/=.c", 10, &exp, &iat, why, sizeof(why)), KM_ERR_INVAL);
	assert_non_null(strstr(why, "not base64url"));
}

#define OAUTH_MODULE "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "

static void test_oauth_jaas(void **state)
{
	char *id, *secret, *scope, err[300];

	assert_int_equal(km_sasl_oauth_jaas(OAUTH_MODULE "clientId=\"kmirror\" clientSecret=\"s\\\"3\" scope=\"kafka "
							 "mirror\" debug=true;",
					    &id, &secret, &scope, err, sizeof(err)),
			 KM_OK);
	assert_string_equal(id, "kmirror");
	assert_string_equal(secret, "s\"3");
	assert_string_equal(scope, "kafka mirror");
	free(id);
	free(secret);
	free(scope);
	assert_int_equal(km_sasl_oauth_jaas("OAuthBearerLoginModule required;", &id, &secret, &scope, err, sizeof(err)),
			 KM_OK);
	assert_null(id);
	assert_null(secret);
	assert_null(scope);
	assert_int_equal(km_sasl_oauth_jaas("org.apache.kafka.common.security.plain.PlainLoginModule required "
					    "username=\"u\" password=\"p\";",
					    &id, &secret, &scope, err, sizeof(err)),
			 KM_ERR_CONFIG);
	assert_non_null(strstr(err, "OAUTHBEARER takes "
				    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"));
	assert_int_equal(km_sasl_oauth_jaas(OAUTH_MODULE "unsecuredLoginStringClaim_sub=\"alice\";", &id, &secret,
					    &scope, err, sizeof(err)),
			 KM_ERR_CONFIG);
	assert_non_null(strstr(err, "no unsecured tokens"));
	assert_int_equal(km_sasl_oauth_jaas(OAUTH_MODULE "clientId=\"a\"", &id, &secret, &scope, err, sizeof(err)),
			 KM_ERR_CONFIG);
	assert_non_null(strstr(err, "missing ';'"));
	assert_null(id);
}

/* A token file's token for url: KM_OK and the token, or the error containing want. */
static void token_is(const char *url, const char *tok_want, const char *want)
{
	km_sasl_oauth o = {url, NULL, NULL, NULL, "test.url"};
	char *tok = NULL, err[400] = "";
	km_err rc = km_sasl_oauth_get(&o, NULL, NULL, NULL, &tok, err, sizeof(err));

	if (want) {
		assert_int_equal(rc, KM_ERR_CONFIG);
		assert_null(tok);
		if (!strstr(err, want) || strncmp(err, "test.url", 8) != 0)
			fail_msg("'%s' has no '%s'", err, want);
		return;
	}
	if (rc != KM_OK)
		fail_msg("%s", err);
	assert_string_equal(tok, tok_want);
	free(tok);
}

static void rewrite(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static void test_oauth_token_file(void **state)
{
	char payload[200], *a, *b, *old, url[300], *path = write_tmp("");
	long long now = (long long)time(NULL);

	snprintf(url, sizeof(url), "file://%s", path);
	snprintf(payload, sizeof(payload), "{\"sub\":\"a\",\"exp\":%lld}", now + 3600);
	a = jwt_of(payload);
	snprintf(payload, sizeof(payload), "{\"sub\":\"bb\",\"exp\":%lld,\"iat\":%lld}", now + 7200, now);
	b = jwt_of(payload);
	snprintf(payload, sizeof(payload), "{\"sub\":\"a\",\"exp\":%lld}", now - 30);
	old = jwt_of(payload);

	token_is(url, NULL, "is empty");
	{
		char line[2400];
		snprintf(line, sizeof(line), "  %s\n\n", a); /* surrounding blanks are not the token's */
		rewrite(path, line);
	}
	token_is(url, a, NULL);
	token_is(url, a, NULL); /* kept */
	rewrite(path, b);
	token_is(url, b, NULL); /* the file changed: read again */
	rewrite(path, old);
	token_is(url, NULL, "expired at");
	token_is(url, NULL, "write a fresh token there");
	rewrite(path, "not a token");
	token_is(url, NULL, "not a JWT");
	rewrite(path, b);
	token_is(url, b, NULL);
	unlink(path);
	token_is(url, NULL, "cannot read");
	token_is("https://idp.example/token", NULL, "the token endpoint https://idp.example/token needs a client id "
						    "and secret");
	token_is("ftp://idp.example/token", NULL, "is not a token endpoint: use file:///PATH/TO/TOKEN");
	token_is("file://relative/path", NULL, "is not a token endpoint");
	token_is(NULL, NULL, "is not a token endpoint");
	free(a);
	free(b);
	free(old);
	free(path);
}

static void endpoint_answer(void *arg, km_err rc, const char *why)
{
	char *out = arg;
	snprintf(out, 400, "%d %s", (int)rc, why);
}

/*
 * A token endpoint is asked on the event loop: the connection waits (no token yet, its wait
 * armed), and hears the outcome from the loop: here an endpoint that refuses the connection. A
 * cancelled wait hears nothing.
 */
static void test_oauth_endpoint_waits(void **state)
{
	struct event_base *base = event_base_new();
	km_sasl_oauth o = {"http://127.0.0.1:9/oauth2/token", "kmirror", "s3cret", "kafka", "test.url"};
	km_sasl_oauth_wait w1, w2;
	char *tok = (char *)1, err[400] = "", said1[400] = "", said2[400] = "";

	memset(&w1, 0, sizeof(w1));
	memset(&w2, 0, sizeof(w2));
	w1.cb = w2.cb = endpoint_answer;
	w1.arg = said1;
	w2.arg = said2;
	assert_int_equal(km_sasl_oauth_get(&o, base, NULL, &w1, &tok, err, sizeof(err)), KM_OK);
	assert_null(tok);
	assert_int_equal(km_sasl_oauth_get(&o, base, NULL, &w2, &tok, err, sizeof(err)), KM_OK);
	assert_null(tok);
	km_sasl_oauth_cancel(&w2);
	assert_true(event_base_dispatch(base) >= 0); /* 1: it ran until nothing was left */
	if (!strstr(said1, "test.url: the token endpoint http://127.0.0.1:9/oauth2/token did not answer"))
		fail_msg("%s", said1);
	assert_string_equal(said2, "");
	assert_null(w1.pprev);
	/* The check needs no answer: the URL and the client are enough. */
	assert_int_equal(km_sasl_oauth_check(&o, err, sizeof(err)), KM_OK);
	o.client_secret = "";
	assert_int_equal(km_sasl_oauth_check(&o, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "needs a client id and secret"));
	event_base_free(base);
}

/*
 * A token command (kmirrord's upstream_sasl_oauthbearer_token_command): checked by running it once
 * (its exit status, a live JWT on its stdout); on the loop, a connection waits for the run and is
 * told when the token is there, and the token is kept until 80% of its life has passed.
 */
static void test_oauth_token_command(void **state)
{
	struct event_base *base = event_base_new();
	char payload[200], cmd[2600], *jwt, *tok = NULL, err[400] = "", said[400] = "";
	long long now = (long long)time(NULL);
	km_sasl_oauth o = {NULL, NULL, NULL, NULL, "test.command", cmd};
	km_sasl_oauth_wait w;
	(void)state;

	snprintf(payload, sizeof(payload), "{\"sub\":\"kmirrord\",\"exp\":%lld,\"iat\":%lld}", now + 3600, now);
	jwt = jwt_of(payload);
	snprintf(cmd, sizeof(cmd), "printf '  %s\\n'", jwt);
	assert_int_equal(km_sasl_oauth_check(&o, err, sizeof(err)), KM_OK);
	/* On the loop: the first connection waits for the run, then gets the token; the next at once. */
	memset(&w, 0, sizeof(w));
	w.cb = endpoint_answer;
	w.arg = said;
	assert_int_equal(km_sasl_oauth_get(&o, base, NULL, &w, &tok, err, sizeof(err)), KM_OK);
	assert_null(tok);
	assert_true(event_base_dispatch(base) >= 0);
	assert_string_equal(said, "0 ");
	assert_int_equal(km_sasl_oauth_get(&o, base, NULL, &w, &tok, err, sizeof(err)), KM_OK);
	assert_string_equal(tok, jwt);
	free(tok);
	/* What a failing command says. */
	snprintf(cmd, sizeof(cmd), "echo no token; exit 3");
	assert_int_equal(km_sasl_oauth_check(&o, err, sizeof(err)), KM_ERR_CONFIG);
	if (!strstr(err, "test.command: the token command 'echo no token; exit 3' exited with status 3"))
		fail_msg("%s", err);
	snprintf(cmd, sizeof(cmd), "echo not-a-token");
	assert_int_equal(km_sasl_oauth_check(&o, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "it must print the access token (a JWT) on its standard output"));
	snprintf(payload, sizeof(payload), "{\"sub\":\"kmirrord\",\"exp\":%lld}", now - 60);
	free(jwt);
	jwt = jwt_of(payload);
	snprintf(cmd, sizeof(cmd), "echo %s", jwt);
	assert_int_equal(km_sasl_oauth_check(&o, err, sizeof(err)), KM_ERR_CONFIG);
	assert_non_null(strstr(err, "printed a token that expired"));
	free(jwt);
	event_base_free(base);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plain),
		cmocka_unit_test(test_scram_sha256_rfc7677),
		cmocka_unit_test(test_scram_rejects_bad_server),
		cmocka_unit_test(test_krb5_jaas),
		cmocka_unit_test(test_krb5_keytab_check),
		cmocka_unit_test(test_oauthbearer_exchange),
		cmocka_unit_test(test_oauth_jwt),
		cmocka_unit_test(test_oauth_jaas),
		cmocka_unit_test(test_oauth_token_file),
		cmocka_unit_test(test_oauth_endpoint_waits),
		cmocka_unit_test(test_oauth_token_command),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
