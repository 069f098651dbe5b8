/* OAUTHBEARER tokens (KIP-768): a JWT from a file:// token endpoint, or from an http(s) one by the client-credentials grant, kept and renewed before it expires. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "kmirror/log.h"
#include "kmirror/secret.h"
#include "net/sasl_int.h"

#define TOKEN_FILE_MAX (64 * 1024) /* a JWT is a few KiB at most */

/* ---- a top-level field of a small JSON object (a JWT payload, an error, a token response) ---- */

static const char *json_ws(const char *p, const char *end)
{
	while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
		p++;
	return p;
}

/* Past the string starting at p (at its opening quote); NULL when it does not end. */
static const char *json_skip_string(const char *p, const char *end)
{
	for (p++; p < end; p++) {
		if (*p == '\\')
			p++;
		else if (*p == '"')
			return p + 1;
	}
	return NULL;
}

/* Past the value at p (any kind, nested ones whole); NULL when malformed. */
static const char *json_skip_value(const char *p, const char *end)
{
	int depth = 0;

	do {
		p = json_ws(p, end);
		if (p >= end)
			return NULL;
		if (*p == '"') {
			if (!(p = json_skip_string(p, end)))
				return NULL;
		} else if (*p == '{' || *p == '[') {
			depth++;
			p++;
		} else if (*p == '}' || *p == ']') {
			if (--depth < 0)
				return NULL;
			p++;
		} else if (*p == ',' || *p == ':') {
			if (!depth)
				return NULL;
			p++;
		} else {
			const char *s = p;
			while (p < end && *p != ',' && *p != '}' && *p != ']' && *p != ' ' && *p != '\n' && *p != '\r' &&
			       *p != '\t' && *p != ':')
				p++;
			if (p == s)
				return NULL;
		}
	} while (depth > 0);
	return p;
}

/*
 * The value of key in the JSON object js: a string unescaped (\uXXXX outside ASCII becomes '?'),
 * or a number or literal as written. false when absent, malformed, or longer than cap - 1.
 */
static bool json_field(const char *js, size_t len, const char *key, char *out, size_t cap, bool *is_string)
{
	const char *p = js, *end = js + len;
	size_t kl = strlen(key);

	p = json_ws(p, end);
	if (p >= end || *p++ != '{')
		return false;
	for (;;) {
		const char *k, *v, *ve;
		p = json_ws(p, end);
		if (p >= end || *p != '"')
			return false;
		k = p + 1;
		if (!(p = json_skip_string(p, end)))
			return false;
		bool match = (size_t)(p - 1 - k) == kl && !memcmp(k, key, kl);
		p = json_ws(p, end);
		if (p >= end || *p++ != ':')
			return false;
		v = json_ws(p, end);
		if (!(ve = json_skip_value(v, end)))
			return false;
		if (match) {
			size_t n = 0;
			*is_string = *v == '"';
			if (!*is_string) {
				if ((size_t)(ve - v) >= cap)
					return false;
				memcpy(out, v, (size_t)(ve - v));
				out[ve - v] = 0;
				return true;
			}
			for (const char *q = v + 1; q < ve - 1; q++) {
				char ch = *q;
				if (ch == '\\' && q + 1 < ve - 1) {
					ch = *++q;
					if (ch == 'n')
						ch = '\n';
					else if (ch == 't')
						ch = '\t';
					else if (ch == 'u') {
						ch = '?';
						q += (ve - 1 - q > 4) ? 4 : 0;
					}
				}
				if (n + 1 >= cap)
					return false;
				out[n++] = ch;
			}
			out[n] = 0;
			return true;
		}
		p = json_ws(ve, end);
		if (p < end && *p == ',') {
			p++;
			continue;
		}
		return false;
	}
}

/* A top-level integer field (a JSON number, whole); false when absent or not one. */
static bool json_int(const char *js, size_t len, const char *key, int64_t *v)
{
	char num[32], *e;
	bool str;
	double d;

	if (!json_field(js, len, key, num, sizeof(num), &str) || str)
		return false;
	errno = 0;
	d = strtod(num, &e);
	if (errno || *e || e == num || d < 0 || d > 9.2e18)
		return false;
	*v = (int64_t)d;
	return true;
}

/* ---- JWT ---- */

/* base64url without padding into out (cap bytes); the length, or -1. */
static int unb64url(const char *in, size_t n, uint8_t *out, size_t cap)
{
	char *t;
	size_t tl = (n + 3) / 4 * 4;
	int len;

	if (n % 4 == 1 || tl / 4 * 3 > cap || !(t = malloc(tl + 1)))
		return -1;
	for (size_t i = 0; i < n; i++) {
		char ch = in[i];
		if (ch == '-')
			ch = '+';
		else if (ch == '_')
			ch = '/';
		else if (ch == '+' || ch == '/' || ch == '=') {
			free(t);
			return -1;
		}
		t[i] = ch;
	}
	for (size_t i = n; i < tl; i++)
		t[i] = '=';
	len = EVP_DecodeBlock(out, (const unsigned char *)t, (int)tl);
	free(t);
	if (len < 0)
		return -1;
	return len - (int)(tl - n);
}

