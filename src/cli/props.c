/* kmirror CLI properties: Java .properties files, sasl.jaas.config, and Kafka tool client properties to connection settings. */
#include <ctype.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "cli/cli.h"
#include "kmirror/net.h"

#define MAX_PROPS_FILE (1024 * 1024) /* a properties file is small; refuse anything bigger */

static km_err cfg_fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static km_err cfg_fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return KM_ERR_CONFIG;
}

/* ---- .properties ---- */

typedef struct sbuf {
	char *p;
	size_t len, cap;
} sbuf;

/* The text may be a secret's (a property file's password, a JAAS line): wiped before it is freed. */
static void sb_free(sbuf *b)
{
	if (b->p)
		OPENSSL_cleanse(b->p, b->cap);
	free(b->p);
	b->p = NULL;
	b->len = b->cap = 0;
}

/* A string that may be a secret, wiped and freed. */
static void free_secret(char *s)
{
	if (s)
		OPENSSL_cleanse(s, strlen(s));
	free(s);
}

static bool sb_add(sbuf *b, char c)
{
	if (b->len + 1 >= b->cap) {
		/* Not realloc: it would leave the text so far behind in freed memory. */
		size_t cap = b->cap ? b->cap * 2 : 64, len = b->len;
		char *p = malloc(cap);
		if (!p)
			return false;
		if (b->p)
			memcpy(p, b->p, len + 1);
		sb_free(b);
		b->p = p;
		b->len = len;
		b->cap = cap;
	}
	b->p[b->len++] = c;
	b->p[b->len] = 0;
	return true;
}

/* Make p a valid (possibly empty) string. */
static bool sb_ensure(sbuf *b)
{
	if (b->p)
		return true;
	if (!(b->p = malloc(16)))
		return false;
	b->cap = 16;
	b->p[0] = 0;
	return true;
}

/* Append code point cp as UTF-8. */
static bool sb_utf8(sbuf *b, unsigned cp)
{
	if (cp < 0x80)
		return sb_add(b, (char)cp);
	if (cp < 0x800)
		return sb_add(b, (char)(0xc0 | cp >> 6)) && sb_add(b, (char)(0x80 | (cp & 0x3f)));
	return sb_add(b, (char)(0xe0 | cp >> 12)) && sb_add(b, (char)(0x80 | ((cp >> 6) & 0x3f))) &&
	       sb_add(b, (char)(0x80 | (cp & 0x3f)));
}

/*
 * One logical line (continuations joined, escapes resolved) from [*pos, len): key into k, value
 * into v. Returns 1 for a key, 0 for a blank or comment line, -1 at the end, -2 for a bad escape.
 */
static int next_prop(const char *t, size_t len, size_t *pos, int *line, sbuf *k, sbuf *v)
{
	size_t i = *pos;
	bool in_value = false;
	sbuf *cur = k;

	k->len = v->len = 0;
	if (k->p)
		k->p[0] = 0;
	if (v->p)
		v->p[0] = 0;
	if (i >= len)
		return -1;
	(*line)++;
	while (i < len && (t[i] == ' ' || t[i] == '\t' || t[i] == '\f'))
		i++;
	if (i >= len || t[i] == '\n' || t[i] == '\r' || t[i] == '#' || t[i] == '!') {
		while (i < len && t[i] != '\n')
			i++;
		*pos = i < len ? i + 1 : i;
		return 0;
	}
	while (i < len && t[i] != '\n' && t[i] != '\r') {
		char c = t[i++];
		if (!in_value && (c == '=' || c == ':' || c == ' ' || c == '\t' || c == '\f')) {
			/* The key ends at the first unescaped separator; whitespace around it is skipped. */
			bool sep = c == '=' || c == ':';
			while (i < len && (t[i] == ' ' || t[i] == '\t' || t[i] == '\f'))
				i++;
			if (!sep && i < len && (t[i] == '=' || t[i] == ':')) {
				i++;
				while (i < len && (t[i] == ' ' || t[i] == '\t' || t[i] == '\f'))
					i++;
			}
			in_value = true;
			cur = v;
			continue;
		}
		if (c == '\\') {
			if (i >= len)
				break; /* a backslash at the end of the text: nothing follows */
			c = t[i++];
			if (c == '\n' || c == '\r') {
				/* A continuation: the next line's leading whitespace is dropped. */
				if (c == '\r' && i < len && t[i] == '\n')
					i++;
				(*line)++;
				while (i < len && (t[i] == ' ' || t[i] == '\t' || t[i] == '\f'))
					i++;
				continue;
			}
			if (c == 'u') {
				unsigned cp = 0;
				for (int d = 0; d < 4; d++, i++) {
					if (i >= len || !isxdigit((unsigned char)t[i]))
						return -2;
					cp = cp * 16 + (unsigned)(isdigit((unsigned char)t[i]) ? t[i] - '0'
											: (tolower((unsigned char)t[i]) - 'a' + 10));
				}
				if (!sb_utf8(cur, cp))
					return -3;
				continue;
			}
			c = c == 't' ? '\t' : c == 'n' ? '\n' : c == 'r' ? '\r' : c == 'f' ? '\f' : c;
		}
		if (!sb_add(cur, c))
			return -3;
	}
	if (i < len && t[i] == '\r')
		i++;
	if (i < len && t[i] == '\n')
		i++;
	*pos = i;
	if (!sb_ensure(k) || !sb_ensure(v))
		return -3;
	return 1;
}

