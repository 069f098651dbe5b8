/* TLS contexts for client-facing listeners and upstream connections, and plain/TLS bufferevents behind one call. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/bufferevent_ssl.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/pkcs12.h>
#include <openssl/x509v3.h>

#include "kmirror/net.h"
#include "net_int.h"

const char *km_net_tls_error(char *buf, size_t len)
{
	unsigned long e;
	size_t n = 0;
	buf[0] = '\0';
	while ((e = ERR_get_error()) != 0) {
		char one[256];
		ERR_error_string_n(e, one, sizeof(one));
		if (n < len)
			n += (size_t)snprintf(buf + n, len - n, "%s%s", n ? "; " : "", one);
	}
	if (!buf[0])
		snprintf(buf, len, "no OpenSSL error");
	return buf;
}

km_err km_net_bev_error(struct bufferevent *bev, char *buf, size_t len)
{
	unsigned long e;
	size_t n = 0;
	int sock_err = EVUTIL_SOCKET_ERROR();
	km_err kind = KM_ERR_IO;

	buf[0] = '\0';
	while (bev && (e = bufferevent_get_openssl_error(bev)) != 0) {
		char one[256];
		if (ERR_GET_LIB(e) == 0)
			continue; /* libevent's own marker, not an OpenSSL reason */
#ifdef SSL_R_UNEXPECTED_EOF_WHILE_READING
		if (ERR_GET_LIB(e) == ERR_LIB_SSL && ERR_GET_REASON(e) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
			/* Kafka clients close without close_notify: an ordinary close. */
			snprintf(buf, len, "closed by peer");
			return KM_ERR_CLOSED;
		}
#endif
		if (ERR_GET_LIB(e) == ERR_LIB_SSL && ERR_GET_REASON(e) == SSL_R_WRONG_VERSION_NUMBER) {
			snprintf(buf, len, "not a TLS client (a plaintext Kafka client on a TLS port?)");
			return KM_ERR_TLS;
		}
		kind = KM_ERR_TLS;
		ERR_error_string_n(e, one, sizeof(one));
		if (n < len)
			n += (size_t)snprintf(buf + n, len - n, "%s%s", n ? "; " : "", one);
	}
	if (!buf[0] && sock_err)
		snprintf(buf, len, "%s", evutil_socket_error_to_string(sock_err));
	if (!buf[0]) {
		snprintf(buf, len, "closed by peer");
		return KM_ERR_CLOSED;
	}
	return kind;
}

static km_err store_fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t errlen, const char *what, const char *file)
{
	char tls[512];
	if (err && errlen)
		snprintf(err, errlen, "%s%s%s: %s", what, file ? " " : "", file ? file : "",
			 km_net_tls_error(tls, sizeof(tls)));
}

static km_err use_store(SSL_CTX *ctx, const km_net_tls_store *s, bool keystore, char *err, size_t errlen);

/*
 * f's CAs into ctx (a server verifies client certificates against them): a truststore, a CA file,
 * or, with fallback, the system store.
 */
static bool load_trust(SSL_CTX *ctx, const km_net_tls_files *f, bool fallback, char *err, size_t errlen)
{
	if (km_net_tls_store_given(&f->truststore))
		return use_store(ctx, &f->truststore, false, err, errlen) == KM_OK;
	if (f->ca_file) {
		if (SSL_CTX_load_verify_locations(ctx, f->ca_file, NULL) != 1) {
			set_err(err, errlen, "cannot load CA file", f->ca_file);
			return false;
		}
	} else if (fallback && SSL_CTX_set_default_verify_paths(ctx) != 1) {
		set_err(err, errlen, "cannot load the system CA store", NULL);
		return false;
	}
	return true;
}

