/* kmirror swap-upstream: the upstream swap through kmirrord's HTTP admin endpoint (a small blocking HTTP/1.0 client, HTTPS with --admin-ca). */
#define _GNU_SOURCE /* strcasestr */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <openssl/ssl.h>

#include "cli/cli.h"
#include "kmirror/clock.h"
#include "kmirror/net.h"

#define POLL_MS 500

/* The admin endpoint's connection: a socket, and TLS over it with --admin-ca. */
typedef struct admin_conn {
	int fd;
	SSL_CTX *ctx;
	SSL *ssl;
} admin_conn;

static void admin_close(admin_conn *c)
{
	if (c->ssl)
		SSL_free(c->ssl);
	SSL_CTX_free(c->ctx);
	if (c->fd >= 0)
		close(c->fd);
}

/* TLS over the connected socket, kmirrord's certificate checked against ca and host (a name or an address). */
static bool admin_tls(admin_conn *c, const char *ca, const char *host, char *err, size_t errlen)
{
	char why[512];

	if (!(c->ctx = km_net_tls_client_ctx(&(km_net_tls_files){.ca_file = ca}, true, why, sizeof(why)))) {
		snprintf(err, errlen, "--admin-ca: %s", why);
		return false;
	}
#ifdef SSL_OP_IGNORE_UNEXPECTED_EOF
	/* evhttp closes without close_notify; the answer's Content-Length says whether it all came */
	SSL_CTX_set_options(c->ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
#endif
	if (!(c->ssl = SSL_new(c->ctx)) || !SSL_set_fd(c->ssl, c->fd) || !SSL_set1_host(c->ssl, host) ||
	    !SSL_set_tlsext_host_name(c->ssl, host) || SSL_connect(c->ssl) != 1) {
		snprintf(err, errlen, "TLS with kmirrord's admin endpoint failed: %s (is admin_listen HTTPS, and is "
			 "--admin-ca the CA of its certificate?)", km_net_tls_error(why, sizeof(why)));
		return false;
	}
	return true;
}

static bool admin_send(admin_conn *c, const char *p, size_t n)
{
	if (c->ssl)
		return n == 0 || SSL_write(c->ssl, p, (int)n) == (int)n;
	return send(c->fd, p, n, MSG_NOSIGNAL) == (ssize_t)n;
}

/* Bytes read, 0 at the end, -1 on error (errno). */
static ssize_t admin_recv(admin_conn *c, char *p, size_t n)
{
	int r;
	if (!c->ssl)
		return recv(c->fd, p, n, 0);
	r = SSL_read(c->ssl, p, (int)n);
	if (r > 0)
		return r;
	if (SSL_get_error(c->ssl, r) == SSL_ERROR_ZERO_RETURN)
		return 0;
	errno = errno ? errno : EPROTO;
	return -1;
}

/* The answer's head and body (buf, len bytes): the status code and a copy of the body, or -1 with err. */
static int parse_answer(char *buf, size_t len, const char *admin, char **resp, char *err, size_t errlen)
{
	char *body, *cl;
	int code;

	if (!buf || len < 12 || strncmp(buf, "HTTP/1.", 7) != 0 || !(body = strstr(buf, "\r\n\r\n"))) {
		snprintf(err, errlen, "%s did not answer HTTP (is it kmirrord's admin_listen or http_listen?)", admin);
		return -1;
	}
	body += 4;
	code = atoi(buf + 9);
	/* A cut answer is not taken for a whole one (over TLS the end of the stream proves nothing). */
	if ((cl = strcasestr(buf, "\r\nContent-Length:")) && cl < body &&
	    strtoul(cl + 17, NULL, 10) != (unsigned long)(len - (size_t)(body - buf))) {
		snprintf(err, errlen, "%s: the answer was cut short", admin);
		return -1;
	}
	if (!(*resp = strdup(body))) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	return code;
}

/* One request; the status code (or -1 with a reason in err) and the body in a malloc'd string. */
static int http_call(const km_cli_args *a, const char *method, const char *token, const char *body, char **resp,
		     char *err, size_t errlen)
{
	const char *admin = a->admin;
	char host[256], service[8], *buf = NULL;
	uint16_t port;
	struct addrinfo hints, *res = NULL;
	struct timeval tv = {(time_t)(a->timeout_ms / 1000), (suseconds_t)((a->timeout_ms % 1000) * 1000)};
	size_t len = 0, cap = 0, blen = body ? strlen(body) : 0;
	admin_conn c = {.fd = -1};
	int code = -1, rc;
	char head[1024];

	*resp = NULL;
	if (!km_cli_split_hostport(admin, host, sizeof(host), &port)) {
		snprintf(err, errlen, "--admin '%s': expected HOST:PORT (kmirrord's admin_listen or http_listen)",
			 admin);
		return -1;
	}
	memset(&hints, 0, sizeof(hints));
	hints.ai_socktype = SOCK_STREAM;
	snprintf(service, sizeof(service), "%u", port);
	if ((rc = getaddrinfo(host, service, &hints, &res)) != 0 || !res) {
		snprintf(err, errlen, "cannot resolve %s: %s", admin, gai_strerror(rc));
		return -1;
	}
	c.fd = socket(res->ai_family, SOCK_STREAM, 0);
	if (c.fd < 0 || setsockopt(c.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
	    setsockopt(c.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0 ||
	    connect(c.fd, res->ai_addr, res->ai_addrlen) != 0) {
		snprintf(err, errlen, "cannot connect to kmirrord's admin endpoint %s: %s (is admin_listen or "
			 "http_listen set there?)", admin, strerror(errno));
		goto out;
	}
	if (a->admin_ca && !admin_tls(&c, a->admin_ca, host, err, errlen))
		goto out;
	snprintf(head, sizeof(head),
		 "%s /admin/upstream HTTP/1.0\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: text/plain\r\n"
		 "Content-Length: %zu\r\n\r\n",
		 method, host, token, blen);
	if (!admin_send(&c, head, strlen(head)) || (blen && !admin_send(&c, body, blen))) {
		snprintf(err, errlen, "cannot send to %s: %s", admin, strerror(errno));
		goto out;
	}
	for (;;) { /* HTTP/1.0: the body ends when the server closes */
		ssize_t n;
		if (len + 4096 + 1 > cap) {
			char *nb = realloc(buf, cap = cap ? cap * 2 : 8192);
			if (!nb) {
				snprintf(err, errlen, "out of memory");
				goto out;
			}
			buf = nb;
		}
		errno = 0;
		n = admin_recv(&c, buf + len, cap - len - 1);
		if (n == 0)
			break;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			snprintf(err, errlen, "no answer from %s: %s", admin, strerror(errno));
			goto out;
		}
		len += (size_t)n;
	}
	if (buf)
		buf[len] = '\0';
	code = parse_answer(buf, len, admin, resp, err, errlen);
out:
	free(buf);
	admin_close(&c);
	freeaddrinfo(res);
	return code;
}

/*
 * A field of the status object kmirrord writes (km_proxy_swap_status): a string into buf (true), or
 * null / absent (false). Escapes are kept as written but for \" and \\.
 */
static bool json_field(const char *doc, const char *key, char *buf, size_t len)
{
	char pat[64];
	const char *p;
	size_t n = 0;

	snprintf(pat, sizeof(pat), "\"%s\": ", key);
	if (!(p = strstr(doc, pat)) || p[strlen(pat)] != '"')
		return false;
	for (p += strlen(pat) + 1; *p && *p != '"' && n + 1 < len; p++) {
		if (*p == '\\' && p[1])
			p++;
		buf[n++] = *p;
	}
	buf[n] = '\0';
	return true;
}

/* Connections of the previous upstreams still draining (the sum over "draining"). */
static long draining_connections(const char *doc)
{
	const char *p = strstr(doc, "\"draining\": [");
	long sum = 0;
	if (!p)
		return 0;
	for (const char *end = strchr(p, ']'); (p = strstr(p, "\"connections\": ")) && (!end || p < end);) {
		p += 15;
		sum += strtol(p, NULL, 10);
	}
	return sum;
}

static void trim(char *s)
{
	size_t n = strlen(s);
	while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' '))
		s[--n] = '\0';
}