km_err km_cli_props_parse(const char *text, size_t len, km_cli_kvs *kv, char *err, size_t errlen)
{
	sbuf k = {0}, v = {0};
	size_t pos = 0;
	int line = 0, rc;
	km_err out = KM_OK;

	while ((rc = next_prop(text, len, &pos, &line, &k, &v)) != -1) {
		if (rc == 0)
			continue;
		if (rc == -2) {
			out = cfg_fail(err, errlen, "line %d: bad \\u escape", line);
			break;
		}
		if (rc == -3 || !km_cli_kvs_set(kv, k.p, v.p)) {
			out = cfg_fail(err, errlen, "out of memory");
			break;
		}
	}
	sb_free(&k);
	sb_free(&v);
	return out;
}

km_err km_cli_props_load(const char *path, km_cli_kvs *kv, char *err, size_t errlen)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	size_t n;
	char why[256];
	km_err rc;

	if (!f)
		return cfg_fail(err, errlen, "%s: cannot open: %m", path);
	buf = malloc(MAX_PROPS_FILE + 1);
	if (!buf) {
		fclose(f);
		return cfg_fail(err, errlen, "out of memory");
	}
	n = fread(buf, 1, MAX_PROPS_FILE + 1, f);
	if (ferror(f) || n > MAX_PROPS_FILE) {
		fclose(f);
		OPENSSL_cleanse(buf, MAX_PROPS_FILE + 1);
		free(buf);
		return cfg_fail(err, errlen, "%s: %s", path, n > MAX_PROPS_FILE ? "larger than 1 MiB" : "read error");
	}
	fclose(f);
	rc = km_cli_props_parse(buf, n, kv, why, sizeof(why));
	OPENSSL_cleanse(buf, MAX_PROPS_FILE + 1);
	free(buf);
	if (rc != KM_OK)
		return cfg_fail(err, errlen, "%s: %s", path, why);
	return KM_OK;
}

/* ---- sasl.jaas.config ---- */

static const char *skip_ws(const char *p)
{
	while (*p && isspace((unsigned char)*p))
		p++;
	return p;
}

