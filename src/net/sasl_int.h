/* What src/net/sasl.c's providers share: the GSSAPI provider's door (GSS-API types stay in sasl_gssapi.c), OAUTHBEARER's helpers, one error helper. */
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

/* One line into err (printf style); returns KM_ERR_CONFIG, for the providers' configuration errors. */
km_err km_sasl_fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/*
 * The server's OAUTHBEARER error (RFC 7628 3.2.2: a JSON object with status, scope,
 * openid-configuration) as a few words for the reason ("the broker refused the token: status
 * invalid_token").
 */
void km_sasl_oauth_server_error(const uint8_t *in, size_t len, char *out, size_t outlen);

#endif
