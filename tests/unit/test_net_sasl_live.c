/* GSSAPI against a real KDC (KM_TEST_KRB5_KEYTAB, KM_TEST_KRB5_PRINCIPAL, KRB5_KTNAME the service's keytab, KM_TEST_KRB5_LIFE_S): the RFC 4752 exchange with an MIT acceptor, and tickets got again from the keytab after they expire. Skips without them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include <gssapi/gssapi.h>
#include <krb5.h>

#include "kmirror/net.h"

static const char *keytab, *principal;

/*
 * One exchange as a Kafka broker runs it: the context (the acceptor's keytab is KRB5_KTNAME's),
 * then the security layer offer (no layer, or integrity, 64 KiB), the client's answer, an empty
 * final message. The client's name as the acceptor saw it into who.
 */
static void exchange(char *who, size_t wholen)
{
	km_sasl_krb5 k = {"kafka", keytab, principal, "test"};
	char err[600];
	km_sasl *s = km_sasl_new_gssapi("127.0.0.1", &k, err, sizeof(err));
	OM_uint32 maj, min;
	gss_ctx_id_t actx = GSS_C_NO_CONTEXT;
	gss_name_t client = GSS_C_NO_NAME;
	uint8_t server[16384];
	size_t slen = 0;
	bool done = false, first = true;
	int stage = 0;

	if (!s)
		fail_msg("km_sasl_new_gssapi: %s", err);
	for (int round = 0; round < 8 && !done; round++) {
		km_wr out;
		gss_buffer_desc ib, ob = GSS_C_EMPTY_BUFFER;
		km_wr_init(&out);
		if (km_sasl_step(s, first ? NULL : server, slen, &out, &done) != KM_OK)
			fail_msg("step %d: %s", round, km_sasl_reason(s));
		first = false;
		if (done) {
			km_wr_free(&out);
			break;
		}
		ib.length = out.len;
		ib.value = out.buf;
		if (stage == 0) {
			maj = gss_accept_sec_context(&min, &actx, GSS_C_NO_CREDENTIAL, &ib, GSS_C_NO_CHANNEL_BINDINGS,
						     &client, NULL, &ob, NULL, NULL, NULL);
			assert_false(GSS_ERROR(maj));
			if (maj == GSS_S_COMPLETE)
				stage = 1;
		} else if (stage == 1) {
			uint8_t offer[4] = {1 | 2, 0, 1, 0};
			gss_buffer_desc oi = {sizeof(offer), offer};
			assert_int_equal(out.len, 0); /* the client asks for the offer with an empty message */
			maj = gss_wrap(&min, actx, 0, GSS_C_QOP_DEFAULT, &oi, NULL, &ob);
			assert_false(GSS_ERROR(maj));
			stage = 2;
		} else {
			gss_buffer_desc u = GSS_C_EMPTY_BUFFER;
			maj = gss_unwrap(&min, actx, &ib, &u, NULL, NULL);
			assert_false(GSS_ERROR(maj));
			/* No security layer, no buffer, no authorization id. */
			assert_int_equal(u.length, 4);
			assert_memory_equal(u.value, "\x01\x00\x00\x00", 4);
			gss_release_buffer(&min, &u);
			stage = 3;
		}
		km_wr_free(&out);
		assert_true(ob.length <= sizeof(server));
		if (ob.length)
			memcpy(server, ob.value, ob.length);
		slen = ob.length;
		gss_release_buffer(&min, &ob);
	}
	assert_true(done);
	assert_int_equal(stage, 3);
	{
		gss_buffer_desc nm;
		assert_false(GSS_ERROR(gss_display_name(&min, client, &nm, NULL)));
		snprintf(who, wholen, "%.*s", (int)nm.length, (const char *)nm.value);
		gss_release_buffer(&min, &nm);
	}
	gss_release_name(&min, &client);
	gss_delete_sec_context(&min, &actx, GSS_C_NO_BUFFER);
	km_sasl_free(s);
}

/* When the TGT in the process's memory cache for the test's identity expires (0: none there). */
static krb5_timestamp tgt_end(void)
{
	km_sasl_krb5 k = {"kafka", keytab, principal, "test"};
	char name[128];
	krb5_context kc;
	krb5_ccache cc;
	krb5_cc_cursor cur;
	krb5_creds cr;
	krb5_timestamp end = 0;

	km_sasl_krb5_ccache(&k, name, sizeof(name));
	assert_int_equal(krb5_init_context(&kc), 0);
	assert_int_equal(krb5_cc_resolve(kc, name, &cc), 0);
	if (krb5_cc_start_seq_get(kc, cc, &cur) == 0) {
		while (krb5_cc_next_cred(kc, cc, &cur, &cr) == 0) {
			if (cr.server->length == 2 && !strncmp(cr.server->data[0].data, "krbtgt", 6) &&
			    cr.times.endtime > end)
				end = cr.times.endtime;
			krb5_free_cred_contents(kc, &cr);
		}
		krb5_cc_end_seq_get(kc, cc, &cur);
	}
	krb5_cc_close(kc, cc);
	krb5_free_context(kc);
	return end;
}

static void test_exchange_and_renewal(void **state)
{
	const char *life_s = getenv("KM_TEST_KRB5_LIFE_S");
	char who[300];
	krb5_timestamp first_end;
	(void)state;

	if (!keytab || !principal) {
		skip();
		return;
	}
	exchange(who, sizeof(who));
	assert_string_equal(who, principal);
	first_end = tgt_end();
	assert_true(first_end > 0);
	if (!life_s)
		return;
	/* Past the first tickets' end: the next exchange needs tickets got again from the keytab. */
	sleep((unsigned)atoi(life_s) + 2);
	assert_true(time(NULL) > first_end);
	exchange(who, sizeof(who));
	assert_string_equal(who, principal);
	assert_true(tgt_end() > first_end);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_exchange_and_renewal),
	};
	keytab = getenv("KM_TEST_KRB5_KEYTAB");
	principal = getenv("KM_TEST_KRB5_PRINCIPAL");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
