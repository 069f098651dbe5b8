/* TLS contexts for client-facing listeners and upstream connections, and plain/TLS bufferevents behind one call. */
#include <stdio.h>
#include <string.h>

#include <event2/bufferevent_ssl.h>
#include <openssl/err.h>
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

static void set_err(char *err, size_t errlen, const char *what, const char *file)
{
	char tls[512];
	if (err && errlen)
		snprintf(err, errlen, "%s%s%s: %s", what, file ? " " : "", file ? file : "",
			 km_net_tls_error(tls, sizeof(tls)));
}

SSL_CTX *km_net_tls_server_ctx(const char *cert_file, const char *key_file, const char *ca_file, int client_auth,
			       char *err, size_t errlen)
{
	SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
	if (!ctx) {
		set_err(err, errlen, "SSL_CTX_new", NULL);
		return NULL;
	}
	SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION);
	if (SSL_CTX_use_certificate_chain_file(ctx, cert_file) != 1) {
		set_err(err, errlen, "cannot load certificate", cert_file);
		goto fail;
	}
	if (SSL_CTX_use_PrivateKey_file(ctx, key_file, SSL_FILETYPE_PEM) != 1) {
		set_err(err, errlen, "cannot load private key", key_file);
		goto fail;
	}
	if (SSL_CTX_check_private_key(ctx) != 1) {
		set_err(err, errlen, "private key does not match certificate", key_file);
		goto fail;
	}
	if (ca_file && SSL_CTX_load_verify_locations(ctx, ca_file, NULL) != 1) {
		set_err(err, errlen, "cannot load CA file", ca_file);
		goto fail;
	}
	if (client_auth == 1)
		SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
	else if (client_auth == 2)
		SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
	return ctx;
fail:
	SSL_CTX_free(ctx);
	return NULL;
}

SSL_CTX *km_net_tls_client_ctx(const char *ca_file, const char *cert_file, const char *key_file, bool verify,
			       char *err, size_t errlen)
{
	SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
	if (!ctx) {
		set_err(err, errlen, "SSL_CTX_new", NULL);
		return NULL;
	}
	SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	if (ca_file) {
		if (SSL_CTX_load_verify_locations(ctx, ca_file, NULL) != 1) {
			set_err(err, errlen, "cannot load CA file", ca_file);
			goto fail;
		}
	} else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
		set_err(err, errlen, "cannot load the system CA store", NULL);
		goto fail;
	}
	if (cert_file) {
		if (SSL_CTX_use_certificate_chain_file(ctx, cert_file) != 1) {
			set_err(err, errlen, "cannot load certificate", cert_file);
			goto fail;
		}
		if (SSL_CTX_use_PrivateKey_file(ctx, key_file, SSL_FILETYPE_PEM) != 1 ||
		    SSL_CTX_check_private_key(ctx) != 1) {
			set_err(err, errlen, "cannot load private key", key_file);
			goto fail;
		}
	}
	SSL_CTX_set_verify(ctx, verify ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, NULL);
	return ctx;
fail:
	SSL_CTX_free(ctx);
	return NULL;
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