km_err km_cli_jaas_parse(const char *jaas, char **username, char **password, const char **module_mechanism,
			 char *err, size_t errlen)
{
	static const char *const keys[] = {"username", "password"};
	const char *p = skip_ws(jaas), *start, *module = NULL;
	char *v[2];
	size_t n;

	*username = *password = NULL;
	*module_mechanism = NULL;
	start = p;
	while (*p && !isspace((unsigned char)*p) && *p != ';')
		p++;
	n = (size_t)(p - start);
	/* The login module: the class's last component decides the mechanism family. */
	if (n >= 16 && !strncmp(p - 16, "PlainLoginModule", 16)) {
		*module_mechanism = "PLAIN";
		module = "org.apache.kafka.common.security.plain.PlainLoginModule";
	} else if (n >= 16 && !strncmp(p - 16, "ScramLoginModule", 16)) {
		*module_mechanism = "SCRAM";
		module = "org.apache.kafka.common.security.scram.ScramLoginModule";
	}
	if (!module)
		return cfg_fail(err, errlen,
				"sasl.jaas.config: login module '%.*s' is not supported: use "
				"org.apache.kafka.common.security.plain.PlainLoginModule or "
				"org.apache.kafka.common.security.scram.ScramLoginModule",
				(int)(n > 100 ? 100 : n), start);
	if (km_sasl_jaas_options(jaas, module, *module_mechanism, keys, v, 2, err, errlen) != KM_OK)
		return KM_ERR_CONFIG;
	if (!v[0] || !v[1]) {
		bool nouser = !v[0];
		km_sasl_jaas_free(v, 2);
		return cfg_fail(err, errlen, "sasl.jaas.config: no %s= option", nouser ? "username" : "password");
	}
	*username = v[0];
	*password = v[1];
	return KM_OK;
}

/* ---- client properties ---- */

/* Java-only properties, and what the CLI takes instead. */
static const struct {
	const char *prefix;
	const char *instead;
} java_only[] = {
	{"sasl.login.callback.handler.class", "sasl.jaas.config with username and password"},
	{"sasl.client.callback.handler.class", "sasl.jaas.config with username and password"},
	{"sasl.oauthbearer.", "sasl.oauthbearer.token.endpoint.url (file:///PATH, or an http(s) token endpoint with "
			      "sasl.jaas.config's clientId, clientSecret and scope, or sasl.oauthbearer.client.credentials.client.id, "
			      ".client.secret and sasl.oauthbearer.scope)"},
};

/* Properties Kafka's tools commonly carry that have no meaning for kmirror; silently ignored. */
static const char *const harmless[] = {
	"request.timeout.ms", "default.api.timeout.ms", "retries", "retry.backoff.ms", "client.dns.lookup",
	"ssl.protocol", "ssl.enabled.protocols", "ssl.cipher.suites", "metadata.max.age.ms",
	"ssl.keymanager.algorithm", "ssl.trustmanager.algorithm",
	/* The Java login thread's and librdkafka's kinit tuning: the GSS-API library refreshes tickets itself. */
	"sasl.kerberos.kinit.cmd", "sasl.kerberos.min.time.before.relogin", "sasl.kerberos.ticket.renew.jitter",
	"sasl.kerberos.ticket.renew.window.factor",
	/* The Java login's token refresh tuning: kmirror reads the token file again itself. */
	"sasl.login.refresh.window.factor", "sasl.login.refresh.window.jitter", "sasl.login.refresh.min.period.seconds",
	"sasl.login.refresh.buffer.seconds", NULL,
};

/* Kafka's Java store properties, each a field of the client's truststore or keystore. */
static const struct {
	const char *name;
	bool keystore;
	size_t field;
} store_props[] = {
	{"ssl.truststore.location", false, offsetof(km_cli_store, location)},
	{"ssl.truststore.type", false, offsetof(km_cli_store, type)},
	{"ssl.truststore.password", false, offsetof(km_cli_store, password)},
	{"ssl.truststore.certificates", false, offsetof(km_cli_store, certificates)},
	{"ssl.keystore.location", true, offsetof(km_cli_store, location)},
	{"ssl.keystore.type", true, offsetof(km_cli_store, type)},
	{"ssl.keystore.password", true, offsetof(km_cli_store, password)},
	{"ssl.keystore.certificate.chain", true, offsetof(km_cli_store, certificates)},
	{"ssl.keystore.key", true, offsetof(km_cli_store, key)},
	{"ssl.key.password", true, offsetof(km_cli_store, key_password)},
};

/* The field of c that store property k sets; NULL: not one. */
static char **store_field(km_cli_client *c, const char *k)
{
	for (size_t i = 0; i < sizeof(store_props) / sizeof(store_props[0]); i++)
		if (!strcmp(k, store_props[i].name))
			return (char **)((char *)(store_props[i].keystore ? &c->keystore : &c->truststore) +
					 store_props[i].field);
	return NULL;
}