km_err km_sasl_oauth_jwt(const char *token, size_t len, int64_t *exp, int64_t *iat, char *why, size_t whylen)
{
	const char *d1 = memchr(token, '.', len), *d2;
	uint8_t *payload;
	int pl;
	km_err rc = KM_ERR_INVAL;

	*exp = *iat = 0;
	d2 = d1 ? memchr(d1 + 1, '.', len - (size_t)(d1 + 1 - token)) : NULL;
	if (!d1 || !d2 || d1 == token || d2 == d1 + 1 || memchr(d2 + 1, '.', len - (size_t)(d2 + 1 - token))) {
		snprintf(why, whylen, "not a JWT (three base64url parts header.payload.signature)");
		return KM_ERR_INVAL;
	}
	if (!(payload = malloc((size_t)(d2 - d1)))) {
		snprintf(why, whylen, "out of memory");
		return KM_ERR_NOMEM;
	}
	pl = unb64url(d1 + 1, (size_t)(d2 - d1 - 1), payload, (size_t)(d2 - d1));
	if (pl < 2)
		snprintf(why, whylen, "the JWT's payload is not base64url");
	else if (!json_int((const char *)payload, (size_t)pl, "exp", exp))
		snprintf(why, whylen, "the JWT's payload is not a JSON object with a numeric exp claim");
	else
		rc = KM_OK;
	if (rc == KM_OK && !json_int((const char *)payload, (size_t)pl, "iat", iat))
		*iat = 0;
	OPENSSL_cleanse(payload, (size_t)(d2 - d1));
	free(payload);
	return rc;
}

/* ---- the server's error ---- */

void km_sasl_oauth_server_error(const uint8_t *in, size_t len, char *out, size_t outlen)
{
	char status[100] = "", scope[200] = "";
	bool str;
	int n;

	json_field((const char *)in, len, "status", status, sizeof(status), &str);
	json_field((const char *)in, len, "scope", scope, sizeof(scope), &str);
	if (!status[0]) {
		snprintf(out, outlen, "the broker refused the token");
		return;
	}
	n = snprintf(out, outlen, "the broker refused the token: status %s", status);
	if (scope[0] && n > 0 && (size_t)n < outlen)
		snprintf(out + n, outlen - (size_t)n, ", scope %s", scope);
}

/* ---- Kafka's JAAS line ---- */

km_err km_sasl_oauth_jaas(const char *jaas, char **client_id, char **client_secret, char **scope, char *err,
			  size_t errlen)
{
	static const char *const keys[] = {"clientId", "clientSecret", "scope", "unsecuredLoginStringClaim_sub"};
	char *v[4];

	*client_id = *client_secret = *scope = NULL;
	if (km_sasl_jaas_options(jaas, "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule",
				 "OAUTHBEARER", keys, v, 4, err, errlen) != KM_OK)
		return KM_ERR_CONFIG;
	if (v[3]) {
		km_sasl_jaas_free(v, 4);
		return km_sasl_fail(err, errlen, "sasl.jaas.config: kmirror makes no unsecured tokens (unsecuredLogin*): write "
					 "a token to a file and set sasl.oauthbearer.token.endpoint.url=file:///PATH");
	}
	*client_id = v[0];
	*client_secret = v[1];
	*scope = v[2];
	return KM_OK;
}

/* ---- tokens kept per file, or per token endpoint, client and scope ---- */

typedef struct token_src {
	struct token_src *next;
	char *key;               /* the file's path; or url, client id, scope and secret joined by 0x01 */
	char *token;
	int64_t exp, refresh_at; /* seconds since the epoch */
	struct stat st;          /* a file as read */
	bool warned;             /* past refresh_at with no newer token: said once */
	int64_t used;            /* when a connection last asked for its token */
	/* a token endpoint */
	char *url, *setting;
	struct event_base *base;
	struct evhttp_connection *evcon; /* the request under way */
	km_sasl_oauth_wait *waiters;
	/* a token command: the run under way (pid > 0), its stdout read on the loop */
	pid_t pid;
	int fd;
	struct event *ev, *timer;
	struct evbuffer *out;
} token_src;

/* kmirrord and the CLI run one event loop thread: no lock. */
static token_src *token_srcs;

static const char *setting_of(const km_sasl_oauth *o)
{
	return o->setting && *o->setting ? o->setting : "sasl.oauthbearer.token.endpoint.url";
}

static void wipe_free(char *p)
{
	if (p) {
		OPENSSL_cleanse(p, strlen(p));
		free(p);
	}
}

