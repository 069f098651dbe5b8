/* The GSSAPI provider's door for src/net/sasl.c (GSS-API types stay in src/net/sasl_gssapi.c). */
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

#endif