int km_cli_swap_upstream(const km_cli_args *a, FILE *out, FILE *errf)
{
	char token[512], err[600], last[1024], text[1024];
	char *resp = NULL;
	FILE *f = fopen(a->token_file, "r");
	size_t n;
	int code, rc = KM_CLI_EXIT_ERROR;
	int64_t start = km_mono_ms(), said = -1;

	if (!f) {
		fprintf(errf, "kmirror: swap-upstream: cannot read --token-file %s: %s\n", a->token_file, strerror(errno));
		return KM_CLI_EXIT_USAGE;
	}
	n = fread(token, 1, sizeof(token) - 1, f);
	fclose(f);
	token[n] = '\0';
	trim(token);
	if (!*token || strpbrk(token, "\r\n")) {
		fprintf(errf, "kmirror: swap-upstream: --token-file %s: expected one line holding the token\n",
			a->token_file);
		return KM_CLI_EXIT_USAGE;
	}
	code = http_call(a, "POST", token, a->to, &resp, err, sizeof(err));
	if (code != 202) {
		if (code < 0)
			fprintf(errf, "kmirror: swap-upstream: %s\n", err);
		else {
			trim(resp);
			fprintf(errf, "kmirror: swap-upstream refused (HTTP %d): %s\n", code, resp);
		}
		free(resp);
		return KM_CLI_EXIT_ERROR;
	}
	free(resp);
	for (;;) {
		int64_t now = km_mono_ms();
		long moving;
		struct timespec ts = {0, POLL_MS * 1000000L};

		resp = NULL;
		if ((code = http_call(a, "GET", token, NULL, &resp, err, sizeof(err))) != 200) {
			fprintf(errf, "kmirror: swap-upstream: following the swap: %s\n", code < 0 ? err : resp);
			break;
		}
		if (json_field(resp, "swapping_to", text, sizeof(text))) {
			if (now - said >= 2000) {
				fprintf(errf, "kmirror: swap-upstream: %s: connecting and reading its mirror state (%.1f s)\n",
					text, (double)(now - start) / 1000);
				said = now;
			}
		} else if (!json_field(resp, "last_swap", last, sizeof(last)) || strncmp(last, "now fronting ", 13) != 0) {
			fprintf(errf, "kmirror: swap-upstream failed: %s\n", last);
			break;
		} else if ((moving = draining_connections(resp)) > 0 && now - start < a->wait_ms) {
			if (now - said >= 1000) {
				fprintf(errf, "kmirror: swap-upstream: %ld connection(s) of the previous upstream still to move\n",
					moving);
				said = now;
			}
		} else {
			if (a->json) {
				trim(resp);
				fprintf(out, "%s\n", resp);
			} else {
				fprintf(out, "%s\n", last);
				if (moving > 0)
					fprintf(out, "%ld connection(s) of the previous upstream had not moved after %lld ms; "
						     "they still will (GET /admin/upstream)\n",
						moving, (long long)a->wait_ms);
			}
			rc = KM_CLI_EXIT_OK;
			break;
		}
		free(resp);
		nanosleep(&ts, NULL);
	}
	free(resp);
	return rc;
}