/* f's key and certificate (chain) into ctx, when it gives them: a keystore, or the PEM files. */
static bool load_identity(SSL_CTX *ctx, const km_net_tls_files *f, char *err, size_t errlen)
{
	if (km_net_tls_store_given(&f->keystore))
		return use_store(ctx, &f->keystore, true, err, errlen) == KM_OK;
	if (!f->cert_file)
		return true;
	if (SSL_CTX_use_certificate_chain_file(ctx, f->cert_file) != 1) {
		set_err(err, errlen, "cannot load certificate", f->cert_file);
		return false;
	}
	if (SSL_CTX_use_PrivateKey_file(ctx, f->key_file, SSL_FILETYPE_PEM) != 1) {
		set_err(err, errlen, "cannot load private key", f->key_file);
		return false;
	}
	if (SSL_CTX_check_private_key(ctx) != 1) {
		set_err(err, errlen, "private key does not match certificate", f->key_file);
		return false;
	}
	return true;
}

SSL_CTX *km_net_tls_server_ctx(const km_net_tls_files *f, int client_auth, char *err, size_t errlen)
{
	SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
	if (!ctx) {
		set_err(err, errlen, "SSL_CTX_new", NULL);
		return NULL;
	}
	SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION);
	if (!f->cert_file && !km_net_tls_store_given(&f->keystore)) {
		store_fail(err, errlen, "a TLS listener needs a certificate and its key (a keystore, or PEM files)");
		goto fail;
	}
	if (!load_identity(ctx, f, err, errlen) || !load_trust(ctx, f, false, err, errlen))
		goto fail;
	if (client_auth == 1)
		SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
	else if (client_auth == 2)
		SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
	return ctx;
fail:
	SSL_CTX_free(ctx);
	return NULL;
}

SSL_CTX *km_net_tls_client_ctx(const km_net_tls_files *f, bool verify, char *err, size_t errlen)
{
	SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
	if (!ctx) {
		set_err(err, errlen, "SSL_CTX_new", NULL);
		return NULL;
	}
	SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	if (!load_trust(ctx, f, true, err, errlen) || !load_identity(ctx, f, err, errlen)) {
		SSL_CTX_free(ctx);
		return NULL;
	}
	SSL_CTX_set_verify(ctx, verify ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, NULL);
	return ctx;
}

/* ---- Java-style trust and key stores ---- */

#define MAX_STORE_FILE (16 * 1024 * 1024) /* a store is small; refuse anything bigger */

static km_err store_fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	ERR_clear_error();
	return KM_ERR_CONFIG;
}

/* What a store holds: a keystore's key and certificate, and the other certificates (a chain, or the trusted ones). */
typedef struct store_content {
	EVP_PKEY *key;
	X509 *cert;
	STACK_OF(X509) *certs;
} store_content;

static void store_content_free(store_content *c)
{
	EVP_PKEY_free(c->key);
	X509_free(c->cert);
	sk_X509_pop_free(c->certs, X509_free);
}

/* The whole file in *buf (to free with OPENSSL_clear_free: it may hold a plain key). */
static km_err read_store(const char *path, const char *what, unsigned char **buf, size_t *len, char *err,
			 size_t errlen)
{
	FILE *f = fopen(path, "rb");
	long n = -1;

	if (!f)
		return store_fail(err, errlen, "cannot read the %s %s: %s", what, path, strerror(errno));
	if (fseek(f, 0, SEEK_END) == 0)
		n = ftell(f);
	*buf = n >= 0 && n <= MAX_STORE_FILE && fseek(f, 0, SEEK_SET) == 0 ? malloc((size_t)n + 1) : NULL;
	if (!*buf || fread(*buf, 1, (size_t)n, f) != (size_t)n) {
		fclose(f);
		OPENSSL_clear_free(*buf, *buf ? (size_t)n + 1 : 0);
		return store_fail(err, errlen, "cannot read the %s %s: not a file of at most 16 MiB", what, path);
	}
	fclose(f);
	(*buf)[n] = 0;
	*len = (size_t)n;
	return KM_OK;
}

