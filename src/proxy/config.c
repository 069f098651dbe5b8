/* kmirrord configuration: the option table and everything driven by it (defaults, parsing, reload checks, docs). */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kmirror/daemon_config.h"
#include "kmirror/log.h"
#include "kmirror/net.h"

#define OFF(f) offsetof(km_config, f)
#define I64MAX INT64_MAX

static const km_config_option options[] = {
	{"listen", KM_OPT_HOSTPORT, OFF(listen), "0.0.0.0:9092", 0, 0, false,
	 "Bootstrap listener. Clients put this address in bootstrap.servers."},
	{"advertised_host", KM_OPT_STRING, OFF(advertised_host), "localhost", 0, 0, true,
	 "Host name the proxy puts in every broker endpoint it returns to clients (Metadata, "
	 "FindCoordinator, DescribeCluster, Produce/Fetch NodeEndpoints)."},
	{"broker_port_base", KM_OPT_INT, OFF(broker_port_base), "19092", 1, 65535, false,
	 "Upstream broker node N is served on port broker_port_base + N (same bind host as listen)."},
	{"broker_port_count", KM_OPT_INT, OFF(broker_port_count), "1000", 1, 65535, false,
	 "Node ids 0 .. broker_port_count-1 get a port; a broker with a larger id is logged and not "
	 "reachable through the proxy."},
	{"upstream", KM_OPT_HOSTPORT_LIST, OFF(upstream), "", 0, 0, true,
	 "Bootstrap addresses of the upstream (destination) cluster, comma separated. Required. "
	 "A reload affects new connections and the next metadata refresh."},
	{"http_listen", KM_OPT_HOSTPORT, OFF(http_listen), "", 0, 0, false,
	 "Address of the HTTP endpoint serving /metrics and /healthz; empty disables it."},
	{"log_level", KM_OPT_LOG_LEVEL, OFF(log_level), "info", 0, 0, true,
	 "error, warn, info, debug or trace."},
	{"max_frame_bytes", KM_OPT_INT, OFF(max_frame_bytes), "104857600", 64, INT32_MAX, true,
	 "Largest request or response frame accepted (like the broker's socket.request.max.bytes); "
	 "a larger frame closes the connection."},
	{"idle_timeout_ms", KM_OPT_INT, OFF(idle_timeout_ms), "600000", 0, I64MAX, true,
	 "A client connection with no traffic and no request in flight for this long is closed "
	 "(0 = never)."},
	{"frame_timeout_ms", KM_OPT_INT, OFF(frame_timeout_ms), "30000", 0, I64MAX, true,
	 "A partially received frame that makes no progress for this long closes the connection "
	 "(0 = never)."},
	{"upstream_connect_timeout_ms", KM_OPT_INT, OFF(upstream_connect_timeout_ms), "10000", 1, I64MAX, true,
	 "Time allowed to connect (and finish TLS) to an upstream broker."},
	{"upstream_request_timeout_ms", KM_OPT_INT, OFF(upstream_request_timeout_ms), "300000", 0, I64MAX, true,
	 "A forwarded request whose response has not started after this long closes the client "
	 "connection (0 = never). Keep it above the clients' own request timeouts."},
	{"metadata_refresh_ms", KM_OPT_INT, OFF(metadata_refresh_ms), "30000", 100, I64MAX, true,
	 "How often the proxy asks the upstream for its broker list (new brokers get their port)."},
	{"max_inflight_requests", KM_OPT_INT, OFF(max_inflight_requests), "1000", 1, 1000000, true,
	 "Requests in flight per client connection; beyond it the proxy stops reading from the client."},
	{"connection_buffer_bytes", KM_OPT_INT, OFF(connection_buffer_bytes), "4194304", 4096, I64MAX, true,
	 "Bytes queued towards a peer above which the proxy stops reading from the other side "
	 "(backpressure)."},
	{"drain_timeout_ms", KM_OPT_INT, OFF(drain_timeout_ms), "30000", 0, I64MAX, true,
	 "On SIGTERM, the time over which client connections are closed; whatever is left then is "
	 "closed at once and the daemon exits."},
	{"drain_interval_ms", KM_OPT_INT, OFF(drain_interval_ms), "1000", 10, I64MAX, true,
	 "On SIGTERM, the pause between two closing rounds (librdkafka clients need about a second "
	 "between brokers); each round closes an even share of the connections."},
	{"tls_cert_file", KM_OPT_STRING, OFF(tls_cert_file), "", 0, 0, true,
	 "PEM certificate (chain) for client-facing TLS; set with tls_key_file to make every listener TLS. "
	 "TLS files are read again on every reload (rotation in place); new connections use them."},
	{"tls_key_file", KM_OPT_STRING, OFF(tls_key_file), "", 0, 0, true,
	 "PEM private key for client-facing TLS."},
	{"tls_ca_file", KM_OPT_STRING, OFF(tls_ca_file), "", 0, 0, true,
	 "PEM CA bundle used to verify client certificates (with tls_client_auth)."},
	{"tls_client_auth", KM_OPT_CLIENT_AUTH, OFF(tls_client_auth), "none", 0, 0, true,
	 "Client certificates: none, requested (verified when sent) or required."},
	{"upstream_tls", KM_OPT_BOOL, OFF(upstream_tls), "false", 0, 0, true,
	 "Connect to the upstream brokers with TLS."},
	{"upstream_tls_ca_file", KM_OPT_STRING, OFF(upstream_tls_ca_file), "", 0, 0, true,
	 "PEM CA bundle for verifying the upstream brokers (empty: the system store)."},
	{"upstream_tls_cert_file", KM_OPT_STRING, OFF(upstream_tls_cert_file), "", 0, 0, true,
	 "PEM client certificate presented to the upstream brokers (mutual TLS)."},
	{"upstream_tls_key_file", KM_OPT_STRING, OFF(upstream_tls_key_file), "", 0, 0, true,
	 "PEM private key for upstream_tls_cert_file."},
	{"upstream_tls_verify_hostname", KM_OPT_BOOL, OFF(upstream_tls_verify_hostname), "true", 0, 0, true,
	 "Check that the upstream broker certificate matches the host name connected to."},
	{"upstream_sasl_mechanism", KM_OPT_STRING, OFF(upstream_sasl_mechanism), "", 0, 0, true,
	 "SASL mechanism for the proxy's own upstream connections (metadata refresh): empty (none), PLAIN, "
	 "SCRAM-SHA-256 or SCRAM-SHA-512. Client connections authenticate themselves (SASL is passed through)."},
	{"upstream_sasl_username", KM_OPT_STRING, OFF(upstream_sasl_username), "", 0, 0, true,
	 "User name for upstream_sasl_mechanism."},
	{"upstream_sasl_password", KM_OPT_STRING, OFF(upstream_sasl_password), "", 0, 0, true,
	 "Password for upstream_sasl_mechanism.", true},
};