bool km_cli_store_given(const km_cli_store *s)
{
	return s->location || s->certificates || s->key;
}

static void store_free(km_cli_store *s)
{
	free(s->location);
	free(s->type);
	free_secret(s->password);
	free(s->certificates);
	free_secret(s->key);
	free_secret(s->key_password);
}

static char *dup_or_null(const char *s)
{
	return s ? strdup(s) : NULL;
}

/* The SASL properties as read (the JAAS line's user and password are parsed from jaas later). */
typedef struct sasl_props {
	const char *mech, *jaas, *user, *pass;
	const char *krb5_service, *krb5_keytab, *krb5_principal; /* sasl.kerberos.* (the last two librdkafka's) */
	const char *oauth_url; /* sasl.oauthbearer.token.endpoint.url */
	/* Kafka 4.1's sasl.oauthbearer.client.credentials.client.id, .client.secret, sasl.oauthbearer.scope */
	const char *oauth_id, *oauth_secret, *oauth_scope;
} sasl_props;

/*
 * One property into c (TLS files, client.id) or sp; *known false for one kmirror does not read.
 * Not KM_OK: a Java-only property or a bad value (err says which; c is the caller's to free).
 */
static km_err take_prop(km_cli_client *c, sasl_props *sp, const char **proto, const char *k, const char *v,
			bool *known, char *err, size_t errlen)
{
	char **field = store_field(c, k);

	*known = true;
	if (!strcmp(k, "sasl.oauthbearer.token.endpoint.url")) {
		sp->oauth_url = v;
		return KM_OK;
	}
	if (!strcmp(k, "sasl.oauthbearer.client.credentials.client.id")) {
		sp->oauth_id = v;
		return KM_OK;
	}
	if (!strcmp(k, "sasl.oauthbearer.client.credentials.client.secret")) {
		sp->oauth_secret = v;
		return KM_OK;
	}
	if (!strcmp(k, "sasl.oauthbearer.scope")) {
		sp->oauth_scope = v;
		return KM_OK;
	}
	/* What Java clients need for KIP-768's token endpoint; kmirror reads it without a handler. */
	if (!strcmp(k, "sasl.login.callback.handler.class") && strstr(v, "OAuthBearerLoginCallbackHandler"))
		return KM_OK;
	for (size_t j = 0; j < sizeof(java_only) / sizeof(java_only[0]); j++)
		if (!strncmp(k, java_only[j].prefix, strlen(java_only[j].prefix)))
			return cfg_fail(err, errlen, "%s is a Java client property kmirror does not read: use %s", k,
					java_only[j].instead);
	if (!strcmp(k, "security.protocol"))
		*proto = v;
	else if (!strcmp(k, "sasl.mechanism") || !strcmp(k, "sasl.mechanisms"))
		sp->mech = v;
	else if (!strcmp(k, "sasl.jaas.config"))
		sp->jaas = v;
	else if (!strcmp(k, "sasl.username"))
		sp->user = v;
	else if (!strcmp(k, "sasl.password"))
		sp->pass = v;
	else if (!strcmp(k, "sasl.kerberos.service.name"))
		sp->krb5_service = v;
	else if (!strcmp(k, "sasl.kerberos.keytab"))
		sp->krb5_keytab = v;
	else if (!strcmp(k, "sasl.kerberos.principal"))
		sp->krb5_principal = v;
	else if (field) {
		free_secret(*field);
		if (!(*field = strdup(v)))
			return cfg_fail(err, errlen, "out of memory");
	} else if (!strcmp(k, "ssl.ca.location"))
		c->ca_file = strdup(v);
	else if (!strcmp(k, "ssl.certificate.location"))
		c->cert_file = strdup(v);
	else if (!strcmp(k, "ssl.key.location"))
		c->key_file = strdup(v);
	else if (!strcmp(k, "ssl.endpoint.identification.algorithm")) {
		if (!strcasecmp(v, "https"))
			c->verify_host = true;
		else if (!*v || !strcasecmp(v, "none"))
			c->verify_host = false;
		else
			return cfg_fail(err, errlen, "ssl.endpoint.identification.algorithm '%s': expected https or empty",
					v);
	} else if (!strcmp(k, "client.id"))
		c->client_id = strdup(v);
	else {
		*known = false;
		for (size_t j = 0; harmless[j]; j++)
			if (!strcmp(k, harmless[j]))
				*known = true;
	}
	return KM_OK;
}