static token_src *src_find(const char *key)
{
	token_src *t;
	for (t = token_srcs; t && strcmp(t->key, key); t = t->next)
		;
	return t;
}

/*
 * Sources no connection asked for in an hour (a mirror deleted, a file or a client no longer
 * named): forgotten, their token and the client secret in their key wiped from memory.
 */
#define SRC_IDLE_S 3600

static void src_sweep(int64_t now)
{
	token_src **pp = &token_srcs, *t;
	while ((t = *pp)) {
		if (!t->evcon && !t->pid && !t->waiters && now - t->used > SRC_IDLE_S) {
			*pp = t->next;
			wipe_free(t->token);
			wipe_free(t->key);
			free(t->url);
			free(t->setting);
			free(t);
			continue;
		}
		pp = &t->next;
	}
}

/*
 * The source of key, added whole when new, with its URL (or command) and setting (both NULL for a
 * token file: its path is the key); NULL: out of memory.
 */
static token_src *src_get(const char *key, const char *url, const char *setting)
{
	token_src *t = src_find(key);

	if (t)
		return t;
	t = calloc(1, sizeof(*t));
	if (!t || !(t->key = strdup(key)) || (url && !(t->url = strdup(url))) ||
	    (setting && !(t->setting = strdup(setting)))) {
		if (t) {
			wipe_free(t->key);
			free(t->url);
		}
		free(t);
		return NULL;
	}
	t->next = token_srcs;
	token_srcs = t;
	return t;
}

/* A new token for t (taken), living until exp; refreshed at 80% of its life from born. */
static void src_set(token_src *t, char *tok, int64_t exp, int64_t born)
{
	if (!t->token || strcmp(t->token, tok) != 0)
		t->warned = false;
	wipe_free(t->token);
	t->token = tok;
	t->exp = exp;
	t->refresh_at = born + (exp - born) * 4 / 5;
}

static bool same_file(const struct stat *a, const struct stat *b)
{
	return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
	       a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

static void utc(int64_t t, char *out, size_t len)
{
	time_t tt = (time_t)t;
	struct tm tm;
	if (!gmtime_r(&tt, &tm) || !strftime(out, len, "%Y-%m-%dT%H:%M:%SZ", &tm))
		snprintf(out, len, "%lld", (long long)t);
}

/* The file's token (whitespace trimmed); st: the file as opened. */
static km_err read_token(const km_sasl_oauth *o, const char *path, char **token, struct stat *st, char *err,
			 size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	char *buf;
	ssize_t n;
	size_t len = 0, start = 0;

	if (fd < 0)
		return km_sasl_fail(err, errlen, "%s: cannot read %s: %s (write the token there, readable by kmirror's user)",
			    setting_of(o), path, strerror(errno));
	if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode) || st->st_size > TOKEN_FILE_MAX) {
		close(fd);
		return km_sasl_fail(err, errlen, "%s: %s is not a regular file of at most %d bytes holding one token",
			    setting_of(o), path, TOKEN_FILE_MAX);
	}
	if (!(buf = malloc(TOKEN_FILE_MAX + 1))) {
		close(fd);
		return km_sasl_fail(err, errlen, "out of memory");
	}
	while (len < TOKEN_FILE_MAX && (n = read(fd, buf + len, TOKEN_FILE_MAX - len)) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			int e = errno;
			close(fd);
			OPENSSL_cleanse(buf, TOKEN_FILE_MAX + 1);
			free(buf);
			return km_sasl_fail(err, errlen, "%s: cannot read %s: %s", setting_of(o), path, strerror(e));
		}
		len += (size_t)n;
	}
	close(fd);
	while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r' || buf[len - 1] == ' ' || buf[len - 1] == '\t'))
		len--;
	while (start < len && (buf[start] == ' ' || buf[start] == '\t' || buf[start] == '\n' || buf[start] == '\r'))
		start++;
	buf[len] = 0;
	if (start == len) {
		free(buf);
		return km_sasl_fail(err, errlen, "%s: %s is empty: write the token (a JWT) there", setting_of(o), path);
	}
	memmove(buf, buf + start, len - start + 1);
	*token = buf;
	return KM_OK;
}

