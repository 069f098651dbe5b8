/* SASL client mechanisms as providers: PLAIN (RFC 4616), SCRAM-SHA-256/512 (RFC 5802, 7677) over OpenSSL, GSSAPI (sasl_gssapi.c), OAUTHBEARER (RFC 7628). */
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "kmirror/net.h"
#include "net/sasl_int.h"

typedef struct sasl_provider {
	const char *name;
	const EVP_MD *(*md)(void); /* SCRAM hash; NULL for PLAIN */
	km_err (*step)(km_sasl *s, const uint8_t *in, size_t inlen, km_wr *out, bool *done);
} sasl_provider;

struct km_sasl {
	const sasl_provider *p;
	char *user;
	char *password;
	int stage;
	char nonce[64];
	char *client_first_bare;
	uint8_t server_signature[EVP_MAX_MD_SIZE];
	unsigned sig_len;
	km_sasl_gss *gss;
	char reason[300];
};

/* ---- PLAIN ---- */

static km_err plain_step(km_sasl *s, const uint8_t *in, size_t inlen, km_wr *out, bool *done)
{
	size_t ul = strlen(s->user), pl = strlen(s->password);
	*done = false;
	if (s->stage++ == 0) {
		km_wr_i8(out, 0); /* empty authzid */
		km_wr_raw(out, s->user, ul);
		km_wr_i8(out, 0);
		km_wr_raw(out, s->password, pl);
		return km_wr_ok(out) ? KM_OK : KM_ERR_NOMEM;
	}
	*done = true; /* the broker's answer to PLAIN carries nothing */
	return KM_OK;
}

/* ---- SCRAM ---- */

static void b64(const uint8_t *in, size_t n, char *out)
{
	EVP_EncodeBlock((unsigned char *)out, in, (int)n);
}

static int unb64(const char *in, size_t n, uint8_t *out, size_t cap)
{
	int len;
	size_t pad = 0;
	if (n % 4 || (n / 4) * 3 > cap)
		return -1;
	len = EVP_DecodeBlock(out, (const unsigned char *)in, (int)n);
	if (len < 0)
		return -1;
	if (n && in[n - 1] == '=')
		pad++;
	if (n > 1 && in[n - 2] == '=')
		pad++;
	return len - (int)pad;
}

/* Value of attribute "k=" in a comma-separated SCRAM message, or NULL. */
static const char *attr(const char *msg, size_t len, char k, size_t *vlen)
{
	size_t i = 0;
	while (i < len) {
		size_t j = i;
		while (j < len && msg[j] != ',')
			j++;
		if (j - i >= 2 && msg[i] == k && msg[i + 1] == '=') {
			*vlen = j - i - 2;
			return msg + i + 2;
		}
		i = j + 1;
	}
	return NULL;
}

/* The keys derived from the password: each logs in as the user as well as the password does. */
typedef struct scram_keys {
	uint8_t salted[EVP_MAX_MD_SIZE], ckey[EVP_MAX_MD_SIZE], skey[EVP_MAX_MD_SIZE];
	uint8_t stored[EVP_MAX_MD_SIZE], csig[EVP_MAX_MD_SIZE], proof[EVP_MAX_MD_SIZE];
} scram_keys;