/* A JKS or JCEKS store (Java's own formats, which OpenSSL does not read) or a PEM file is refused with what to do. */
static km_err not_pkcs12(const unsigned char *p, size_t len, const char *path, const char *what, char *err,
			 size_t errlen)
{
	uint32_t magic = len >= 4 ? (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3] : 0;
	size_t base = strlen(path);

	if (base > 4 && !strcasecmp(path + base - 4, ".jks"))
		base -= 4;
	if (magic == 0xfeedfeed || magic == 0xcececece)
		return store_fail(err, errlen,
				  "the %s %s is a %s keystore, which OpenSSL cannot read: convert it to PKCS12 with "
				  "keytool -importkeystore -srckeystore %s%s -destkeystore %.*s.p12 -deststoretype PKCS12",
				  what, path, magic == 0xfeedfeed ? "JKS" : "JCEKS", path,
				  magic == 0xfeedfeed ? "" : " -srcstoretype JCEKS", (int)base, path);
	if (len >= 10 && !memcmp(p, "-----BEGIN", 10))
		return store_fail(err, errlen, "the %s %s is a PEM file: set its type to PEM (ssl.%s.type=PEM)", what, path,
				  what);
	return KM_OK;
}

/* The PKCS12 store in path; with pass, its integrity checked first (for a clear wrong-password error). */
static PKCS12 *open_pkcs12(const char *path, const char *what, const char *pass, char *err, size_t errlen)
{
	unsigned char *buf;
	const unsigned char *q;
	size_t len;
	PKCS12 *p12 = NULL;

	if (read_store(path, what, &buf, &len, err, errlen) != KM_OK)
		return NULL;
	if (not_pkcs12(buf, len, path, what, err, errlen) == KM_OK) {
		q = buf;
		if (!(p12 = d2i_PKCS12(NULL, &q, (long)len)))
			store_fail(err, errlen, "the %s %s is not a PKCS12 file (or JKS, or PEM)", what, path);
	}
	OPENSSL_clear_free(buf, len + 1);
	if (p12 && pass && PKCS12_mac_present(p12) && PKCS12_verify_mac(p12, pass, -1) != 1) {
		store_fail(err, errlen, "cannot open the PKCS12 %s %s: wrong password? (mac verify failure)", what, path);
		PKCS12_free(p12);
		return NULL;
	}
	return p12;
}

/*
 * The certificates of p12's certificate bags (keytool's trusted certificates have no key: PKCS12_parse
 * would do, but needs the password). Without pass, only the unencrypted ones, as Java reads a
 * truststore without a password; *locked then says some were left encrypted.
 */
static STACK_OF(X509) *pkcs12_certs(PKCS12 *p12, const char *pass, bool *locked)
{
	STACK_OF(PKCS7) *safes = PKCS12_unpack_authsafes(p12);
	STACK_OF(X509) *certs = sk_X509_new_null();

	*locked = false;
	for (int i = 0; safes && certs && i < sk_PKCS7_num(safes); i++) {
		PKCS7 *p7 = sk_PKCS7_value(safes, i);
		STACK_OF(PKCS12_SAFEBAG) *bags = NULL;

		if (PKCS7_type_is_data(p7))
			bags = PKCS12_unpack_p7data(p7);
		else if (PKCS7_type_is_encrypted(p7) && pass)
			bags = PKCS12_unpack_p7encdata(p7, pass, -1);
		else if (PKCS7_type_is_encrypted(p7))
			*locked = true;
		for (int j = 0; bags && j < sk_PKCS12_SAFEBAG_num(bags); j++) {
			const PKCS12_SAFEBAG *bag = sk_PKCS12_SAFEBAG_value(bags, j);
			X509 *x;
			if (PKCS12_SAFEBAG_get_nid(bag) != NID_certBag ||
			    PKCS12_SAFEBAG_get_bag_nid(bag) != NID_x509Certificate || !(x = PKCS12_SAFEBAG_get1_cert(bag)))
				continue;
			if (!sk_X509_push(certs, x))
				X509_free(x);
		}
		sk_PKCS12_SAFEBAG_pop_free(bags, PKCS12_SAFEBAG_free);
	}
	sk_PKCS7_pop_free(safes, PKCS7_free);
	return certs;
}

/* The PEM certificates in text (other blocks, such as a key, are skipped). */
static STACK_OF(X509) *pem_certs(const char *text, size_t len)
{
	BIO *b = BIO_new_mem_buf(text, (int)len);
	STACK_OF(X509) *certs = sk_X509_new_null();
	X509 *x;

	while (b && certs && (x = PEM_read_bio_X509(b, NULL, NULL, NULL)))
		if (!sk_X509_push(certs, x)) {
			X509_free(x);
			break;
		}
	ERR_clear_error(); /* the read after the last one finds no start line */
	BIO_free(b);
	return certs;
}