/* A file's token: the one kept while the file is unchanged and young enough, else the file read again. */
static km_err file_token(const km_sasl_oauth *o, const char *path, char **token, char *err, size_t errlen)
{
	int64_t now = (int64_t)time(NULL), exp, iat;
	token_src *f = src_find(path);
	struct stat st;
	char *tok = NULL, why[200], when[40];

	if (f && now < f->refresh_at && stat(path, &st) == 0 && same_file(&st, &f->st))
		goto have;
	if (read_token(o, path, &tok, &st, err, errlen) != KM_OK)
		return KM_ERR_CONFIG;
	if (km_sasl_oauth_jwt(tok, strlen(tok), &exp, &iat, why, sizeof(why)) != KM_OK) {
		wipe_free(tok);
		return km_sasl_fail(err, errlen, "%s: %s holds %s: write the token endpoint's access token there", setting_of(o),
			    path, why);
	}
	if (exp <= now) {
		wipe_free(tok);
		utc(exp, when, sizeof(when));
		return km_sasl_fail(err, errlen, "%s: the token in %s expired at %s (%lld s ago): write a fresh token there",
			    setting_of(o), path, when, (long long)(now - exp));
	}
	if (!f && !(f = src_get(path, NULL, NULL))) {
		wipe_free(tok);
		return km_sasl_fail(err, errlen, "out of memory");
	}
	src_set(f, tok, exp, iat > 0 && iat <= now ? iat : now);
	f->st = st;
	if (now >= f->refresh_at && !f->warned) {
		/* Read again at every connection from here on; the token still works until exp. */
		f->warned = true;
		utc(exp, when, sizeof(when));
		KM_WARN("net", 0, "%s: the token in %s expires at %s (in %lld s) and no newer one was written there: "
				  "connections will fail from then on", setting_of(o), path, when, (long long)(exp - now));
	}
have:
	f->used = now;
	if (!(*token = strdup(f->token)))
		return km_sasl_fail(err, errlen, "out of memory");
	return KM_OK;
}

/* ---- a token endpoint: the client-credentials grant (RFC 6749 4.4) over libevent's HTTP client ---- */

#define ENDPOINT_TIMEOUT_S 10
#define ENDPOINT_ANSWER_MAX (64 * 1024)

static bool endpoint_url(const char *url)
{
	return url && (!strncmp(url, "http://", 7) || !strncmp(url, "https://", 8));
}

static void free_evcon(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	evhttp_connection_free(arg);
}

/* Every connection waiting for t gets rc and why. */
static void wake(token_src *t, km_err rc, const char *why)
{
	km_sasl_oauth_wait *w;
	while ((w = t->waiters)) {
		km_sasl_oauth_cancel(w);
		w->cb(w->arg, rc, why);
	}
}

/* The endpoint's answer: a token (access_token, expires_in) or why not. */
static void fetch_done(struct evhttp_request *req, void *arg)
{
	static const struct timeval zero = {0, 0};
	token_src *t = arg;
	int code = req ? evhttp_request_get_response_code(req) : 0;
	struct evbuffer *in = req ? evhttp_request_get_input_buffer(req) : NULL;
	size_t len = in ? evbuffer_get_length(in) : 0;
	char *body = NULL, *tok = NULL, why[400], e1[100] = "", e2[200] = "", num[32];
	int64_t now = (int64_t)time(NULL), exp = 0, iat = 0, life;
	km_err rc = KM_ERR_SASL;
	bool str;

	if (t->evcon && event_base_once(t->base, -1, EV_TIMEOUT, free_evcon, t->evcon, &zero) != 0)
		evhttp_connection_free_on_completion(t->evcon);
	t->evcon = NULL;
	if (len > ENDPOINT_ANSWER_MAX)
		len = ENDPOINT_ANSWER_MAX;
	if (len && (body = malloc(len)))
		evbuffer_copyout(in, body, len);
	if (code == 0) {
		snprintf(why, sizeof(why), "%s: the token endpoint %s did not answer (not reachable, TLS failed, or no "
			 "answer in %d s)", t->setting, t->url, ENDPOINT_TIMEOUT_S);
	} else if (code != 200) {
		if (body) {
			json_field(body, len, "error", e1, sizeof(e1), &str);
			json_field(body, len, "error_description", e2, sizeof(e2), &str);
		}
		snprintf(why, sizeof(why), "%s: the token endpoint %s answered HTTP %d%s%s%s%s: check the client id, "
			 "secret and scope", t->setting, t->url, code, e1[0] ? ": " : "", e1, e2[0] ? ": " : "", e2);
	} else if (!body || !(tok = malloc(len + 1)) || !json_field(body, len, "access_token", tok, len + 1, &str) ||
		   !str || !tok[0]) {
		snprintf(why, sizeof(why), "%s: the token endpoint %s answered without an access_token", t->setting,
			 t->url);
	} else {
		bool has_life = json_field(body, len, "expires_in", num, sizeof(num), &str) && !str;
		life = has_life ? strtoll(num, NULL, 10) : 0;
		if (km_sasl_oauth_jwt(tok, strlen(tok), &exp, &iat, why, sizeof(why)) != KM_OK)
			exp = 0;
		if (life > 0)
			exp = now + life;
		if (exp <= now) {
			snprintf(why, sizeof(why), "%s: the token endpoint %s answered a token with no expires_in and no "
				 "live exp claim", t->setting, t->url);
		} else {
			src_set(t, tok, exp, now);
			tok = NULL;
			rc = KM_OK;
			why[0] = 0;
		}
	}
	wipe_free(tok);
	if (body) {
		OPENSSL_cleanse(body, len);
		free(body);
	}
	if (rc != KM_OK)
		KM_WARN("net", 0, "%s", why);
	wake(t, rc, why);
}