/* server-first (r=nonce, ours + the server's; s=salt; i=iterations) in, client-final out. */
static km_err scram_final(km_sasl *s, const EVP_MD *md, unsigned dl, const char *msg, size_t inlen, km_wr *out)
{
	const char *r, *salt64, *it;
	size_t rl, sl, il;
	uint8_t salt[128];
	scram_keys k;
	char itbuf[16], proof64[EVP_MAX_MD_SIZE * 2], *final_bare, *auth;
	long iters;
	int saltlen;
	unsigned n;
	km_err rc = KM_ERR_SASL;

	r = attr(msg, inlen, 'r', &rl);
	salt64 = attr(msg, inlen, 's', &sl);
	it = attr(msg, inlen, 'i', &il);
	if (!r || !salt64 || !it || il == 0 || il >= sizeof(itbuf) || rl <= strlen(s->nonce) ||
	    memcmp(r, s->nonce, strlen(s->nonce)) != 0)
		return KM_ERR_SASL;
	memcpy(itbuf, it, il);
	itbuf[il] = '\0';
	iters = strtol(itbuf, NULL, 10);
	/* Bounded: a hostile server must not make us spin for minutes. */
	if (iters < 1 || iters > 1000000)
		return KM_ERR_SASL;
	saltlen = unb64(salt64, sl, salt, sizeof(salt));
	if (saltlen <= 0)
		return KM_ERR_SASL;
	final_bare = malloc(rl + 16);
	auth = malloc(strlen(s->client_first_bare) + inlen + rl + 24);
	if (!final_bare || !auth) {
		rc = KM_ERR_NOMEM;
		goto out;
	}
	if (PKCS5_PBKDF2_HMAC(s->password, (int)strlen(s->password), salt, saltlen, (int)iters, md, (int)dl,
			      k.salted) != 1)
		goto out;
	HMAC(md, k.salted, (int)dl, (const unsigned char *)"Client Key", 10, k.ckey, &n);
	HMAC(md, k.salted, (int)dl, (const unsigned char *)"Server Key", 10, k.skey, &n);
	EVP_Digest(k.ckey, dl, k.stored, &n, md, NULL);
	/* client-final-without-proof: c=base64("n,,") r=nonce */
	sprintf(final_bare, "c=biws,r=%.*s", (int)rl, r);
	sprintf(auth, "%s,%.*s,%s", s->client_first_bare, (int)inlen, msg, final_bare);
	HMAC(md, k.stored, (int)dl, (const unsigned char *)auth, strlen(auth), k.csig, &n);
	for (unsigned i = 0; i < dl; i++)
		k.proof[i] = k.ckey[i] ^ k.csig[i];
	HMAC(md, k.skey, (int)dl, (const unsigned char *)auth, strlen(auth), s->server_signature, &s->sig_len);
	b64(k.proof, dl, proof64);
	km_wr_raw(out, final_bare, strlen(final_bare));
	km_wr_raw(out, ",p=", 3);
	km_wr_raw(out, proof64, strlen(proof64));
	s->stage = 2;
	rc = km_wr_ok(out) ? KM_OK : KM_ERR_NOMEM;
out:
	OPENSSL_cleanse(&k, sizeof(k));
	free(final_bare);
	free(auth);
	return rc;
}

static km_err scram_step(km_sasl *s, const uint8_t *in, size_t inlen, km_wr *out, bool *done)
{
	const EVP_MD *md = s->p->md();
	unsigned dl = (unsigned)EVP_MD_size(md);
	*done = false;

	if (s->stage == 0) {
		/* client-first: gs2 header "n,," then n=user (with = and , escaped), r=nonce */
		size_t ul = strlen(s->user);
		char *bare = malloc(ul * 3 + sizeof(s->nonce) + 8), *p;
		if (!bare)
			return KM_ERR_NOMEM;
		if (!s->nonce[0]) {
			uint8_t rnd[24];
			if (RAND_bytes(rnd, sizeof(rnd)) != 1) {
				free(bare);
				return KM_ERR_SASL;
			}
			b64(rnd, sizeof(rnd), s->nonce);
		}
		p = bare + sprintf(bare, "n=");
		for (size_t i = 0; i < ul; i++) {
			if (s->user[i] == '=')
				p += sprintf(p, "=3D");
			else if (s->user[i] == ',')
				p += sprintf(p, "=2C");
			else
				*p++ = s->user[i];
		}
		sprintf(p, ",r=%s", s->nonce);
		s->client_first_bare = bare;
		km_wr_raw(out, "n,,", 3);
		km_wr_raw(out, bare, strlen(bare));
		s->stage = 1;
		return km_wr_ok(out) ? KM_OK : KM_ERR_NOMEM;
	}
	if (s->stage == 1)
		return scram_final(s, md, dl, (const char *)in, inlen, out);
	if (s->stage == 2) {
		/* server-final: v=signature proves the server knew the password too */
		size_t vl;
		const char *v = attr((const char *)in, inlen, 'v', &vl);
		uint8_t sig[EVP_MAX_MD_SIZE + 3];
		int n = v ? unb64(v, vl, sig, sizeof(sig)) : -1;
		if (n != (int)s->sig_len || CRYPTO_memcmp(sig, s->server_signature, s->sig_len) != 0)
			return KM_ERR_SASL;
		s->stage = 3;
		*done = true;
		return KM_OK;
	}
	return KM_ERR_SASL;
}

