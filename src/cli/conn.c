/* kmirror CLI connection: one km_net_client to kmirrord, driven synchronously (the CLI does one thing at a time). */
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "cli/cli.h"
#include "kmirror/api.h"
#include "kmirror/msg/api_keys.h"
#include "kmirror/net.h"

struct km_cli_conn {
	struct event_base *base;
	SSL_CTX *tls;
	km_net_client *client;
	bool state_seen;
	km_err state_err;
	char state_why[320]; /* the client's reason for the first failure */
	char addr[300];
};

typedef struct call_result {
	bool done;
	km_err err;
	uint8_t *body;
	size_t len;
} call_result;

static void on_state(km_net_client *c, km_err err, void *arg)
{
	km_cli_conn *cc = arg;
	/* Only the first report matters: ready or why not; a later close shows up in the calls. */
	if (!cc->state_seen) {
		cc->state_seen = true;
		cc->state_err = err;
		snprintf(cc->state_why, sizeof(cc->state_why), "%s", err != KM_OK ? km_net_client_reason(c) : "");
	}
}

bool km_cli_split_hostport(const char *s, char *host, size_t hostlen, uint16_t *port)
{
	const char *colon, *h = s;
	size_t hl;
	char *end;
	long p;

	if (*s == '[') {
		const char *rb = strchr(s, ']');
		if (!rb || rb[1] != ':')
			return false;
		h = s + 1;
		hl = (size_t)(rb - h);
		colon = rb + 1;
	} else {
		colon = strrchr(s, ':');
		if (!colon || memchr(s, ':', (size_t)(colon - s)))
			return false; /* an IPv6 address needs brackets */
		hl = (size_t)(colon - s);
	}
	if (hl == 0 || hl >= hostlen)
		return false;
	p = strtol(colon + 1, &end, 10);
	if (end == colon + 1 || *end || p <= 0 || p > 65535)
		return false;
	memcpy(host, h, hl);
	host[hl] = 0;
	*port = (uint16_t)p;
	return true;
}

static const char *conn_error(km_err err)
{
	switch (err) {
	case KM_ERR_TIMEOUT: return "timed out";
	case KM_ERR_SASL: return "SASL authentication failed";
	case KM_ERR_TLS: return "TLS handshake failed";
	case KM_ERR_UNSUPPORTED: return "ApiVersions failed (not a Kafka protocol listener?)";
	case KM_ERR_CLOSED: return "connection closed by the peer";
	case KM_ERR_IO: return "connection failed";
	default: return km_err_message(err);
	}
}

/*
 * One line on why a connection attempt failed: the client's own reason when it has one, and a hint
 * where the usual mistake is a protocol that does not match the listener's.
 */
static void describe_failure(km_err err, const char *reason, const km_cli_client *cl, char *buf, size_t len)
{
	const char *hint = "";

	if (!reason[0]) {
		snprintf(buf, len, "%s", conn_error(err));
		return;
	}
	/* kmirrord's TLS listener closes (or resets) a plaintext hello; a plaintext one does not answer a TLS one. */
	if (!cl->tls && strstr(reason, "during ApiVersions"))
		hint = " (a TLS listener? set security.protocol=SSL or SASL_SSL in --command-config)";
	else if (cl->tls && !strstr(reason, "certificate verify failed") && strstr(reason, "TLS handshake"))
		hint = " (not a TLS listener? security.protocol is SSL or SASL_SSL in --command-config)";
	snprintf(buf, len, "%s%s", reason, hint);
}

/* Try one address; KM_OK when ready, else the reason in why. */
static km_err try_connect(km_cli_conn *cc, const char *host, uint16_t port, const km_cli_client *cl, int64_t tmo,
			  char *why, size_t whylen)
{
	km_net_client_opts o = {
		.client_id = cl->client_id ? cl->client_id : "kmirror-cli",
		.tls = cc->tls,
		.tls_verify_host = cl->verify_host,
		.sasl_mechanism = cl->sasl ? cl->sasl_mechanism : NULL,
		.sasl_username = cl->username,
		.sasl_password = cl->password,
		.sasl_kerberos_service_name = cl->krb5_service,
		.sasl_kerberos_keytab = cl->krb5_keytab,
		.sasl_kerberos_principal = cl->krb5_principal,
		.sasl_kerberos_setting = "--command-config",
		.sasl_oauthbearer_token_endpoint_url = cl->oauth_url,
		.sasl_oauthbearer_client_id = cl->oauth_client_id,
		.sasl_oauthbearer_client_secret = cl->oauth_client_secret,
		.sasl_oauthbearer_scope = cl->oauth_scope,
		.sasl_oauthbearer_setting = "--command-config's sasl.oauthbearer.token.endpoint.url",
		.connect_timeout_ms = tmo,
		.request_timeout_ms = tmo,
		.max_frame_bytes = 256 * 1024 * 1024,
		.on_state = on_state,
		.arg = cc,
	};

	cc->state_seen = false;
	cc->state_err = KM_OK;
	cc->state_why[0] = 0;
	why[0] = 0;
	cc->client = km_net_client_new(cc->base, &o);
	if (!cc->client) {
		snprintf(why, whylen, "out of memory");
		return KM_ERR_NOMEM;
	}
	if (km_net_client_connect(cc->client, host, port) != KM_OK) {
		describe_failure(KM_ERR_IO, cc->state_why, cl, why, whylen);
		km_net_client_free(cc->client);
		cc->client = NULL;
		return KM_ERR_IO;
	}
	while (!cc->state_seen)
		if (event_base_loop(cc->base, EVLOOP_ONCE) != 0)
			break;
	if (!cc->state_seen || cc->state_err != KM_OK) {
		km_err e = cc->state_seen ? cc->state_err : KM_ERR_IO;
		describe_failure(e, cc->state_why, cl, why, whylen);
		km_net_client_free(cc->client);
		cc->client = NULL;
		/* Let the loop run the frees the client left for the end of the iteration. */
		event_base_loop(cc->base, EVLOOP_NONBLOCK);
		return e;
	}
	return KM_OK;
}

