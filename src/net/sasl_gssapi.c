/* SASL GSSAPI (RFC 4752) over MIT Kerberos: keytab credentials in a private memory cache, Kafka's Krb5LoginModule line. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <gssapi/gssapi.h>
#include <gssapi/gssapi_ext.h>
#include <gssapi/gssapi_krb5.h>
#include <krb5.h>

#include "net/sasl_int.h"

struct km_sasl_gss {
	gss_cred_id_t cred;
	gss_name_t target;
	gss_ctx_id_t ctx;
	int stage; /* 0: context being established, 1: the server's security layer offer due, 2: its final answer */
	char target_text[300];
};

/* GSS-API's own words for a failure: the mechanism's (minor) message when there is one, else the major's. */
static void gss_why(OM_uint32 major, OM_uint32 minor, char *out, size_t len)
{
	OM_uint32 min2, ctx = 0;
	gss_buffer_desc msg = GSS_C_EMPTY_BUFFER;
	int type = minor ? GSS_C_MECH_CODE : GSS_C_GSS_CODE;
	OM_uint32 code = minor ? minor : major;

	out[0] = 0;
	if (gss_display_status(&min2, code, type, GSS_C_NO_OID, &ctx, &msg) == GSS_S_COMPLETE && msg.length) {
		snprintf(out, len, "%.*s", (int)msg.length, (const char *)msg.value);
		gss_release_buffer(&min2, &msg);
	} else {
		snprintf(out, len, "GSS-API error %u/%u", major, minor);
	}
}

static const char *setting_of(const km_sasl_krb5 *k)
{
	return k->setting && *k->setting ? k->setting : "the Kerberos settings";
}

km_err km_sasl_krb5_check(const km_sasl_krb5 *k, char *err, size_t errlen)
{
	krb5_context kc = NULL;
	krb5_keytab kt = NULL;
	krb5_principal pr = NULL;
	krb5_keytab_entry ent;
	char name[4200];
	krb5_error_code kr;
	km_err rc = KM_ERR_CONFIG;

	if (!k->keytab || !*k->keytab) {
		if (k->principal && *k->principal) {
			km_sasl_fail(err, errlen, "%s: principal %s without a keytab: name the keytab that holds its key",
			     setting_of(k), k->principal);
			return KM_ERR_CONFIG;
		}
		return KM_OK; /* the default credentials: kinit's, found when connecting */
	}
	if (!k->principal || !*k->principal) {
		km_sasl_fail(err, errlen, "%s: keytab %s without a principal: name the principal whose key it holds",
		     setting_of(k), k->keytab);
		return KM_ERR_CONFIG;
	}
	/* Checked here first: krb5 says "Key table file not found" without the name. */
	if (access(k->keytab, R_OK) != 0) {
		km_sasl_fail(err, errlen,
		     "%s: keytab %s: %s: give a keytab file this process can read (ktutil or kadmin ktadd "
		     "make one)",
		     setting_of(k), k->keytab, strerror(errno));
		return KM_ERR_CONFIG;
	}
	if ((kr = krb5_init_context(&kc)) != 0) {
		km_sasl_fail(err, errlen, "%s: Kerberos library: %s", setting_of(k), strerror(kr));
		return KM_ERR_CONFIG;
	}
	snprintf(name, sizeof(name), "FILE:%s", k->keytab);
	if ((kr = krb5_kt_resolve(kc, name, &kt)) != 0 || (kr = krb5_parse_name(kc, k->principal, &pr)) != 0) {
		const char *m = krb5_get_error_message(kc, kr);
		km_sasl_fail(err, errlen, "%s: %s %s: %s", setting_of(k), kt ? "principal" : "keytab",
		     kt ? k->principal : k->keytab, m);
		krb5_free_error_message(kc, m);
		goto out;
	}
	kr = krb5_kt_get_entry(kc, kt, pr, 0, 0, &ent);
	if (kr == 0) {
		krb5_free_keytab_entry_contents(kc, &ent);
		rc = KM_OK;
	} else if (kr == KRB5_KT_NOTFOUND || kr == ENOENT) {
		km_sasl_fail(err, errlen, "%s: keytab %s holds no key for %s: name the principal it holds (klist -k %s)",
		     setting_of(k), k->keytab, k->principal, k->keytab);
	} else {
		const char *m = krb5_get_error_message(kc, kr);
		km_sasl_fail(err, errlen, "%s: keytab %s: %s: give a keytab file (ktutil or kadmin ktadd make one)",
		     setting_of(k), k->keytab, m);
		krb5_free_error_message(kc, m);
	}
out:
	if (pr)
		krb5_free_principal(kc, pr);
	if (kt)
		krb5_kt_close(kc, kt);
	krb5_free_context(kc);
	return rc;
}

