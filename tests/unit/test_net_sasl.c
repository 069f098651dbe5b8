/* Unit tests for the SASL client providers: PLAIN token, SCRAM-SHA-256 against the RFC 7677 example, tampering. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "kmirror/net.h"

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
	assert_null(km_sasl_new("GSSAPI", "a", "b"));
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plain),
		cmocka_unit_test(test_scram_sha256_rfc7677),
		cmocka_unit_test(test_scram_rejects_bad_server),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