/* One SSL_CTX for every https endpoint: the system's CAs. */
static SSL_CTX *endpoint_tls(char *err, size_t errlen)
{
	static SSL_CTX *ctx;
	km_net_tls_files none;

	if (!ctx) {
		memset(&none, 0, sizeof(none));
		ctx = km_net_tls_client_ctx(&none, true, err, errlen);
	}
	return ctx;
}

/* grant_type=client_credentials (and scope) to t's URL, answered in fetch_done. */
static km_err fetch_start(token_src *t, const km_sasl_oauth *o, struct event_base *base, struct evdns_base *dns,
			  char *err, size_t errlen)
{
	struct evhttp_uri *uri = evhttp_uri_parse(o->token_endpoint_url);
	const char *host = uri ? evhttp_uri_get_host(uri) : NULL, *path, *query;
	bool tls = !strncmp(o->token_endpoint_url, "https://", 8);
	int port = uri ? evhttp_uri_get_port(uri) : -1;
	struct bufferevent *bev = NULL;
	struct evhttp_request *req;
	struct evkeyvalq *h;
	char *cred = NULL, *basic = NULL, *scope = NULL, target[2048], tlserr[300];
	size_t cl;
	km_err rc = KM_ERR_CONFIG;

	if (!host || !*host) {
		km_sasl_fail(err, errlen, "%s '%.200s' is not a URL (http(s)://HOST[:PORT]/PATH)", setting_of(o),
		     o->token_endpoint_url);
		goto out;
	}
	path = evhttp_uri_get_path(uri);
	query = evhttp_uri_get_query(uri);
	snprintf(target, sizeof(target), "%s%s%s", path && *path ? path : "/", query ? "?" : "", query ? query : "");
	if (port < 0)
		port = tls ? 443 : 80;
	if (tls) {
		SSL_CTX *ctx = endpoint_tls(tlserr, sizeof(tlserr));
		if (!ctx || !(bev = km_net_bev_new(base, -1, ctx, false, host, true))) {
			km_sasl_fail(err, errlen, "%s: TLS for %s: %s", setting_of(o), host, ctx ? "out of memory" : tlserr);
			goto out;
		}
	}
	if (!(t->evcon = evhttp_connection_base_bufferevent_new(base, dns, bev, host, (unsigned short)port))) {
		if (bev)
			bufferevent_free(bev);
		km_sasl_fail(err, errlen, "out of memory");
		goto out;
	}
	evhttp_connection_set_timeout(t->evcon, ENDPOINT_TIMEOUT_S);
	evhttp_connection_set_retries(t->evcon, 0);
	cl = strlen(o->client_id) + strlen(o->client_secret) + 2;
	cred = malloc(cl);
	basic = malloc(cl * 4 / 3 + 16);
	scope = o->scope && *o->scope ? evhttp_encode_uri(o->scope) : NULL;
	if (!(req = evhttp_request_new(fetch_done, t)) || !cred || !basic || (o->scope && *o->scope && !scope)) {
		evhttp_connection_free(t->evcon);
		t->evcon = NULL;
		km_sasl_fail(err, errlen, "out of memory");
		goto out;
	}
	snprintf(cred, cl, "%s:%s", o->client_id, o->client_secret);
	memcpy(basic, "Basic ", 6);
	EVP_EncodeBlock((unsigned char *)basic + 6, (const unsigned char *)cred, (int)strlen(cred));
	h = evhttp_request_get_output_headers(req);
	evhttp_add_header(h, "Host", host);
	evhttp_add_header(h, "Authorization", basic);
	evhttp_add_header(h, "Content-Type", "application/x-www-form-urlencoded");
	evhttp_add_header(h, "Accept", "application/json");
	evhttp_add_header(h, "Connection", "close");
	evbuffer_add_printf(evhttp_request_get_output_buffer(req), "grant_type=client_credentials%s%s",
			    scope ? "&scope=" : "", scope ? scope : "");
	t->base = base;
	if (evhttp_make_request(t->evcon, req, EVHTTP_REQ_POST, target) != 0) {
		if (t->evcon) {
			evhttp_connection_free(t->evcon);
			t->evcon = NULL;
		}
		km_sasl_fail(err, errlen, "%s: cannot send a request to %s", setting_of(o), o->token_endpoint_url);
		goto out;
	}
	rc = KM_OK;
out:
	if (uri)
		evhttp_uri_free(uri);
	wipe_free(cred);
	wipe_free(basic);
	free(scope);
	return rc;
}

