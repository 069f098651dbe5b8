/* OAUTHBEARER tokens: a JWT read from a file:// token endpoint (KIP-768), kept per file and read again before it expires. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "kmirror/log.h"
#include "kmirror/secret.h"
#include "net/sasl_int.h"

#define TOKEN_FILE_MAX (64 * 1024) /* a JWT is a few KiB at most */

static km_err fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static km_err fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return KM_ERR_CONFIG;
}

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
		return fail(err, errlen, "sasl.jaas.config: kmirror makes no unsecured tokens (unsecuredLogin*): write "
					 "a token to a file and set sasl.oauthbearer.token.endpoint.url=file:///PATH");
	}
	*client_id = v[0];
	*client_secret = v[1];
	*scope = v[2];
	return KM_OK;
}

/* ---- tokens from files, kept per file ---- */

typedef struct token_file {
	struct token_file *next;
	char *path;
	char *token;
	int64_t exp, refresh_at; /* seconds since the epoch */
	struct stat st;          /* the file as read */
	bool warned;             /* past refresh_at with no newer token: said once */
} token_file;

/* kmirrord and the CLI run one event loop thread: no lock. */
static token_file *token_files;

static const char *setting_of(const km_sasl_oauth *o)
{
	return o->setting && *o->setting ? o->setting : "sasl.oauthbearer.token.endpoint.url";
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

/* The file's token (whitespace trimmed) into a fresh entry's fields; st: the file as opened. */
static km_err read_token(const km_sasl_oauth *o, const char *path, char **token, struct stat *st, char *err,
			 size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	char *buf;
	ssize_t n;
	size_t len = 0, start = 0;

	if (fd < 0)
		return fail(err, errlen, "%s: cannot read %s: %s (write the token there, readable by kmirror's user)",
			    setting_of(o), path, strerror(errno));
	if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode) || st->st_size > TOKEN_FILE_MAX) {
		close(fd);
		return fail(err, errlen, "%s: %s is not a regular file of at most %d bytes holding one token",
			    setting_of(o), path, TOKEN_FILE_MAX);
	}
	if (!(buf = malloc(TOKEN_FILE_MAX + 1))) {
		close(fd);
		return fail(err, errlen, "out of memory");
	}
	while (len < TOKEN_FILE_MAX && (n = read(fd, buf + len, TOKEN_FILE_MAX - len)) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			int e = errno;
			close(fd);
			OPENSSL_cleanse(buf, TOKEN_FILE_MAX + 1);
			free(buf);
			return fail(err, errlen, "%s: cannot read %s: %s", setting_of(o), path, strerror(e));
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
		return fail(err, errlen, "%s: %s is empty: write the token (a JWT) there", setting_of(o), path);
	}
	memmove(buf, buf + start, len - start + 1);
	*token = buf;
	return KM_OK;
}

km_err km_sasl_oauth_token(const km_sasl_oauth *o, char **token, char *err, size_t errlen)
{
	const char *path = km_secret_url_file(o->token_endpoint_url);
	int64_t now = (int64_t)time(NULL), exp, iat, born;
	token_file *f;
	struct stat st;
	char *tok = NULL, why[200], when[40];

	*token = NULL;
	if (!path)
		return fail(err, errlen, "%s '%.200s' is not a file URL: use file:///PATH/TO/TOKEN (a file holding the "
					 "token, kept fresh by something else)",
			    setting_of(o), o->token_endpoint_url ? o->token_endpoint_url : "");
	for (f = token_files; f && strcmp(f->path, path); f = f->next)
		;
	if (f && now < f->refresh_at && stat(path, &st) == 0 && same_file(&st, &f->st))
		goto have;
	if (read_token(o, path, &tok, &st, err, errlen) != KM_OK)
		return KM_ERR_CONFIG;
	if (km_sasl_oauth_jwt(tok, strlen(tok), &exp, &iat, why, sizeof(why)) != KM_OK) {
		OPENSSL_cleanse(tok, strlen(tok));
		free(tok);
		return fail(err, errlen, "%s: %s holds %s: write the token endpoint's access token there", setting_of(o),
			    path, why);
	}
	if (exp <= now) {
		OPENSSL_cleanse(tok, strlen(tok));
		free(tok);
		utc(exp, when, sizeof(when));
		return fail(err, errlen, "%s: the token in %s expired at %s (%lld s ago): write a fresh token there",
			    setting_of(o), path, when, (long long)(now - exp));
	}
	if (!f) {
		if (!(f = calloc(1, sizeof(*f))) || !(f->path = strdup(path))) {
			free(f);
			OPENSSL_cleanse(tok, strlen(tok));
			free(tok);
			return fail(err, errlen, "out of memory");
		}
		f->next = token_files;
		token_files = f;
	}
	if (!f->token || strcmp(f->token, tok) != 0)
		f->warned = false;
	if (f->token) {
		OPENSSL_cleanse(f->token, strlen(f->token));
		free(f->token);
	}
	f->token = tok;
	f->st = st;
	f->exp = exp;
	born = iat > 0 && iat <= now ? iat : now;
	f->refresh_at = born + (exp - born) * 4 / 5;
	if (now >= f->refresh_at && !f->warned) {
		/* Read again at every connection from here on; the token still works until exp. */
		f->warned = true;
		utc(exp, when, sizeof(when));
		KM_WARN("net", 0, "%s: the token in %s expires at %s (in %lld s) and no newer one was written there: "
				  "connections will fail from then on", setting_of(o), path, when, (long long)(exp - now));
	}
have:
	if (!(*token = strdup(f->token)))
		return fail(err, errlen, "out of memory");
	return KM_OK;
}

km_err km_sasl_oauth_check(const km_sasl_oauth *o, char *err, size_t errlen)
{
	char *tok = NULL;
	km_err rc = km_sasl_oauth_token(o, &tok, err, errlen);
	if (tok) {
		OPENSSL_cleanse(tok, strlen(tok));
		free(tok);
	}
	return rc;
}