/* The Java stores do not mix with the PEM files of the same role. */
static km_err check_stores(const km_cli_client *c, char *err, size_t errlen)
{
	if (c->ca_file && km_cli_store_given(&c->truststore))
		return cfg_fail(err, errlen,
				"ssl.ca.location and ssl.truststore.* both say which CAs to trust: keep one");
	if (c->cert_file && km_cli_store_given(&c->keystore))
		return cfg_fail(err, errlen,
				"ssl.certificate.location and ssl.keystore.* are both a client certificate: keep one");
	if (c->keystore.key_password && !km_cli_store_given(&c->keystore))
		return cfg_fail(err, errlen,
				"ssl.key.password is the password of ssl.keystore.*'s key: with ssl.key.location use an "
				"unencrypted PEM key (openssl pkey -in KEY -out KEY.pem)");
	return KM_OK;
}

/* security.protocol into c's tls and sasl flags. */
static km_err take_protocol(km_cli_client *c, const char *proto, char *err, size_t errlen)
{
	if (!strcasecmp(proto, "PLAINTEXT"))
		return KM_OK;
	if (!strcasecmp(proto, "SSL"))
		c->tls = true;
	else if (!strcasecmp(proto, "SASL_PLAINTEXT"))
		c->sasl = true;
	else if (!strcasecmp(proto, "SASL_SSL"))
		c->sasl = c->tls = true;
	else
		return cfg_fail(err, errlen, "security.protocol '%s': expected PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
				proto);
	return KM_OK;
}

/*
 * GSSAPI: keytab and principal from the Krb5LoginModule line (or librdkafka's sasl.kerberos.keytab
 * and sasl.kerberos.principal), the service name from sasl.kerberos.service.name (or the line's
 * serviceName); checked against the keytab before any connection.
 */
static km_err take_kerberos(km_cli_client *c, const sasl_props *sp, char *err, size_t errlen)
{
	char *kt = NULL, *pr = NULL, *svc = NULL;
	km_sasl_krb5 k;
	km_err rc;

	if (sp->jaas && (sp->krb5_keytab || sp->krb5_principal))
		return cfg_fail(err, errlen, "sasl.jaas.config and sasl.kerberos.keytab/principal both name the Kerberos "
					     "identity: keep one");
	if (sp->user || sp->pass)
		return cfg_fail(err, errlen, "sasl.mechanism GSSAPI takes no sasl.username or sasl.password: a keytab "
					     "and principal in sasl.jaas.config");
	if (sp->jaas) {
		if ((rc = km_sasl_krb5_jaas(sp->jaas, &kt, &pr, &svc, err, errlen)) != KM_OK)
			return rc;
	} else {
		kt = dup_or_null(sp->krb5_keytab);
		pr = dup_or_null(sp->krb5_principal);
	}
	if (sp->krb5_service) {
		free(svc);
		svc = strdup(sp->krb5_service);
	}
	c->krb5_keytab = kt;
	c->krb5_principal = pr;
	c->krb5_service = svc;
	if (!(c->sasl_mechanism = strdup("GSSAPI")))
		return cfg_fail(err, errlen, "out of memory");
	k = (km_sasl_krb5){svc, kt, pr, sp->jaas ? "sasl.jaas.config" : "sasl.kerberos.keytab"};
	return km_sasl_krb5_check(&k, err, errlen);
}

/* *field (wiped and freed) becomes a copy of v when v is given; false when out of memory. */
static bool take_over(char **field, const char *v)
{
	if (!v)
		return true;
	if (*field) {
		OPENSSL_cleanse(*field, strlen(*field));
		free(*field);
	}
	return (*field = strdup(v)) != NULL;
}

/*
 * OAUTHBEARER: the token from sasl.oauthbearer.token.endpoint.url, a file:///PATH or an http(s)
 * token endpoint with the JAAS line's clientId, clientSecret and scope (the line, when given, must
 * be OAuthBearerLoginModule's), or Kafka 4.1's sasl.oauthbearer.client.credentials.client.id,
 * .client.secret and sasl.oauthbearer.scope, which win. A file's token is checked before any
 * connection.
 */