/*
 * t's token for a connection once a refresh was asked for if due: the token while it lives (the
 * old one until the new one is there); else, with a refresh under way (busy), w waits for it
 * (*token NULL, KM_OK); else none from `from` yet.
 */
static km_err src_serve(token_src *t, int64_t now, bool busy, km_sasl_oauth_wait *w, char **token, const char *from,
			const char *setting, char *err, size_t errlen)
{
	if (t->token && now < t->exp) {
		if (!(*token = strdup(t->token)))
			return km_sasl_fail(err, errlen, "out of memory");
		return KM_OK;
	}
	if (!busy || !w)
		return km_sasl_fail(err, errlen, "%s: no token from %s yet", setting, from);
	km_sasl_oauth_cancel(w);
	w->next = t->waiters;
	if (w->next)
		w->next->pprev = &w->next;
	w->pprev = &t->waiters;
	t->waiters = w;
	*token = NULL;
	return KM_OK;
}

/* ---- a token command: kmirrord's own (upstream_sasl_oauthbearer_token_command), never a mirror's ---- */

#define COMMAND_TIMEOUT_S 10

/* /bin/sh -c command with its stdout on *fd (its stdin /dev/null, its stderr kmirrord's). */
static km_err cmd_spawn(const char *command, pid_t *pid, int *fd, char *err, size_t errlen)
{
	int p[2];

	if (pipe(p) != 0 || fcntl(p[0], F_SETFD, FD_CLOEXEC) != 0)
		return km_sasl_fail(err, errlen, "cannot run the token command: %s", strerror(errno));
	if ((*pid = fork()) < 0) {
		close(p[0]);
		close(p[1]);
		return km_sasl_fail(err, errlen, "cannot run the token command: %s", strerror(errno));
	}
	if (*pid == 0) {
		int null = open("/dev/null", O_RDONLY);
		setpgid(0, 0); /* its own group: what it starts is killed with it (cmd_kill) */
		long max = sysconf(_SC_OPEN_MAX);
		if (null >= 0)
			dup2(null, 0);
		dup2(p[1], 1);
		/* Nothing of kmirrord's (its listeners, its connections) goes with it. */
		for (int i = 3; i < (max > 0 && max < 65536 ? max : 65536); i++)
			close(i);
		signal(SIGPIPE, SIG_DFL);
		execl("/bin/sh", "sh", "-c", command, (char *)NULL);
		_exit(127);
	}
	setpgid(*pid, *pid);
	close(p[1]);
	*fd = p[0];
	return KM_OK;
}

/* The command and whatever it started (its process group), which could hold kmirrord's stderr. */
static void cmd_kill(pid_t pid, int *status)
{
	kill(-pid, SIGKILL);
	kill(pid, SIGKILL);
	waitpid(pid, status, 0);
}

/* Its stdout closed: its exit status, given a second to exit (then it is killed: one that lingers). */
static void cmd_reap(pid_t pid, int *status)
{
	struct timespec tick = {0, 10 * 1000 * 1000};
	for (int i = 0; i < 100; i++) {
		if (waitpid(pid, status, WNOHANG) == pid)
			return;
		nanosleep(&tick, NULL);
	}
	cmd_kill(pid, status);
}

/* The command's output and exit: a live JWT into *tok (owned), with its exp; or why not. */
static km_err cmd_result(const char *setting, const char *command, const char *out, size_t len, int status, char **tok,
			 int64_t *exp, int64_t *iat, char *err, size_t errlen)
{
	int64_t now = (int64_t)time(NULL);
	char why[200];
	size_t a = 0, b = len;

	*tok = NULL;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		return km_sasl_fail(err, errlen, "%s: the token command '%.200s' %s %d", setting, command,
				    WIFEXITED(status) ? "exited with status" : "was ended by signal",
				    WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? WTERMSIG(status) : 0);
	while (a < b && (out[a] == ' ' || out[a] == '\n' || out[a] == '\r' || out[a] == '\t'))
		a++;
	while (b > a && (out[b - 1] == ' ' || out[b - 1] == '\n' || out[b - 1] == '\r' || out[b - 1] == '\t'))
		b--;
	if (km_sasl_oauth_jwt(out + a, b - a, exp, iat, why, sizeof(why)) != KM_OK)
		return km_sasl_fail(err, errlen, "%s: the token command '%.200s' printed %s: it must print the access "
				    "token (a JWT) on its standard output", setting, command, why);
	if (*exp <= now)
		return km_sasl_fail(err, errlen, "%s: the token command '%.200s' printed a token that expired %lld s ago",
				    setting, command, (long long)(now - *exp));
	if (!(*tok = strndup(out + a, b - a)))
		return km_sasl_fail(err, errlen, "out of memory");
	return KM_OK;
}

