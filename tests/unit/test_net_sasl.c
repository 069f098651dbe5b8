/* Unit tests for the SASL client providers: PLAIN token, SCRAM-SHA-256 against the RFC 7677 example, tampering; GSSAPI's JAAS line and keytab checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

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
	assert_false(km_sasl_mechanism_supported("OAUTHBEARER"));
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plain),
		cmocka_unit_test(test_scram_sha256_rfc7677),
		cmocka_unit_test(test_scram_rejects_bad_server),
		cmocka_unit_test(test_krb5_jaas),
		cmocka_unit_test(test_krb5_keytab_check),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