static km_err take_oauth(km_cli_client *c, const sasl_props *sp, char *err, size_t errlen)
{
	km_sasl_oauth o;

	if (sp->user || sp->pass)
		return cfg_fail(err, errlen, "sasl.mechanism OAUTHBEARER takes no sasl.username or sasl.password: "
					     "sasl.oauthbearer.token.endpoint.url=file:///PATH (a file holding the token) or "
					     "an http(s) token endpoint with sasl.jaas.config's clientId and clientSecret");
	if (!sp->oauth_url)
		return cfg_fail(err, errlen, "sasl.mechanism OAUTHBEARER needs sasl.oauthbearer.token.endpoint.url="
					     "file:///PATH (a file holding the token) or an http(s) token endpoint");
	if (sp->jaas && km_sasl_oauth_jaas(sp->jaas, &c->oauth_client_id, &c->oauth_client_secret, &c->oauth_scope,
					   err, errlen) != KM_OK)
		return KM_ERR_CONFIG;
	/* Kafka 4.1's properties win over the JAAS line's options. */
	if (!take_over(&c->oauth_client_id, sp->oauth_id) || !take_over(&c->oauth_client_secret, sp->oauth_secret) ||
	    !take_over(&c->oauth_scope, sp->oauth_scope))
		return cfg_fail(err, errlen, "out of memory");
	if (!(c->sasl_mechanism = strdup("OAUTHBEARER")) || !(c->oauth_url = strdup(sp->oauth_url)))
		return cfg_fail(err, errlen, "out of memory");
	o = (km_sasl_oauth){c->oauth_url, c->oauth_client_id, c->oauth_client_secret, c->oauth_scope,
			    "sasl.oauthbearer.token.endpoint.url"};
	return km_sasl_oauth_check(&o, err, errlen);
}

/* The SASL mechanism and credentials into c, from the sasl.* properties or the JAAS line. */
static km_err take_sasl(km_cli_client *c, sasl_props sp, char *err, size_t errlen)
{
	const char *jaas_family = NULL;
	char *juser = NULL, *jpass = NULL;
	km_err rc = KM_OK;

	if (sp.mech && !strcmp(sp.mech, "GSSAPI"))
		return take_kerberos(c, &sp, err, errlen);
	if (sp.mech && !strcmp(sp.mech, "OAUTHBEARER"))
		return take_oauth(c, &sp, err, errlen);
	if (!sp.mech && sp.jaas && strstr(sp.jaas, "OAuthBearerLoginModule"))
		return cfg_fail(err, errlen, "sasl.jaas.config's OAuthBearerLoginModule is for sasl.mechanism=OAUTHBEARER: "
					     "set it");
	if (sp.oauth_url || sp.oauth_id || sp.oauth_secret || sp.oauth_scope)
		return cfg_fail(err, errlen, "%s is for sasl.mechanism=OAUTHBEARER (it is %s)",
				sp.oauth_url ? "sasl.oauthbearer.token.endpoint.url"
				: sp.oauth_id ? "sasl.oauthbearer.client.credentials.client.id"
				: sp.oauth_secret ? "sasl.oauthbearer.client.credentials.client.secret"
						  : "sasl.oauthbearer.scope",
				sp.mech ? sp.mech : "not set");
	if (!sp.mech && sp.jaas && strstr(sp.jaas, "Krb5LoginModule"))
		return cfg_fail(err, errlen, "sasl.jaas.config's Krb5LoginModule is for sasl.mechanism=GSSAPI: set it");
	if (sp.krb5_keytab || sp.krb5_principal || sp.krb5_service)
		return cfg_fail(err, errlen, "sasl.kerberos.* properties are for sasl.mechanism=GSSAPI (it is %s)",
				sp.mech ? sp.mech : "not set");
	if (sp.jaas) {
		if ((rc = km_cli_jaas_parse(sp.jaas, &juser, &jpass, &jaas_family, err, errlen)) != KM_OK)
			return rc;
		sp.user = juser;
		sp.pass = jpass;
	}
	/* Kafka's default is GSSAPI; a PlainLoginModule says what is meant. */
	if (!sp.mech && jaas_family && !strcmp(jaas_family, "PLAIN"))
		sp.mech = "PLAIN";
	if (!sp.mech)
		rc = cfg_fail(err, errlen, "sasl.mechanism is required: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, GSSAPI or "
					   "OAUTHBEARER");
	else if (strcmp(sp.mech, "PLAIN") && strcmp(sp.mech, "SCRAM-SHA-256") && strcmp(sp.mech, "SCRAM-SHA-512"))
		rc = cfg_fail(err, errlen, "sasl.mechanism '%s' is not supported: use PLAIN, SCRAM-SHA-256, "
					   "SCRAM-SHA-512, GSSAPI or OAUTHBEARER", sp.mech);
	else if (jaas_family && strncmp(sp.mech, jaas_family, strlen(jaas_family)) != 0)
		rc = cfg_fail(err, errlen, "sasl.mechanism %s does not match the %s login module of sasl.jaas.config",
			      sp.mech, jaas_family);
	else if (!sp.user || !sp.pass)
		rc = cfg_fail(err, errlen, "SASL needs a username and password: sasl.jaas.config, or sasl.username "
					   "and sasl.password");
	else if (!(c->sasl_mechanism = strdup(sp.mech)) || !(c->username = dup_or_null(sp.user)) ||
		 !(c->password = dup_or_null(sp.pass)))
		rc = cfg_fail(err, errlen, "out of memory");
	free(juser);
	free_secret(jpass);
	return rc;
}

