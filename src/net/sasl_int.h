/* What src/net/sasl.c's providers share: the GSSAPI provider's door (GSS-API types stay in sasl_gssapi.c), OAUTHBEARER's helpers, the JAAS line. */
#ifndef KM_NET_SASL_INT_H
#define KM_NET_SASL_INT_H

#include "kmirror/net.h"

typedef struct km_sasl_gss km_sasl_gss;

/* NULL with a one-line reason in err. */
km_sasl_gss *km_sasl_gss_new(const char *host, const km_sasl_krb5 *k, char *err, size_t errlen);
/* One RFC 4752 step; KM_ERR_SASL with the reason in err. */
km_err km_sasl_gss_step(km_sasl_gss *g, const uint8_t *in, size_t inlen, km_wr *out, bool *done, char *err,
			size_t errlen);
void km_sasl_gss_free(km_sasl_gss *g);

/*
 * A JAAS line of the login module module ("com.sun.security.auth.module.Krb5LoginModule"; the
 * package may be left out) for mechanism (named in the errors): the values of keys[0..n) into
 * vals (owned, NULL when absent; free with km_sasl_jaas_free), other options ignored (the Java
 * login's own). KM_ERR_CONFIG with a one-line reason, vals all NULL.
 */
km_err km_sasl_jaas_options(const char *jaas, const char *module, const char *mechanism, const char *const *keys,
			    char **vals, size_t n, char *err, size_t errlen);
/* Wipes (a value may be a secret) and frees vals[0..n), setting them NULL. */
void km_sasl_jaas_free(char **vals, size_t n);

/*
 * The server's OAUTHBEARER error (RFC 7628 3.2.2: a JSON object with status, scope,
 * openid-configuration) as a few words for the reason ("the broker refused the token: status
 * invalid_token").
 */
void km_sasl_oauth_server_error(const uint8_t *in, size_t len, char *out, size_t outlen);

#endif