static void cmd_end(token_src *t)
{
	if (t->ev)
		event_free(t->ev);
	if (t->timer)
		event_free(t->timer);
	if (t->fd >= 0)
		close(t->fd);
	if (t->out) {
		size_t n = evbuffer_get_length(t->out);
		unsigned char *p = n ? evbuffer_pullup(t->out, -1) : NULL;
		if (p)
			OPENSSL_cleanse(p, n);
		evbuffer_free(t->out);
	}
	t->ev = t->timer = NULL;
	t->out = NULL;
	t->fd = -1;
	t->pid = 0;
}

/* The run is over (its stdout closed, or its time up): its token, or why not, to every waiter. */
static void cmd_over(token_src *t, bool timed_out)
{
	int status = 0;
	int64_t exp = 0, iat = 0, now = (int64_t)time(NULL);
	char *tok = NULL, why[400] = "";
	size_t len = evbuffer_get_length(t->out);
	const char *out = len ? (const char *)evbuffer_pullup(t->out, -1) : "";
	km_err rc;

	if (timed_out)
		cmd_kill(t->pid, &status);
	else
		cmd_reap(t->pid, &status);
	if (timed_out)
		rc = km_sasl_fail(why, sizeof(why), "%s: the token command '%.200s' printed no token in %d s", t->setting,
				  t->url, COMMAND_TIMEOUT_S);
	else
		rc = cmd_result(t->setting, t->url, out, len, status, &tok, &exp, &iat, why, sizeof(why));
	cmd_end(t);
	if (rc == KM_OK) {
		src_set(t, tok, exp, iat > 0 && iat <= now ? iat : now);
		why[0] = 0;
	} else {
		KM_WARN("net", 0, "%s", why);
		rc = KM_ERR_SASL;
	}
	wake(t, rc, why);
}

static void cmd_read(evutil_socket_t fd, short what, void *arg)
{
	token_src *t = arg;
	int n;
	(void)what;

	n = evbuffer_read(t->out, fd, 4096);
	if (n > 0 && evbuffer_get_length(t->out) <= TOKEN_FILE_MAX)
		return;
	cmd_over(t, n > 0); /* EOF or an error; or more than a token: cut short */
}

static void cmd_timeout(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	cmd_over(arg, true);
}

static km_err cmd_start(token_src *t, struct event_base *base, char *err, size_t errlen)
{
	struct timeval tv = {COMMAND_TIMEOUT_S, 0};

	t->fd = -1;
	if (cmd_spawn(t->url, &t->pid, &t->fd, err, errlen) != KM_OK)
		return KM_ERR_CONFIG;
	if (!(t->out = evbuffer_new()) || !(t->ev = event_new(base, t->fd, EV_READ | EV_PERSIST, cmd_read, t)) ||
	    !(t->timer = evtimer_new(base, cmd_timeout, t)) || event_add(t->ev, NULL) != 0 || event_add(t->timer, &tv) != 0) {
		cmd_kill(t->pid, NULL);
		cmd_end(t);
		return km_sasl_fail(err, errlen, "out of memory");
	}
	return KM_OK;
}

/* Once, before any connection (base NULL: kmirrord's start and --check-config): run and wait. */
static km_err cmd_once(const km_sasl_oauth *o, char **token, char *err, size_t errlen)
{
	char buf[TOKEN_FILE_MAX];
	size_t len = 0;
	int fd, status = 0;
	pid_t pid;
	int64_t exp, iat, deadline = (int64_t)time(NULL) + COMMAND_TIMEOUT_S;
	struct pollfd pf;

	if (cmd_spawn(o->command, &pid, &fd, err, errlen) != KM_OK)
		return KM_ERR_CONFIG;
	pf.fd = fd;
	pf.events = POLLIN;
	for (;;) {
		int64_t left = deadline - (int64_t)time(NULL);
		ssize_t n;
		if (left <= 0 || poll(&pf, 1, (int)left * 1000) == 0) {
			cmd_kill(pid, NULL);
			close(fd);
			OPENSSL_cleanse(buf, sizeof(buf));
			return km_sasl_fail(err, errlen, "%s: the token command '%.200s' printed no token in %d s",
					    setting_of(o), o->command, COMMAND_TIMEOUT_S);
		}
		n = read(fd, buf + len, sizeof(buf) - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0 || (len += (size_t)n) == sizeof(buf))
			break;
	}
	close(fd);
	cmd_reap(pid, &status);
	km_err rc = cmd_result(setting_of(o), o->command, buf, len, status, token, &exp, &iat, err, errlen);
	OPENSSL_cleanse(buf, sizeof(buf));
	return rc;
}