km_err km_cli_client_from_props(const km_cli_kvs *kv, km_cli_client *c, char *err, size_t errlen, char *warn,
				size_t warnlen)
{
	const char *proto = "PLAINTEXT";
	sasl_props sp = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
	size_t wl = 0;
	km_err rc = KM_OK;

	memset(c, 0, sizeof(*c));
	c->verify_host = true;
	if (warn && warnlen)
		warn[0] = 0;
	for (size_t i = 0; i < kv->count && rc == KM_OK; i++) {
		const char *k = kv->items[i].name, *v = kv->items[i].value ? kv->items[i].value : "";
		bool known;
		rc = take_prop(c, &sp, &proto, k, v, &known, err, errlen);
		if (rc == KM_OK && !known && warn && wl + strlen(k) + 3 < warnlen)
			wl += (size_t)snprintf(warn + wl, warnlen - wl, "%s%s", wl ? ", " : "", k);
	}
	if (rc == KM_OK)
		rc = take_protocol(c, proto, err, errlen);
	if (rc == KM_OK && (c->cert_file != NULL) != (c->key_file != NULL))
		rc = cfg_fail(err, errlen, "ssl.certificate.location and ssl.key.location go together");
	if (rc == KM_OK)
		rc = check_stores(c, err, errlen);
	if (rc == KM_OK && !c->sasl &&
	    (sp.mech || sp.jaas || sp.user || sp.pass || sp.krb5_keytab || sp.krb5_principal || sp.krb5_service ||
	     sp.oauth_url))
		rc = cfg_fail(err, errlen, "sasl.* properties need security.protocol SASL_PLAINTEXT or SASL_SSL (it is %s)",
			      proto);
	if (rc == KM_OK && c->sasl)
		rc = take_sasl(c, sp, err, errlen);
	if (rc != KM_OK)
		km_cli_client_free(c);
	return rc;
}

void km_cli_client_free(km_cli_client *c)
{
	free(c->sasl_mechanism);
	free(c->username);
	free_secret(c->password); /* it should not linger in freed memory */
	free(c->krb5_keytab);
	free(c->krb5_principal);
	free(c->krb5_service);
	free(c->oauth_url);
	free(c->oauth_client_id);
	free_secret(c->oauth_client_secret);
	free(c->oauth_scope);
	free(c->ca_file);
	free(c->cert_file);
	free(c->key_file);
	store_free(&c->truststore);
	store_free(&c->keystore);
	free(c->client_id);
	memset(c, 0, sizeof(*c));
}