/* One memory cache per keytab and principal in this process: connections share its tickets. */
void km_sasl_krb5_ccache(const km_sasl_krb5 *k, char *out, size_t len)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	for (const char *p = k->keytab; *p; p++)
		h = (h ^ (uint8_t)*p) * 1099511628211ull;
	h = (h ^ 0xff) * 1099511628211ull;
	for (const char *p = k->principal; *p; p++)
		h = (h ^ (uint8_t)*p) * 1099511628211ull;
	snprintf(out, len, "MEMORY:kmirror-%d-%016llx", (int)getpid(), (unsigned long long)h);
}

km_sasl_gss *km_sasl_gss_new(const char *host, const km_sasl_krb5 *k, char *err, size_t errlen)
{
	km_sasl_gss *g;
	OM_uint32 major, minor;
	gss_buffer_desc nb;
	gss_OID_set_desc mechs = {1, (gss_OID)gss_mech_krb5};
	const char *svc = k->service_name && *k->service_name ? k->service_name : "kafka";
	char why[300];

	if (km_sasl_krb5_check(k, err, errlen) != KM_OK)
		return NULL;
	if (!(g = calloc(1, sizeof(*g)))) {
		km_sasl_fail(err, errlen, "out of memory");
		return NULL;
	}
	g->cred = GSS_C_NO_CREDENTIAL;
	g->target = GSS_C_NO_NAME;
	g->ctx = GSS_C_NO_CONTEXT;
	snprintf(g->target_text, sizeof(g->target_text), "%s@%s", svc, host);
	nb.value = g->target_text;
	nb.length = strlen(g->target_text);
	major = gss_import_name(&minor, &nb, GSS_C_NT_HOSTBASED_SERVICE, &g->target);
	if (GSS_ERROR(major)) {
		gss_why(major, minor, why, sizeof(why));
		km_sasl_fail(err, errlen, "service name %s: %s", g->target_text, why);
		goto fail;
	}
	if (k->keytab && *k->keytab) {
		char cc[128];
		gss_name_t me = GSS_C_NO_NAME;
		gss_key_value_element_desc el[2];
		gss_key_value_set_desc store = {2, el};

		km_sasl_krb5_ccache(k, cc, sizeof(cc));
		el[0].key = "client_keytab";
		el[0].value = k->keytab;
		el[1].key = "ccache";
		el[1].value = cc;
		nb.value = (void *)k->principal;
		nb.length = strlen(k->principal);
		major = gss_import_name(&minor, &nb, GSS_KRB5_NT_PRINCIPAL_NAME, &me);
		if (!GSS_ERROR(major))
			major = gss_acquire_cred_from(&minor, me, GSS_C_INDEFINITE, &mechs, GSS_C_INITIATE, &store,
						      &g->cred, NULL, NULL);
		if (me != GSS_C_NO_NAME) {
			OM_uint32 min2;
			gss_release_name(&min2, &me);
		}
		if (GSS_ERROR(major)) {
			gss_why(major, minor, why, sizeof(why));
			km_sasl_fail(err, errlen, "%s: credentials of %s from keytab %s: %s", setting_of(k), k->principal,
			     k->keytab, why);
			goto fail;
		}
	}
	return g;
fail:
	km_sasl_gss_free(g);
	return NULL;
}

/* The context's next token from the server's (NULL at first); *complete once established. */
static km_err gss_context_step(km_sasl_gss *g, const uint8_t *in, size_t inlen, km_wr *out, char *err, size_t errlen)
{
	OM_uint32 major, minor, rflags = 0;
	gss_buffer_desc ib = {inlen, (void *)in}, ob = GSS_C_EMPTY_BUFFER;
	char why[300];

	major = gss_init_sec_context(&minor, g->cred, &g->ctx, g->target, (gss_OID)gss_mech_krb5,
				     GSS_C_MUTUAL_FLAG | GSS_C_SEQUENCE_FLAG | GSS_C_INTEG_FLAG, 0,
				     GSS_C_NO_CHANNEL_BINDINGS, in ? &ib : GSS_C_NO_BUFFER, NULL, &ob, &rflags, NULL);
	if (GSS_ERROR(major)) {
		gss_why(major, minor, why, sizeof(why));
		km_sasl_fail(err, errlen, "Kerberos ticket for %s: %s", g->target_text, why);
		gss_release_buffer(&minor, &ob);
		return KM_ERR_SASL;
	}
	/* Complete with nothing to send: an empty response asks for the server's security layer offer. */
	km_wr_raw(out, ob.value, ob.length);
	gss_release_buffer(&minor, &ob);
	if (!(major & GSS_S_CONTINUE_NEEDED))
		g->stage = 1;
	return km_wr_ok(out) ? KM_OK : KM_ERR_NOMEM;
}