static km_err command_token(const km_sasl_oauth *o, struct event_base *base, km_sasl_oauth_wait *w, char **token,
			    char *err, size_t errlen)
{
	int64_t now = (int64_t)time(NULL);
	size_t kl = strlen(o->command) + 3;
	char *key = malloc(kl);
	token_src *t;

	if (!key)
		return km_sasl_fail(err, errlen, "out of memory");
	snprintf(key, kl, "\x02%s\x02", o->command);
	t = src_get(key, o->command, setting_of(o));
	free(key);
	if (!t)
		return km_sasl_fail(err, errlen, "out of memory");
	if (!base)
		return cmd_once(o, token, err, errlen);
	t->used = now;
	if (t->token && now < t->refresh_at)
		return src_serve(t, now, false, NULL, token, NULL, NULL, err, errlen);
	/* Due (or none yet): run it once, for every connection that needs it. */
	if (!t->pid && cmd_start(t, base, err, errlen) != KM_OK && !(t->token && now < t->exp))
		return KM_ERR_CONFIG;
	return src_serve(t, now, t->pid != 0, w, token, "the command", setting_of(o), err, errlen);
}

static km_err endpoint_token(const km_sasl_oauth *o, struct event_base *base, struct evdns_base *dns,
			     km_sasl_oauth_wait *w, char **token, char *err, size_t errlen)
{
	int64_t now = (int64_t)time(NULL);
	size_t kl = strlen(o->token_endpoint_url) + strlen(o->client_id) + strlen(o->client_secret) +
		    (o->scope ? strlen(o->scope) : 0) + 4;
	char *key = malloc(kl);
	token_src *t;

	if (!key)
		return km_sasl_fail(err, errlen, "out of memory");
	snprintf(key, kl, "%s\x01%s\x01%s\x01%s", o->token_endpoint_url, o->client_id, o->scope ? o->scope : "",
		 o->client_secret);
	t = src_get(key, o->token_endpoint_url, setting_of(o));
	wipe_free(key);
	if (!t)
		return km_sasl_fail(err, errlen, "out of memory");
	t->used = now;
	if (t->token && now < t->refresh_at)
		return src_serve(t, now, false, NULL, token, NULL, NULL, err, errlen);
	/* Due (or none yet): ask once, for every connection that needs it. */
	if (!t->evcon && base && fetch_start(t, o, base, dns, err, errlen) != KM_OK && !(t->token && now < t->exp))
		return KM_ERR_CONFIG;
	return src_serve(t, now, t->evcon != NULL, w, token, t->url, setting_of(o), err, errlen);
}

void km_sasl_oauth_cancel(km_sasl_oauth_wait *w)
{
	if (!w->pprev)
		return;
	*w->pprev = w->next;
	if (w->next)
		w->next->pprev = w->pprev;
	w->next = NULL;
	w->pprev = NULL;
}

/* The URL's kind, and an endpoint's client credentials; KM_ERR_CONFIG with what to do. */
static km_err check_source(const km_sasl_oauth *o, char *err, size_t errlen)
{
	if (km_secret_url_file(o->token_endpoint_url))
		return KM_OK;
	if (!endpoint_url(o->token_endpoint_url))
		return km_sasl_fail(err, errlen, "%s '%.200s' is not a token endpoint: use file:///PATH/TO/TOKEN (a file holding "
					 "the token) or http(s)://HOST/PATH (the client-credentials grant)",
			    setting_of(o), o->token_endpoint_url ? o->token_endpoint_url : "");
	if (!o->client_id || !*o->client_id || !o->client_secret || !*o->client_secret)
		return km_sasl_fail(err, errlen, "%s: the token endpoint %s needs a client id and secret (sasl.jaas.config's "
					 "clientId and clientSecret)",
			    setting_of(o), o->token_endpoint_url);
	return KM_OK;
}

km_err km_sasl_oauth_get(const km_sasl_oauth *o, struct event_base *base, struct evdns_base *dns,
			 km_sasl_oauth_wait *w, char **token, char *err, size_t errlen)
{
	const char *path = km_secret_url_file(o->token_endpoint_url);

	*token = NULL;
	src_sweep((int64_t)time(NULL));
	if (o->command && *o->command)
		return command_token(o, base, w, token, err, errlen);
	if (check_source(o, err, errlen) != KM_OK)
		return KM_ERR_CONFIG;
	return path ? file_token(o, path, token, err, errlen) : endpoint_token(o, base, dns, w, token, err, errlen);
}

km_err km_sasl_oauth_check(const km_sasl_oauth *o, char *err, size_t errlen)
{
	char *tok = NULL;
	km_err rc;

	if (o->command && *o->command) {
		rc = km_sasl_oauth_get(o, NULL, NULL, NULL, &tok, err, errlen);
		wipe_free(tok);
		return rc;
	}
	if (check_source(o, err, errlen) != KM_OK)
		return KM_ERR_CONFIG;
	if (!km_secret_url_file(o->token_endpoint_url))
		return KM_OK;
	rc = km_sasl_oauth_get(o, NULL, NULL, NULL, &tok, err, errlen);
	wipe_free(tok);
	return rc;
}