/* ---- OAUTHBEARER ---- */

/*
 * The initial response carries the token (gs2 header without authzid, then auth=Bearer). An empty
 * answer is success; a JSON error is answered with a lone 0x01 (RFC 7628 3.2.3), after which the
 * server fails the exchange: its words go to the reason.
 */
static km_err oauthbearer_step(km_sasl *s, const uint8_t *in, size_t inlen, km_wr *out, bool *done)
{
	*done = false;
	if (s->stage == 0) {
		static const char head[] = "n,,\x01" "auth=Bearer ";
		km_wr_raw(out, head, sizeof(head) - 1);
		km_wr_raw(out, s->password, strlen(s->password));
		km_wr_raw(out, "\x01\x01", 2);
		s->stage = 1;
		return km_wr_ok(out) ? KM_OK : KM_ERR_NOMEM;
	}
	if (s->stage == 1 && inlen == 0) {
		s->stage = 2;
		*done = true;
		return KM_OK;
	}
	if (s->stage == 1) {
		km_sasl_oauth_server_error(in, inlen, s->reason, sizeof(s->reason));
		km_wr_i8(out, 1);
		s->stage = 3;
		return km_wr_ok(out) ? KM_OK : KM_ERR_NOMEM;
	}
	return KM_ERR_SASL;
}

/* ---- GSSAPI ---- */

static km_err gssapi_step(km_sasl *s, const uint8_t *in, size_t inlen, km_wr *out, bool *done)
{
	return km_sasl_gss_step(s->gss, in, inlen, out, done, s->reason, sizeof(s->reason));
}

static const sasl_provider providers[] = {
	{"PLAIN", NULL, plain_step},
	{"GSSAPI", NULL, gssapi_step},
	{"SCRAM-SHA-256", EVP_sha256, scram_step},
	{"SCRAM-SHA-512", EVP_sha512, scram_step},
	{"OAUTHBEARER", NULL, oauthbearer_step},
};

bool km_sasl_mechanism_supported(const char *mech)
{
	for (size_t i = 0; i < sizeof(providers) / sizeof(providers[0]); i++)
		if (strcmp(providers[i].name, mech) == 0)
			return true;
	return false;
}

km_sasl *km_sasl_new(const char *mechanism, const char *user, const char *password)
{
	km_sasl *s;
	const sasl_provider *p = NULL;
	for (size_t i = 0; i < sizeof(providers) / sizeof(providers[0]); i++)
		if (strcmp(providers[i].name, mechanism) == 0)
			p = &providers[i];
	if (!p || p->step == gssapi_step || !(s = calloc(1, sizeof(*s))))
		return NULL;
	s->p = p;
	s->user = strdup(user ? user : "");
	s->password = strdup(password ? password : "");
	if (!s->user || !s->password) {
		km_sasl_free(s);
		return NULL;
	}
	return s;
}

km_sasl *km_sasl_new_gssapi(const char *host, const km_sasl_krb5 *k, char *err, size_t errlen)
{
	km_sasl *s = calloc(1, sizeof(*s));

	if (!s) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	for (size_t i = 0; i < sizeof(providers) / sizeof(providers[0]); i++)
		if (providers[i].step == gssapi_step)
			s->p = &providers[i];
	if (!(s->gss = km_sasl_gss_new(host, k, err, errlen))) {
		free(s);
		return NULL;
	}
	return s;
}

const char *km_sasl_reason(const km_sasl *s)
{
	return s->reason;
}

void km_sasl_set_nonce(km_sasl *s, const char *nonce)
{
	snprintf(s->nonce, sizeof(s->nonce), "%s", nonce);
}

km_err km_sasl_step(km_sasl *s, const uint8_t *in, size_t inlen, km_wr *out, bool *done)
{
	return s->p->step(s, in, inlen, out, done);
}

void km_sasl_free(km_sasl *s)
{
	if (!s)
		return;
	if (s->password) {
		OPENSSL_cleanse(s->password, strlen(s->password));
		free(s->password);
	}
	free(s->user);
	free(s->client_first_bare);
	km_sasl_gss_free(s->gss);
	free(s);
}
