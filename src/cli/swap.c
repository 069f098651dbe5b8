/* kmirror swap-upstream: the upstream swap through kmirrord's HTTP admin endpoint (a small blocking HTTP/1.0 client). */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"

#define POLL_MS 500

static int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* One request; the status code (or -1 with a reason in err) and the body in a malloc'd string. */
static int http_call(const char *admin, const char *method, const char *token, const char *body, int64_t timeout_ms,
		     char **resp, char *err, size_t errlen)
{
	char host[256], service[8], *buf = NULL;
	uint16_t port;
	struct addrinfo hints, *res = NULL;
	struct timeval tv = {(time_t)(timeout_ms / 1000), (suseconds_t)((timeout_ms % 1000) * 1000)};
	size_t len = 0, cap = 0, blen = body ? strlen(body) : 0;
	int fd = -1, code = -1, rc;
	char head[1024];

	*resp = NULL;
	if (!km_cli_split_hostport(admin, host, sizeof(host), &port)) {
		snprintf(err, errlen, "--admin '%s': expected HOST:PORT (kmirrord's http_listen)", admin);
		return -1;
	}
	memset(&hints, 0, sizeof(hints));
	hints.ai_socktype = SOCK_STREAM;
	snprintf(service, sizeof(service), "%u", port);
	if ((rc = getaddrinfo(host, service, &hints, &res)) != 0 || !res) {
		snprintf(err, errlen, "cannot resolve %s: %s", admin, gai_strerror(rc));
		return -1;
	}
	fd = socket(res->ai_family, SOCK_STREAM, 0);
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
	    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0 ||
	    connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
		snprintf(err, errlen, "cannot connect to kmirrord's admin endpoint %s: %s (is http_listen set there?)",
			 admin, strerror(errno));
		goto out;
	}
	snprintf(head, sizeof(head),
		 "%s /admin/upstream HTTP/1.0\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: text/plain\r\n"
		 "Content-Length: %zu\r\n\r\n",
		 method, host, token, blen);
	if (send(fd, head, strlen(head), MSG_NOSIGNAL) != (ssize_t)strlen(head) ||
	    (blen && send(fd, body, blen, MSG_NOSIGNAL) != (ssize_t)blen)) {
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
		n = recv(fd, buf + len, cap - len - 1, 0);
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
	if (!buf || len < 12 || strncmp(buf, "HTTP/1.", 7) != 0) {
		snprintf(err, errlen, "%s did not answer HTTP (is it kmirrord's http_listen?)", admin);
		goto out;
	}
	buf[len] = '\0';
	code = atoi(buf + 9);
	{
		char *b = strstr(buf, "\r\n\r\n");
		*resp = strdup(b ? b + 4 : "");
	}
	if (!*resp) {
		snprintf(err, errlen, "out of memory");
		code = -1;
	}
out:
	free(buf);
	if (fd >= 0)
		close(fd);
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
	int64_t start = mono_ms(), said = -1;

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
	code = http_call(a->admin, "POST", token, a->to, a->timeout_ms, &resp, err, sizeof(err));
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
		int64_t now = mono_ms();
		long moving;
		struct timespec ts = {0, POLL_MS * 1000000L};

		resp = NULL;
		if ((code = http_call(a->admin, "GET", token, NULL, a->timeout_ms, &resp, err, sizeof(err))) != 200) {
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