/* An encrypted PEM key's password: u, or none (never a prompt on the terminal). */
static int pem_password(char *buf, int size, int rwflag, void *u)
{
	size_t n = u ? strlen(u) : 0;
	(void)rwflag;
	if (!u || n > (size_t)size)
		return -1;
	memcpy(buf, u, n);
	return (int)n;
}

/*
 * Inline PEM as Kafka takes it, where a properties value joined by line continuations has each block on
 * one line: every block's base64 on lines of its own, for OpenSSL. NULL: no memory. Free with
 * OPENSSL_clear_free(out, strlen(in) * 2 + 1): it may hold a key.
 */
static char *pem_reflow(const char *in)
{
	size_t n = strlen(in);
	char *out = malloc(n * 2 + 1), *o = out;
	const char *p = in, *head, *body, *foot;

	while (out && (head = strstr(p, "-----BEGIN ")) && (body = strstr(head + 11, "-----")) &&
	       (foot = strstr(body + 5, "-----END ")) && (p = strstr(foot + 9, "-----"))) {
		int col = 0;
		body += 5;
		p += 5;
		memcpy(o, head, (size_t)(body - head));
		o += body - head;
		*o++ = '\n';
		for (const char *q = body; q < foot; q++) {
			if (isspace((unsigned char)*q))
				continue;
			*o++ = *q;
			if (++col % 64 == 0)
				*o++ = '\n';
		}
		if (col % 64)
			*o++ = '\n';
		memcpy(o, foot, (size_t)(p - foot));
		o += p - foot;
		*o++ = '\n';
	}
	if (out)
		*o = 0;
	return out;
}

/* A PEM store: a file, or inline certificates (and key); keystore: its key and first certificate apart. */
static km_err load_pem(const km_net_tls_store *s, const char *what, bool keystore, store_content *c, char *err,
		       size_t errlen)
{
	unsigned char *buf = NULL;
	size_t len = 0;
	const char *certs = s->certificates, *key = s->key;
	char *inline_certs = NULL, *inline_key = NULL;
	km_err rc = KM_OK;

	if (s->location) {
		if ((rc = read_store(s->location, what, &buf, &len, err, errlen)) != KM_OK)
			return rc;
		certs = key = (const char *)buf;
	} else if (!certs || (keystore && !key)) {
		return store_fail(err, errlen, "a PEM %s needs a file or its inline certificates%s", what,
				  keystore ? " and key" : "");
	} else if (!(inline_certs = pem_reflow(certs)) || (keystore && !(inline_key = pem_reflow(key)))) {
		rc = store_fail(err, errlen, "out of memory");
	} else {
		certs = inline_certs;
		key = inline_key;
	}
	if (rc == KM_OK && (!(c->certs = pem_certs(certs, strlen(certs))) || !sk_X509_num(c->certs)))
		rc = store_fail(err, errlen, "the PEM %s %s holds no certificate", what,
				s->location ? s->location : "(inline)");
	if (rc == KM_OK && keystore) {
		BIO *b = BIO_new_mem_buf(key, -1);
		c->cert = sk_X509_shift(c->certs);
		if (!b || !(c->key = PEM_read_bio_PrivateKey(b, NULL, pem_password, (void *)s->key_password))) {
			char why[256];
			snprintf(err, errlen, "cannot read the private key of the PEM keystore %s (%s): %s",
				 s->location ? s->location : "(inline)",
				 s->key_password ? "wrong key password?" : "no key, or no key password given",
				 km_net_tls_error(why, sizeof(why)));
			rc = KM_ERR_CONFIG;
		}
		BIO_free(b);
	}
	OPENSSL_clear_free(buf, buf ? len + 1 : 0);
	OPENSSL_clear_free(inline_certs, inline_certs ? strlen(s->certificates) * 2 + 1 : 0);
	OPENSSL_clear_free(inline_key, inline_key ? strlen(s->key) * 2 + 1 : 0);
	return rc;
}