/* A Kafka client's store as the net layer reads it. */
static km_net_tls_store net_store(const km_cli_store *s)
{
	return (km_net_tls_store){s->location, s->type, s->password, s->certificates, s->key, s->key_password};
}

km_cli_conn *km_cli_connect(const char *bootstrap, const km_cli_client *cl, int64_t timeout_ms, bool kmirrord,
			    char *err, size_t errlen)
{
	km_cli_conn *cc = calloc(1, sizeof(*cc));
	const char *p = bootstrap;
	char why[512] = "";

	if (!cc || !(cc->base = event_base_new())) {
		snprintf(err, errlen, "out of memory");
		km_cli_conn_free(cc);
		return NULL;
	}
	if (cl->tls) {
		km_net_tls_files f = {cl->ca_file, cl->cert_file, cl->key_file, net_store(&cl->truststore),
				      net_store(&cl->keystore)};
		cc->tls = km_net_tls_client_ctx(&f, true, why, sizeof(why));
		if (!cc->tls) {
			snprintf(err, errlen, "TLS setup: %s", why);
			km_cli_conn_free(cc);
			return NULL;
		}
	}
	/* Each address of the list in turn, the first that answers wins. */
	while (*p) {
		const char *comma = strchr(p, ',');
		size_t n = comma ? (size_t)(comma - p) : strlen(p);
		char one[300], host[256];
		uint16_t port;
		km_err rc;

		snprintf(one, sizeof(one), "%.*s", (int)(n < sizeof(one) - 1 ? n : sizeof(one) - 1), p);
		p = comma ? comma + 1 : p + n;
		if (!km_cli_split_hostport(one, host, sizeof(host), &port)) {
			snprintf(err, errlen, "--bootstrap-server '%s': expected HOST:PORT", one);
			km_cli_conn_free(cc);
			return NULL;
		}
		char one_why[400];
		rc = try_connect(cc, host, port, cl, timeout_ms, one_why, sizeof(one_why));
		if (rc == KM_OK) {
			snprintf(cc->addr, sizeof(cc->addr), "%s", one);
			break;
		}
		snprintf(why, sizeof(why), "%s: %s", one, one_why);
	}
	if (!cc->client) {
		snprintf(err, errlen, "cannot connect to %s", why[0] ? why : bootstrap);
		km_cli_conn_free(cc);
		return NULL;
	}
	/* A broker answers ApiVersions too, but without kmirror's keys. */
	if (kmirrord && (km_net_client_version(cc->client, KM_API_LIST_MIRRORS) < 0 ||
			 km_net_client_version(cc->client, KM_API_DESCRIBE_MIRRORS) < 0)) {
		snprintf(err, errlen,
			 "%s does not answer mirror RPCs: point --bootstrap-server at kmirrord, not at a Kafka broker",
			 cc->addr);
		km_cli_conn_free(cc);
		return NULL;
	}
	return cc;
}

int16_t km_cli_conn_version(const km_cli_conn *cc, int16_t api_key)
{
	return km_net_client_version(cc->client, api_key);
}

static void on_flat(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg)
{
	call_result *r = arg;
	(void)c;
	r->err = err;
	if (err == KM_OK && body) {
		r->body = malloc(len ? len : 1);
		if (!r->body)
			r->err = KM_ERR_NOMEM;
		else {
			memcpy(r->body, body, len);
			r->len = len;
		}
	}
	r->done = true;
}

km_err km_cli_call(km_cli_conn *cc, int16_t api_key, int16_t version, const uint8_t *body, size_t len,
		   uint8_t **resp, size_t *resp_len, char *err, size_t errlen)
{
	call_result r = {0};
	km_net_request rq;
	km_net_piece pc = {.p = body, .len = len};
	const km_api_info *api = km_api_lookup(api_key);
	km_err rc;

	*resp = NULL;
	*resp_len = 0;
	km_net_request_init(&rq, api_key, version);
	rq.pieces = &pc;
	rq.npieces = 1;
	rq.delivery = KM_NET_FLAT;
	rq.on_flat = on_flat;
	rq.arg = &r;
	rc = km_net_client_request(cc->client, &rq);
	if (rc != KM_OK) {
		snprintf(err, errlen, "%s: cannot send %s: %s", cc->addr, api ? api->name : "request", conn_error(rc));
		return rc;
	}
	/* The client's own request timer ends the wait: every request gets exactly one callback. */
	while (!r.done)
		if (event_base_loop(cc->base, EVLOOP_ONCE) != 0)
			break;
	if (!r.done) {
		snprintf(err, errlen, "%s: event loop failed", cc->addr);
		return KM_ERR_IO;
	}
	if (r.err != KM_OK) {
		snprintf(err, errlen, "%s: %s %s", cc->addr, api ? api->name : "request", conn_error(r.err));
		free(r.body);
		return r.err;
	}
	*resp = r.body;
	*resp_len = r.len;
	return KM_OK;
}

void km_cli_conn_free(km_cli_conn *cc)
{
	if (!cc)
		return;
	if (cc->client)
		km_net_client_free(cc->client);
	if (cc->base) {
		event_base_loop(cc->base, EVLOOP_NONBLOCK);
		event_base_free(cc->base);
	}
	if (cc->tls)
		SSL_CTX_free(cc->tls);
	free(cc);
}