#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

const km_config_option *km_config_options(size_t *count)
{
	*count = N_OPTIONS;
	return options;
}

const km_config_option *km_config_option_find(const char *name)
{
	for (size_t i = 0; i < N_OPTIONS; i++)
		if (strcmp(options[i].name, name) == 0)
			return &options[i];
	return NULL;
}

const char *km_config_type_name(km_opt_type type)
{
	switch (type) {
	case KM_OPT_STRING: return "string";
	case KM_OPT_INT: return "integer";
	case KM_OPT_BOOL: return "boolean";
	case KM_OPT_HOSTPORT: return "host:port";
	case KM_OPT_HOSTPORT_LIST: return "host:port list";
	case KM_OPT_LOG_LEVEL: return "log level";
	case KM_OPT_CLIENT_AUTH: return "enum";
	}
	return "?";
}

static void errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void errf(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

#define FIELD(cfg, o, T) ((T *)((char *)(cfg) + (o)->offset))
#define CFIELD(cfg, o, T) ((const T *)((const char *)(cfg) + (o)->offset))

bool km_hostport_parse(const char *s, km_hostport *hp)
{
	const char *colon, *host = s;
	size_t hlen;
	char *end;
	long port;

	if (!s || !*s)
		return false;
	if (*s == '[') {
		const char *rb = strchr(s, ']');
		if (!rb || rb[1] != ':')
			return false;
		host = s + 1;
		hlen = (size_t)(rb - host);
		colon = rb + 1;
	} else {
		colon = strrchr(s, ':');
		if (!colon)
			return false;
		hlen = (size_t)(colon - s);
	}
	if (hlen == 0 || hlen >= sizeof(hp->host))
		return false;
	errno = 0;
	port = strtol(colon + 1, &end, 10);
	if (errno || *end || end == colon + 1 || port < 0 || port > 65535)
		return false;
	memcpy(hp->host, host, hlen);
	hp->host[hlen] = '\0';
	hp->port = (uint16_t)port;
	return true;
}

static const char *const client_auth_names[] = {"none", "requested", "required"};

static km_err set_value(km_config *cfg, const km_config_option *o, const char *value, char *err, size_t errlen)
{
	switch (o->type) {
	case KM_OPT_STRING: {
		char **p = FIELD(cfg, o, char *);
		char *dup = NULL;
		if (*value && !(dup = strdup(value)))
			return KM_ERR_NOMEM;
		free(*p);
		*p = dup;
		return KM_OK;
	}
	case KM_OPT_INT: {
		char *end;
		long long v;
		errno = 0;
		v = strtoll(value, &end, 10);
		if (errno || end == value || *end) {
			errf(err, errlen, "%s: '%s' is not an integer", o->name, value);
			return KM_ERR_CONFIG;
		}
		if (v < o->min || v > o->max) {
			errf(err, errlen, "%s: %lld is out of range [%" PRId64 ", %" PRId64 "]", o->name, v, o->min,
			     o->max);
			return KM_ERR_CONFIG;
		}
		*FIELD(cfg, o, int64_t) = v;
		return KM_OK;
	}
	case KM_OPT_BOOL:
		if (!strcasecmp(value, "true") || !strcasecmp(value, "yes") || !strcmp(value, "1") ||
		    !strcasecmp(value, "on"))
			*FIELD(cfg, o, bool) = true;
		else if (!strcasecmp(value, "false") || !strcasecmp(value, "no") || !strcmp(value, "0") ||
			 !strcasecmp(value, "off"))
			*FIELD(cfg, o, bool) = false;
		else {
			errf(err, errlen, "%s: '%s' is not a boolean (true/false)", o->name, value);
			return KM_ERR_CONFIG;
		}
		return KM_OK;
	case KM_OPT_HOSTPORT: {
		km_hostport hp;
		if (!*value) {
			memset(FIELD(cfg, o, km_hostport), 0, sizeof(km_hostport));
			return KM_OK;
		}
		if (!km_hostport_parse(value, &hp)) {
			errf(err, errlen, "%s: '%s' is not host:port", o->name, value);
			return KM_ERR_CONFIG;
		}
		*FIELD(cfg, o, km_hostport) = hp;
		return KM_OK;
	}
	case KM_OPT_HOSTPORT_LIST: {
		km_hostport list[KM_CONFIG_MAX_UPSTREAMS];
		int n = 0;
		const char *p = value;
		while (*p) {
			char item[300];
			size_t len;
			while (*p == ' ' || *p == ',')
				p++;
			if (!*p)
				break;
			len = strcspn(p, ", ");
			if (len >= sizeof(item) || n == KM_CONFIG_MAX_UPSTREAMS) {
				errf(err, errlen, "%s: entry too long or more than %d entries", o->name,
				     KM_CONFIG_MAX_UPSTREAMS);
				return KM_ERR_CONFIG;
			}
			memcpy(item, p, len);
			item[len] = '\0';
			if (!km_hostport_parse(item, &list[n]) || list[n].port == 0) {
				errf(err, errlen, "%s: '%s' is not host:port", o->name, item);
				return KM_ERR_CONFIG;
			}
			n++;
			p += len;
		}
		memcpy(cfg->upstream, list, sizeof(list[0]) * (size_t)n);
		cfg->upstream_count = n;
		return KM_OK;
	}
	case KM_OPT_LOG_LEVEL: {
		km_log_level lvl;
		if (!km_log_level_parse(value, &lvl)) {
			errf(err, errlen, "%s: '%s' is not one of error, warn, info, debug, trace", o->name, value);
			return KM_ERR_CONFIG;
		}
		*FIELD(cfg, o, int64_t) = lvl;
		return KM_OK;
	}
	case KM_OPT_CLIENT_AUTH:
		for (size_t i = 0; i < 3; i++) {
			if (!strcasecmp(value, client_auth_names[i])) {
				*FIELD(cfg, o, int64_t) = (int64_t)i;
				return KM_OK;
			}
		}
		errf(err, errlen, "%s: '%s' is not one of none, requested, required", o->name, value);
		return KM_ERR_CONFIG;
	}
	return KM_ERR_CONFIG;
}

km_err km_config_set(km_config *cfg, const char *name, const char *value, char *err, size_t errlen)
{
	const km_config_option *o = km_config_option_find(name);
	if (!o) {
		errf(err, errlen, "unknown option '%s'", name);
		return KM_ERR_CONFIG;
	}
	return set_value(cfg, o, value, err, errlen);
}

void km_config_init(km_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	for (size_t i = 0; i < N_OPTIONS; i++) {
		/* Defaults are checked by the unit tests; a failure here is a bug in the table. */
		if (set_value(cfg, &options[i], options[i].def, NULL, 0) != KM_OK)
			KM_ERROR("config", 0, "bad default for %s", options[i].name);
	}
}

void km_config_free(km_config *cfg)
{
	for (size_t i = 0; i < N_OPTIONS; i++) {
		if (options[i].type == KM_OPT_STRING) {
			char **p = FIELD(cfg, &options[i], char *);
			free(*p);
			*p = NULL;
		}
	}
}

km_err km_config_copy(km_config *dst, const km_config *src)
{
	*dst = *src;
	for (size_t i = 0; i < N_OPTIONS; i++) {
		if (options[i].type == KM_OPT_STRING) {
			char **p = FIELD(dst, &options[i], char *);
			if (*p && !(*p = strdup(*p))) {
				for (size_t j = 0; j < i; j++)
					if (options[j].type == KM_OPT_STRING)
						free(*FIELD(dst, &options[j], char *));
				return KM_ERR_NOMEM;
			}
		}
	}
	return KM_OK;
}

static char *trim(char *s)
{
	char *e;
	while (isspace((unsigned char)*s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = '\0';
	return s;
}

km_err km_config_load_file(km_config *cfg, const char *path, char *err, size_t errlen)
{
	FILE *f = fopen(path, "r");
	char line[4096];
	int lineno = 0;
	km_err rc = KM_OK;

	if (!f) {
		errf(err, errlen, "%s: %s", path, strerror(errno));
		return KM_ERR_CONFIG;
	}
	while (fgets(line, sizeof(line), f)) {
		char *s, *eq, *key, *val, sub[512];
		lineno++;
		if (!strchr(line, '\n') && !feof(f)) {
			errf(err, errlen, "%s:%d: line too long", path, lineno);
			rc = KM_ERR_CONFIG;
			break;
		}
		s = trim(line);
		if (!*s || *s == '#')
			continue;
		eq = strchr(s, '=');
		if (!eq) {
			errf(err, errlen, "%s:%d: expected 'key = value'", path, lineno);
			rc = KM_ERR_CONFIG;
			break;
		}
		*eq = '\0';
		key = trim(s);
		val = trim(eq + 1);
		/* Allow "quoted values" so an empty string can be written explicitly. */
		if (strlen(val) >= 2 && val[0] == '"' && val[strlen(val) - 1] == '"') {
			val[strlen(val) - 1] = '\0';
			val++;
		}
		rc = km_config_set(cfg, key, val, sub, sizeof(sub));
		if (rc != KM_OK) {
			errf(err, errlen, "%s:%d: %s", path, lineno, sub);
			break;
		}
	}
	fclose(f);
	return rc;
}

static bool both_or_neither(const char *a, const char *b)
{
	return (a == NULL) == (b == NULL);
}

km_err km_config_validate(const km_config *cfg, char *err, size_t errlen)
{
	if (cfg->upstream_count == 0) {
		errf(err, errlen, "upstream: at least one upstream broker address is required");
		return KM_ERR_CONFIG;
	}
	if (!cfg->advertised_host || !*cfg->advertised_host) {
		errf(err, errlen, "advertised_host: must not be empty");
		return KM_ERR_CONFIG;
	}
	if (cfg->listen.port == 0) {
		errf(err, errlen, "listen: a port is required");
		return KM_ERR_CONFIG;
	}
	if (cfg->broker_port_base + cfg->broker_port_count - 1 > 65535) {
		errf(err, errlen, "broker_port_base + broker_port_count - 1 = %" PRId64 " is above 65535",
		     cfg->broker_port_base + cfg->broker_port_count - 1);
		return KM_ERR_CONFIG;
	}
	if (cfg->listen.port >= cfg->broker_port_base &&
	    cfg->listen.port < cfg->broker_port_base + cfg->broker_port_count) {
		errf(err, errlen, "listen port %u falls inside the broker port range %" PRId64 "-%" PRId64,
		     cfg->listen.port, cfg->broker_port_base, cfg->broker_port_base + cfg->broker_port_count - 1);
		return KM_ERR_CONFIG;
	}
	if (cfg->http_listen.port && cfg->http_listen.port == cfg->listen.port &&
	    strcmp(cfg->http_listen.host, cfg->listen.host) == 0) {
		errf(err, errlen, "http_listen: same address as listen");
		return KM_ERR_CONFIG;
	}
	if (!both_or_neither(cfg->tls_cert_file, cfg->tls_key_file)) {
		errf(err, errlen, "tls_cert_file and tls_key_file must be set together");
		return KM_ERR_CONFIG;
	}
	if (cfg->tls_client_auth != KM_TLS_CLIENT_AUTH_NONE && (!cfg->tls_cert_file || !cfg->tls_ca_file)) {
		errf(err, errlen, "tls_client_auth needs tls_cert_file, tls_key_file and tls_ca_file");
		return KM_ERR_CONFIG;
	}
	if (!both_or_neither(cfg->upstream_tls_cert_file, cfg->upstream_tls_key_file)) {
		errf(err, errlen, "upstream_tls_cert_file and upstream_tls_key_file must be set together");
		return KM_ERR_CONFIG;
	}
	if (cfg->upstream_sasl_mechanism && !km_sasl_mechanism_supported(cfg->upstream_sasl_mechanism)) {
		errf(err, errlen, "upstream_sasl_mechanism: '%s' is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512",
		     cfg->upstream_sasl_mechanism);
		return KM_ERR_CONFIG;
	}
	if (cfg->upstream_sasl_mechanism && !cfg->upstream_sasl_username) {
		errf(err, errlen, "upstream_sasl_mechanism needs upstream_sasl_username");
		return KM_ERR_CONFIG;
	}
	if (!cfg->upstream_tls && (cfg->upstream_tls_ca_file || cfg->upstream_tls_cert_file)) {
		errf(err, errlen, "upstream_tls_* files are set but upstream_tls is false");
		return KM_ERR_CONFIG;
	}
	return KM_OK;
}

static bool str_eq(const char *a, const char *b)
{
	if (!a || !b)
		return a == b;
	return strcmp(a, b) == 0;
}

bool km_config_option_equal(const km_config_option *o, const km_config *a, const km_config *b)
{
	switch (o->type) {
	case KM_OPT_STRING:
		return str_eq(*CFIELD(a, o, char *), *CFIELD(b, o, char *));
	case KM_OPT_INT:
	case KM_OPT_LOG_LEVEL:
	case KM_OPT_CLIENT_AUTH:
		return *CFIELD(a, o, int64_t) == *CFIELD(b, o, int64_t);
	case KM_OPT_BOOL:
		return *CFIELD(a, o, bool) == *CFIELD(b, o, bool);
	case KM_OPT_HOSTPORT: {
		const km_hostport *x = CFIELD(a, o, km_hostport), *y = CFIELD(b, o, km_hostport);
		return x->port == y->port && strcmp(x->host, y->host) == 0;
	}
	case KM_OPT_HOSTPORT_LIST:
		if (a->upstream_count != b->upstream_count)
			return false;
		for (int i = 0; i < a->upstream_count; i++)
			if (a->upstream[i].port != b->upstream[i].port ||
			    strcmp(a->upstream[i].host, b->upstream[i].host) != 0)
				return false;
		return true;
	}
	return false;
}

km_err km_config_check_reload(const km_config *cur, const km_config *next, char *err, size_t errlen)
{
	km_err rc = km_config_validate(next, err, errlen);
	if (rc != KM_OK)
		return rc;
	for (size_t i = 0; i < N_OPTIONS; i++) {
		if (!options[i].reloadable && !km_config_option_equal(&options[i], cur, next)) {
			errf(err, errlen, "%s cannot change on reload (restart needed)", options[i].name);
			return KM_ERR_CONFIG;
		}
	}
	return KM_OK;
}

static void format_hostport(const km_hostport *hp, char *buf, size_t len)
{
	if (!hp->port && !hp->host[0])
		snprintf(buf, len, "%s", "");
	else if (strchr(hp->host, ':'))
		snprintf(buf, len, "[%s]:%u", hp->host, hp->port);
	else
		snprintf(buf, len, "%s:%u", hp->host, hp->port);
}

void km_config_format(const km_config_option *o, const km_config *cfg, char *buf, size_t len)
{
	buf[0] = '\0';
	switch (o->type) {
	case KM_OPT_STRING: {
		const char *s = *CFIELD(cfg, o, char *);
		snprintf(buf, len, "%s", s ? (o->secret ? "********" : s) : "");
		break;
	}
	case KM_OPT_INT:
		snprintf(buf, len, "%" PRId64, *CFIELD(cfg, o, int64_t));
		break;
	case KM_OPT_BOOL:
		snprintf(buf, len, "%s", *CFIELD(cfg, o, bool) ? "true" : "false");
		break;
	case KM_OPT_HOSTPORT:
		format_hostport(CFIELD(cfg, o, km_hostport), buf, len);
		break;
	case KM_OPT_HOSTPORT_LIST: {
		size_t n = 0;
		for (int i = 0; i < cfg->upstream_count && n < len; i++) {
			char one[300];
			format_hostport(&cfg->upstream[i], one, sizeof(one));
			n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? "," : "", one);
		}
		break;
	}
	case KM_OPT_LOG_LEVEL:
		snprintf(buf, len, "%s", km_log_level_name((km_log_level)*CFIELD(cfg, o, int64_t)));
		break;
	case KM_OPT_CLIENT_AUTH: {
		int64_t v = *CFIELD(cfg, o, int64_t);
		snprintf(buf, len, "%s", v >= 0 && v < 3 ? client_auth_names[v] : "?");
		break;
	}
	}
}

void km_config_write_doc(FILE *out)
{
	fprintf(out, "| option | type | default | reloadable | description |\n");
	fprintf(out, "| --- | --- | --- | --- | --- |\n");
	for (size_t i = 0; i < N_OPTIONS; i++) {
		const km_config_option *o = &options[i];
		fprintf(out, "| `%s` | %s | %s%s%s | %s | %s |\n", o->name, km_config_type_name(o->type),
			*o->def ? "`" : "", *o->def ? o->def : "(empty)", *o->def ? "`" : "",
			o->reloadable ? "yes" : "no", o->doc);
	}
}