km_err km_sasl_gss_step(km_sasl_gss *g, const uint8_t *in, size_t inlen, km_wr *out, bool *done, char *err,
			size_t errlen)
{
	OM_uint32 major, minor;
	gss_buffer_desc ib = {inlen, (void *)in}, ub = GSS_C_EMPTY_BUFFER, wb = GSS_C_EMPTY_BUFFER;
	uint8_t layer[4];
	int conf = 0;
	char why[300];

	*done = false;
	if (g->stage == 0)
		return gss_context_step(g, in, inlen, out, err, errlen);
	if (g->stage == 1) {
		/* The offer: 4 bytes wrapped, the layers it supports and its largest buffer. */
		major = gss_unwrap(&minor, g->ctx, &ib, &ub, &conf, NULL);
		if (GSS_ERROR(major) || ub.length != 4) {
			if (GSS_ERROR(major))
				gss_why(major, minor, why, sizeof(why));
			km_sasl_fail(err, errlen, "the broker's security layer offer %s",
			     GSS_ERROR(major) ? why : "is not 4 bytes");
			gss_release_buffer(&minor, &ub);
			return KM_ERR_SASL;
		}
		if (!(((const uint8_t *)ub.value)[0] & 1)) {
			km_sasl_fail(err, errlen, "the broker requires a SASL security layer (Kafka's do not): not supported");
			gss_release_buffer(&minor, &ub);
			return KM_ERR_SASL;
		}
		gss_release_buffer(&minor, &ub);
		/* No security layer, no buffer size, no authorization id: the broker takes the ticket's principal. */
		layer[0] = 1;
		layer[1] = layer[2] = layer[3] = 0;
		ib.value = layer;
		ib.length = sizeof(layer);
		major = gss_wrap(&minor, g->ctx, 0, GSS_C_QOP_DEFAULT, &ib, NULL, &wb);
		if (GSS_ERROR(major)) {
			gss_why(major, minor, why, sizeof(why));
			km_sasl_fail(err, errlen, "wrapping the security layer answer: %s", why);
			return KM_ERR_SASL;
		}
		km_wr_raw(out, wb.value, wb.length);
		gss_release_buffer(&minor, &wb);
		g->stage = 2;
		return km_wr_ok(out) ? KM_OK : KM_ERR_NOMEM;
	}
	if (g->stage == 2) {
		g->stage = 3;
		*done = true; /* the broker's last SaslAuthenticate answer carries nothing */
		return KM_OK;
	}
	return KM_ERR_SASL;
}

void km_sasl_gss_free(km_sasl_gss *g)
{
	OM_uint32 minor;

	if (!g)
		return;
	if (g->ctx != GSS_C_NO_CONTEXT)
		gss_delete_sec_context(&minor, &g->ctx, GSS_C_NO_BUFFER);
	if (g->cred != GSS_C_NO_CREDENTIAL)
		gss_release_cred(&minor, &g->cred);
	if (g->target != GSS_C_NO_NAME)
		gss_release_name(&minor, &g->target);
	free(g);
}

/* ---- Kafka's JAAS line for GSSAPI ---- */

static bool is_true(const char *v)
{
	return v && !strcasecmp(v, "true");
}

km_err km_sasl_krb5_jaas(const char *jaas, char **keytab, char **principal, char **service, char *err, size_t errlen)
{
	static const char *const keys[] = {"keyTab", "principal", "serviceName", "useKeyTab", "useTicketCache"};
	char *v[5];
	char *use_keytab, *use_cache;
	km_err rc = KM_ERR_CONFIG;

	*keytab = *principal = *service = NULL;
	if (km_sasl_jaas_options(jaas, "com.sun.security.auth.module.Krb5LoginModule", "GSSAPI", keys, v, 5, err,
				 errlen) != KM_OK)
		return KM_ERR_CONFIG;
	*keytab = v[0];
	*principal = v[1];
	*service = v[2];
	use_keytab = v[3];
	use_cache = v[4];
	if (is_true(use_keytab) && (!*keytab || !**keytab)) {
		km_sasl_fail(err, errlen, "sasl.jaas.config: useKeyTab=true needs keyTab=\"/path/to/file.keytab\"");
		goto out;
	}
	if (!is_true(use_keytab) && *keytab) {
		km_sasl_fail(err, errlen, "sasl.jaas.config: keyTab is read only with useKeyTab=true");
		goto out;
	}
	if (is_true(use_keytab) && (!*principal || !**principal)) {
		km_sasl_fail(err, errlen,
		     "sasl.jaas.config: useKeyTab=true needs principal=\"name@REALM\" (the key's principal in "
		     "the keytab)");
		goto out;
	}
	if (!is_true(use_keytab) && !is_true(use_cache)) {
		km_sasl_fail(err, errlen,
		     "sasl.jaas.config: Krb5LoginModule needs useKeyTab=true with keyTab and principal, or "
		     "useTicketCache=true (kinit's credentials)");
		goto out;
	}
	if (!is_true(use_keytab)) {
		/* A principal with the ticket cache names which one the cache must hold: the cache decides here. */
		free(*principal);
		*principal = NULL;
	}
	rc = KM_OK;
out:
	free(use_keytab);
	free(use_cache);
	if (rc != KM_OK) {
		free(*keytab);
		free(*principal);
		free(*service);
		*keytab = *principal = *service = NULL;
	}
	return rc;
}