/* A PKCS12 store: a truststore's certificates, a keystore's key, certificate and chain. */
static km_err load_pkcs12(const km_net_tls_store *s, const char *what, bool keystore, store_content *c, char *err,
			  size_t errlen)
{
	const char *pass = s->password ? s->password : s->key_password;
	PKCS12 *p12;
	bool locked;
	km_err rc = KM_OK;

	if (!s->location)
		return store_fail(err, errlen, "a PKCS12 %s is a file: inline certificates are of type PEM", what);
	if (keystore && s->password && s->key_password && strcmp(s->password, s->key_password))
		return store_fail(err, errlen, "the PKCS12 keystore %s: the key password differs from the store's, "
				  "and a PKCS12 store has one password (keytool ignores -keypass for PKCS12)", s->location);
	if (!(p12 = open_pkcs12(s->location, what, pass, err, errlen)))
		return KM_ERR_CONFIG;
	if (!keystore) {
		c->certs = pkcs12_certs(p12, pass, &locked);
		if ((!c->certs || !sk_X509_num(c->certs)) && locked)
			rc = store_fail(err, errlen, "the PKCS12 truststore %s keeps its certificates encrypted: give its "
					"password (ssl.truststore.password)", s->location);
		else if (!c->certs || !sk_X509_num(c->certs))
			rc = store_fail(err, errlen, "the PKCS12 truststore %s holds no certificate", s->location);
	} else if (PKCS12_parse(p12, pass, &c->key, &c->cert, &c->certs) != 1) {
		char why[256];
		snprintf(err, errlen, "cannot open the PKCS12 keystore %s%s: %s", s->location,
			 pass ? "" : " without a password", km_net_tls_error(why, sizeof(why)));
		rc = KM_ERR_CONFIG;
	} else if (!c->key || !c->cert) {
		rc = store_fail(err, errlen, "the PKCS12 keystore %s holds no private key with its certificate",
				s->location);
	}
	PKCS12_free(p12);
	return rc;
}

/* s's content; what names it ("truststore" or "keystore"). */
static km_err load_store(const km_net_tls_store *s, const char *what, bool keystore, store_content *c, char *err,
			 size_t errlen)
{
	memset(c, 0, sizeof(*c));
	if (!s->type || !strcasecmp(s->type, "PKCS12") || !strcasecmp(s->type, "JKS"))
		return load_pkcs12(s, what, keystore, c, err, errlen);
	if (!strcasecmp(s->type, "PEM"))
		return load_pem(s, what, keystore, c, err, errlen);
	return store_fail(err, errlen, "%s type '%s' is not supported: use PKCS12 or PEM (convert a JKS store to PKCS12)",
			  what, s->type);
}

bool km_net_tls_store_given(const km_net_tls_store *s)
{
	return s->location || s->certificates || s->key;
}

/*
 * A truststore's certificates become ctx's CA store (in place of the system's or a CA file's); a
 * keystore's key, its certificate and their chain become ctx's identity. KM_ERR_CONFIG with one
 * line in err naming the file: unreadable, a JKS or JCEKS store (and the keytool command that
 * converts it), a wrong password, no certificates, no key.
 */
static km_err use_store(SSL_CTX *ctx, const km_net_tls_store *s, bool keystore, char *err, size_t errlen)
{
	store_content c;
	X509_STORE *st = NULL;
	km_err rc = load_store(s, keystore ? "keystore" : "truststore", keystore, &c, err, errlen);

	if (rc != KM_OK) {
		store_content_free(&c); /* what a failed load had read */
		return rc;
	}
	if (keystore) {
		if (SSL_CTX_use_certificate(ctx, c.cert) != 1 || SSL_CTX_use_PrivateKey(ctx, c.key) != 1 ||
		    SSL_CTX_check_private_key(ctx) != 1 || SSL_CTX_set1_chain(ctx, c.certs) != 1) {
			set_err(err, errlen, "cannot use the key and certificate of the keystore", s->location);
			rc = KM_ERR_CONFIG;
		}
	} else if (!(st = X509_STORE_new())) {
		rc = store_fail(err, errlen, "out of memory");
	} else {
		for (int i = 0; rc == KM_OK && i < sk_X509_num(c.certs); i++)
			if (X509_STORE_add_cert(st, sk_X509_value(c.certs, i)) != 1) {
				set_err(err, errlen, "cannot use a certificate of the truststore", s->location);
				rc = KM_ERR_CONFIG;
			}
		if (rc == KM_OK)
			SSL_CTX_set_cert_store(ctx, st); /* the context owns it now */
		else
			X509_STORE_free(st);
	}
	store_content_free(&c);
	return rc;
}

/* libevent reads 16 KiB per callback by default: large Fetch responses would take thousands of rounds.
 * (In libevent 2.1 evbuffer_read caps each read at 4 KiB anyway: see km_net_bev_fill.) */
static void set_io_sizes(struct bufferevent *bev)
{
	bufferevent_set_max_single_read(bev, 256 * 1024);
	bufferevent_set_max_single_write(bev, 256 * 1024);
}

struct bufferevent *km_net_bev_new(struct event_base *base, int fd, SSL_CTX *ctx, bool server, const char *sni,
				   bool verify_host)
{
	const int opts = BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS;
	struct bufferevent *bev;
	SSL *ssl;

	if (!ctx) {
		bev = km_net_bev_plain_new(base, fd, opts);
		if (bev)
			set_io_sizes(bev);
		return bev;
	}
	ssl = SSL_new(ctx);
	if (!ssl)
		return NULL;
	if (!server && sni) {
		SSL_set_tlsext_host_name(ssl, sni);
		if (verify_host && SSL_set1_host(ssl, sni) != 1) {
			SSL_free(ssl);
			return NULL;
		}
	}
	bev = bufferevent_openssl_socket_new(base, fd, ssl, server ? BUFFEREVENT_SSL_ACCEPTING : BUFFEREVENT_SSL_CONNECTING,
					     opts);
	if (!bev) {
		SSL_free(ssl);
		return NULL;
	}
	/* A peer that closes without close_notify is normal for Kafka clients. */
	bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
	set_io_sizes(bev);
	return bev;
}

/*
 * TLS: libevent's OpenSSL bufferevent does one SSL_read per iovec, 4 KiB or the rest of a record
 * per readiness event. Read the records the socket already holds through the bufferevent's own SSL
 * object, and never stop inside a record: decrypted bytes left in OpenSSL would wait for a socket
 * readiness that does not come. Errors and EOF are left for the bufferevent's next read to report.
 */
static size_t fill_tls(struct evbuffer *in, SSL *ssl, size_t upto)
{
	size_t added = 0;

	for (;;) {
		size_t have = evbuffer_get_length(in), pend = (size_t)SSL_pending(ssl), want;
		struct evbuffer_iovec v;
		int r;

		if (have >= upto && !pend)
			break;
		want = have < upto ? upto - have : pend;
		if (want < pend)
			want = pend;
		if (want > INT32_MAX)
			want = INT32_MAX;
		if (evbuffer_reserve_space(in, (ev_ssize_t)want, &v, 1) != 1)
			break;
		if (v.iov_len > want)
			v.iov_len = want;
		ERR_clear_error();
		r = SSL_read(ssl, v.iov_base, (int)v.iov_len);
		if (r <= 0) {
			ERR_clear_error();
			v.iov_len = 0;
			evbuffer_commit_space(in, &v, 0);
			break;
		}
		v.iov_len = (size_t)r;
		if (evbuffer_commit_space(in, &v, 1) != 0)
			break;
		added += (size_t)r;
	}
	return added;
}

size_t km_net_bev_fill(struct bufferevent *bev, size_t upto)
{
	struct evbuffer *in = bufferevent_get_input(bev);
	evutil_socket_t fd = bufferevent_getfd(bev);
	SSL *ssl = bufferevent_openssl_get_ssl(bev);

	if (fd < 0)
		return 0;
	if (ssl)
		return fill_tls(in, ssl, upto);
	/*
	 * A plain bufferevent of km_net_bev_new has read what the socket held before its callback (and
	 * one not connected yet has nothing to read): this only sets its next reads' size.
	 */
	km_net_bev_plain_fill(bev, upto);
	return 0;
}
