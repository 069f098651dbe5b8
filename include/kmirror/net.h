/* kmirror connection layer: framing, request headers, TLS contexts, and an async Kafka request/response client. */
#ifndef KMIRROR_NET_H
#define KMIRROR_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/dns.h>
#include <openssl/ssl.h>

#include "kmirror/error.h"
#include "kmirror/wire.h"

/* ---- framing: every Kafka frame is an int32 size followed by that many bytes ---- */

typedef enum {
	KM_FRAME_NEED_MORE = 0, /* fewer than 4 bytes, or the frame is not complete yet */
	KM_FRAME_READY,         /* a whole frame is buffered */
	KM_FRAME_TOO_LARGE,     /* size above the cap */
	KM_FRAME_BAD_SIZE,      /* negative or too small to hold a header */
	KM_FRAME_TLS_HELLO,     /* the first bytes of a TLS handshake record on a plaintext port */
	KM_FRAME_HTTP,          /* "GET " / "POST" / ... : an HTTP client on a Kafka port */
} km_frame_status;

#define KM_FRAME_MIN_REQUEST 8   /* api key, version, correlation id */
#define KM_FRAME_MIN_RESPONSE 4  /* correlation id */

/*
 * Classify the start of a frame. p holds avail bytes (the first bytes of the frame, size prefix
 * included). first: this is the first frame of the connection (enables TLS/HTTP detection).
 * On KM_FRAME_READY and KM_FRAME_NEED_MORE with avail >= 4, *size is the frame size without prefix.
 */
km_frame_status km_net_frame_check(const uint8_t *p, size_t avail, int64_t max_frame, size_t min_frame,
				   bool first, int32_t *size);
/* The same on an evbuffer (copies out 4 bytes only). */
km_frame_status km_net_frame_peek(struct evbuffer *in, int64_t max_frame, size_t min_frame, bool first,
				  int32_t *size);
const char *km_frame_status_name(km_frame_status st);

/* ---- request and response headers ---- */

typedef struct km_req_header {
	int16_t api_key;
	int16_t api_version;
	int32_t correlation_id;
	km_str client_id;   /* borrowed; null for header v0 */
	size_t body_offset; /* where the request body starts, from the start of the frame body */
} km_req_header;

/*
 * Parse a request header (p: the frame without its size prefix). header_version: 1 (client id) or
 * 2 (client id + tagged fields); 0 is accepted for the controlled-shutdown v0 relic.
 */
km_err km_net_parse_request_header(const uint8_t *p, size_t len, int header_version, km_req_header *h)
	__attribute__((warn_unused_result));

/* Request header version Kafka uses for a Produce request of this version. */
static inline int km_net_produce_header_version(int16_t version) { return version >= 9 ? 2 : 1; }

/*
 * The response header of the frame at the start of in (size: its size without the prefix):
 * correlation id, and (header v1) tagged fields. *hlen: the header's length after the size prefix.
 * Returns 1 when parsed, 0 when not all of it has arrived, -1 when malformed.
 */
int km_net_response_header(struct evbuffer *in, int32_t size, int hdr_version, int32_t *corr, size_t *hlen);

/* ---- a cursor over an evbuffer: reads small fields in place of a pullup, for walking big frames ---- */

typedef struct km_evrd {
	struct evbuffer *buf;
	struct evbuffer_ptr ptr; /* at seg_pos */
	size_t pos, end;         /* offsets from the start of buf */
	/* The bytes [seg_pos, seg_end) are contiguous at seg (the rest of ptr's chain): read in place. */
	const uint8_t *seg;
	size_t seg_pos, seg_end;
	km_err err;
} km_evrd;

void km_evrd_init(km_evrd *r, struct evbuffer *buf, size_t start, size_t end);
/*
 * The same, from a pointer known to be at offset at of buf (buf unchanged since): moves to start
 * (>= at) from there, walking only the chains in between.
 */
void km_evrd_init_at(km_evrd *r, struct evbuffer *buf, const struct evbuffer_ptr *ptr, size_t at, size_t start,
		     size_t end);
bool km_evrd_raw(km_evrd *r, void *out, size_t n);
bool km_evrd_skip(km_evrd *r, size_t n);
bool km_evrd_i8(km_evrd *r, int8_t *v);
bool km_evrd_i16(km_evrd *r, int16_t *v);
bool km_evrd_i32(km_evrd *r, int32_t *v);
bool km_evrd_uvarint(km_evrd *r, uint32_t *v);
/* Skip a compact (uvarint length + 1) string/bytes, or a classic int16/int32 length one. */
bool km_evrd_skip_compact(km_evrd *r);
bool km_evrd_skip_tags(km_evrd *r);

/* ---- TLS ---- */

/* A Java client's trust or key store (Kafka's ssl.truststore.* and ssl.keystore.*): a file, or inline PEM. */
typedef struct km_net_tls_store {
	const char *location;     /* the store's file; NULL: the inline PEM below */
	const char *type;         /* PKCS12 (also JKS: Java 9+ reads PKCS12 files of that type) or PEM; NULL: PKCS12 */
	const char *password;     /* NULL: none (a truststore then reads only its unencrypted certificates) */
	const char *certificates; /* inline PEM: the trusted certificates, or the keystore's certificate chain */
	const char *key;          /* inline PEM: the keystore's private key */
	const char *key_password; /* the private key's; a PKCS12 store has one password, so it must match password */
} km_net_tls_store;

/* Whether s names a store at all (a file or inline PEM). */
bool km_net_tls_store_given(const km_net_tls_store *s);

/*
 * Where a TLS context's trust and identity come from: PEM files, or Java stores in their place (a
 * store given is used instead of ca_file, or of cert_file and key_file; callers refuse both at once).
 */
typedef struct km_net_tls_files {
	const char *ca_file;              /* PEM CA bundle; NULL (and no truststore): the system store */
	const char *cert_file, *key_file; /* PEM certificate (chain) and its key; NULL: none */
	km_net_tls_store truststore;      /* the CAs, from a store */
	km_net_tls_store keystore;        /* the key and certificate chain, from a store */
} km_net_tls_files;

/*
 * Server context for client-facing listeners (f must give a certificate and key, as files or a
 * keystore). client_auth: 0 none, 1 requested, 2 required (verified against f's CAs).
 */
SSL_CTX *km_net_tls_server_ctx(const km_net_tls_files *f, int client_auth, char *err, size_t errlen);
/* Client context for upstream connections: f's CAs (none given: the system store), its identity when given. */
SSL_CTX *km_net_tls_client_ctx(const km_net_tls_files *f, bool verify, char *err, size_t errlen);

/*
 * Why a bufferevent failed, as one line for logs (its OpenSSL errors, or the socket error), and the
 * kind: KM_ERR_CLOSED (the peer closed, also a TLS peer without close_notify), KM_ERR_TLS, KM_ERR_IO.
 */
km_err km_net_bev_error(struct bufferevent *bev, char *buf, size_t len);
/* The OpenSSL error queue as one line (and cleared), for logs. */
const char *km_net_tls_error(char *buf, size_t len);

/*
 * A bufferevent on fd (or -1 to connect later): plain when ctx is NULL, TLS otherwise. server
 * selects accept vs connect state; sni (client side) sets the SNI name and the host to verify.
 */
struct bufferevent *km_net_bev_new(struct event_base *base, int fd, SSL_CTX *ctx, bool server, const char *sni,
				   bool verify_host);
/*
 * What to call instead of bufferevent_setcb, _enable, _disable and _free on a bufferevent of
 * km_net_bev_new: a plain one does its own socket reads and writes (src/net/bev.c) behind the
 * bufferevent's buffers, so its callbacks and read interest live there. A TLS one is passed through.
 */
void km_net_bev_setcb(struct bufferevent *bev, bufferevent_data_cb readcb, bufferevent_data_cb writecb,
		      bufferevent_event_cb eventcb, void *arg);
void km_net_bev_enable(struct bufferevent *bev, short what);
void km_net_bev_disable(struct bufferevent *bev, short what);
void km_net_bev_free(struct bufferevent *bev);
/*
 * For a read callback: read what the socket already holds into the bufferevent's input, until the
 * input has upto bytes (libevent 2.1 reads at most 4 KiB per readiness event, about one record on
 * TLS). A TLS bufferevent is read through its own SSL object, to the end of the last record begun
 * (so it may pass upto by less than one record). Never blocks; EOF and errors are left for the
 * bufferevent's own next read to report. Returns the bytes added. A plain bufferevent of
 * km_net_bev_new has read what the socket held before its callback: this only sets how much its
 * next reads take (upto), and returns 0.
 */
size_t km_net_bev_fill(struct bufferevent *bev, size_t upto);

/*
 * Spliced ranges (docs/net.md): the next n bytes of src's input stream go to dst's socket without
 * passing through user space. Bytes of the range src's input already holds are moved to dst's
 * output (chains, not copies); the rest go by splice(2) from src's socket through a pipe of src's
 * to dst's socket, after everything dst's output held when the range began; bytes added to dst's
 * output later wait until the range is done. During the range src reads nothing into its input
 * and its read callback is not called; enabling or disabling its reading takes effect after it.
 * Both must be plain bufferevents of km_net_bev_new, connected, and in no other range.
 * Returns 1 when src's input held the whole range (moved now, no callback), 0 when the range has
 * begun (from the loop, never inside this call): done(src, arg) runs once its last byte was
 * written to dst's socket; or a negative km_err with nothing moved: KM_ERR_INVAL (TLS, not
 * connected, a range already running), KM_ERR_IO (no pipe), KM_ERR_NOMEM. An end of stream or
 * error on src's socket inside the range goes to src's event callback (BEV_EVENT_READING |
 * BEV_EVENT_EOF or BEV_EVENT_ERROR), a write error on dst's to dst's (BEV_EVENT_WRITING |
 * BEV_EVENT_ERROR); the range ends there and done is not called. Freeing either ends it too.
 */
int km_net_bev_splice(struct bufferevent *src, struct bufferevent *dst, size_t n, bufferevent_data_cb done, void *arg)
	__attribute__((warn_unused_result));
/* Whether bev could be either side of a range now (plain, of km_net_bev_new, connected, in none). */
bool km_net_bev_can_splice(struct bufferevent *bev);

/*
 * The next n bytes of src appended to dst, as evbuffer_remove_buffer does, but without copying the
 * part of a chain that src keeps the rest of: that part is referenced (the chain's memory stays
 * until dst has released it; src's chains then take no more bytes). Small parts are copied.
 */
void km_net_move(struct evbuffer *src, struct evbuffer *dst, size_t n);

/* ---- SASL client mechanisms (providers): PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, GSSAPI, OAUTHBEARER ---- */

typedef struct km_sasl km_sasl;

bool km_sasl_mechanism_supported(const char *mechanism);
/*
 * NULL when the mechanism is not supported (or no memory); GSSAPI is made by km_sasl_new_gssapi.
 * OAUTHBEARER (RFC 7628): password is the bearer token (km_sasl_oauth_get), user unused.
 */
km_sasl *km_sasl_new(const char *mechanism, const char *user, const char *password);

/*
 * Where OAUTHBEARER tokens come from (docs/security.md, "OAUTHBEARER"), Kafka's KIP-768 names:
 * token_endpoint_url file:///path/to/token, a file holding a JWT that something else keeps fresh;
 * or an http:// or https:// token endpoint asked for tokens with the client-credentials grant
 * (client_id and client_secret as HTTP Basic authentication, scope when given). https verifies the
 * endpoint's certificate and host name against the system's CAs.
 */
typedef struct km_sasl_oauth {
	const char *token_endpoint_url; /* sasl.oauthbearer.token.endpoint.url */
	const char *client_id, *client_secret, *scope; /* the endpoint's; NULL for a file */
	const char *setting;            /* where it was set, for the errors ("sasl.oauthbearer.token.endpoint.url") */
	/*
	 * A command that prints a token (kmirrord's upstream_sasl_oauthbearer_token_command, run with
	 * /bin/sh -c, at most 10 s, again at 80% of the token's life): used instead of the URL when set.
	 */
	const char *command;
} km_sasl_oauth;

/*
 * A connection waiting for a token endpoint's answer (embedded in its owner; zeroed when idle).
 * cb runs once, from the event loop: KM_OK (ask km_sasl_oauth_get again: the token is there) or
 * an error with a one-line why.
 */
typedef struct km_sasl_oauth_wait {
	struct km_sasl_oauth_wait *next, **pprev;
	void (*cb)(void *arg, km_err rc, const char *why);
	void *arg;
} km_sasl_oauth_wait;

/*
 * A live token for o (owned: wipe and free). Tokens are kept in this process per file or per
 * endpoint, client and scope. A file is read again when it changed (stat) or once 80% of the
 * token's life (from its iat, else from the read) has passed, so every new connection gets the
 * file's current token. An endpoint is asked again once 80% of the token's life (its expires_in,
 * else the JWT's exp) has passed; until the new token is there the old one is used while it lives.
 * KM_OK with *token NULL: none is live and a request to the endpoint is under way (on base, names
 * resolved with dns): w is armed and its callback says when to ask again. KM_ERR_CONFIG with a
 * one-line reason naming o->setting and what to do: the URL is not file:///... or http(s)://...,
 * the file cannot be read, holds no JWT with an exp claim, or its token has expired; an endpoint
 * without a client id and secret. A file's token never waits (base, dns and w may be NULL).
 */
km_err km_sasl_oauth_get(const km_sasl_oauth *o, struct event_base *base, struct evdns_base *dns,
			 km_sasl_oauth_wait *w, char **token, char *err, size_t errlen) __attribute__((warn_unused_result));
/* w stops waiting (its callback will not run); nothing when it is not waiting. */
void km_sasl_oauth_cancel(km_sasl_oauth_wait *w);
/*
 * Whether o can be used, before any connection: a file's live token (km_sasl_oauth_get's checks);
 * an endpoint's URL, client id and secret (its token is asked for at the first connection).
 */
km_err km_sasl_oauth_check(const km_sasl_oauth *o, char *err, size_t errlen) __attribute__((warn_unused_result));
/*
 * A JWT's exp and iat claims (seconds since the epoch; *iat 0 when absent) from its payload, read
 * without checking the signature (the broker does). KM_ERR_INVAL with why: not three base64url
 * parts, the payload not a JSON object, no numeric exp.
 */
km_err km_sasl_oauth_jwt(const char *token, size_t len, int64_t *exp, int64_t *iat, char *why, size_t whylen)
	__attribute__((warn_unused_result));
/*
 * Kafka's JAAS line for OAUTHBEARER: org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule
 * required, with the client-credentials options clientId, clientSecret and scope (each owned, NULL
 * when absent). KM_ERR_CONFIG with a reason for another module, a missing ';', or the options of
 * Kafka's unsecured test login (unsecuredLogin*), which kmirror does not make tokens for.
 */
km_err km_sasl_oauth_jaas(const char *jaas, char **client_id, char **client_secret, char **scope, char *err,
			  size_t errlen) __attribute__((warn_unused_result));

/*
 * A Kerberos identity for SASL GSSAPI (docs/security.md, "Kerberos"). keytab NULL: the default
 * credentials (KRB5CCNAME, kinit); otherwise principal's keys in that keytab, whose tickets go to a
 * memory credentials cache of this process shared by every connection with the same keytab and
 * principal, and are got again from the keytab once half their lifetime has passed.
 */
typedef struct km_sasl_krb5 {
	const char *service_name; /* the brokers' sasl.kerberos.service.name; NULL or "": "kafka" */
	const char *keytab;
	const char *principal;
	const char *setting;      /* where keytab and principal were set, for the errors ("sasl.jaas.config") */
} km_sasl_krb5;

/*
 * A GSSAPI exchange (RFC 4752, no security layer) with the broker host (its service principal is
 * service_name/host). NULL with a one-line reason in err when the keytab cannot be read, holds no
 * key for the principal, or the credentials cannot be had.
 */
km_sasl *km_sasl_new_gssapi(const char *host, const km_sasl_krb5 *k, char *err, size_t errlen);
/*
 * km_sasl_new_gssapi and the mechanism's first token, which may wait for the KDC (a ticket-granting
 * ticket from the keytab, a service ticket), on a thread of their own, off base's event loop. done
 * runs on the loop: the mechanism (the caller's to free) and its first token, or s NULL and a
 * one-line reason. NULL when the thread could not be started (why says so). After
 * km_sasl_job_cancel, done never runs, and what the thread made is freed once it ends.
 */
typedef struct km_sasl_job km_sasl_job;
typedef void (*km_sasl_job_done)(void *arg, km_sasl *s, const uint8_t *first, size_t len, const char *why);
km_sasl_job *km_sasl_gssapi_start(struct event_base *base, const char *host, const km_sasl_krb5 *k,
				  km_sasl_job_done done, void *arg, char *why, size_t whylen);
void km_sasl_job_cancel(km_sasl_job *j);
/*
 * Whether k can be used before connecting: the keytab is readable and holds a key of principal (a
 * keytab without a principal, or a principal without a keytab, is refused). KM_ERR_CONFIG with a
 * one-line reason naming k->setting and what to do.
 */
km_err km_sasl_krb5_check(const km_sasl_krb5 *k, char *err, size_t errlen) __attribute__((warn_unused_result));
/*
 * Kafka's sasl.jaas.config line of the login module module
 * ("com.sun.security.auth.module.Krb5LoginModule"; the package may be left out) for mechanism
 * (named in the errors): the values of keys[0..n) into
 * vals (owned, NULL when absent; free with km_sasl_jaas_free), other options ignored (the Java
 * login's own). KM_ERR_CONFIG with a one-line reason, vals all NULL.
 */
km_err km_sasl_jaas_options(const char *jaas, const char *module, const char *mechanism, const char *const *keys,
			    char **vals, size_t n, char *err, size_t errlen);
/* Wipes (a value may be a secret) and frees vals[0..n), setting them NULL. */
void km_sasl_jaas_free(char **vals, size_t n);

/*
 * Kafka's JAAS line for GSSAPI: com.sun.security.auth.module.Krb5LoginModule required, with
 * useKeyTab=true keyTab="..." principal="..." (or useTicketCache=true: the default credentials),
 * and serviceName. keytab, principal and service (each NULL when not given) are owned by the
 * caller (free). Other Krb5LoginModule options (storeKey, debug, ...) are accepted and ignored.
 * KM_ERR_CONFIG with a reason for another module, a missing ';', useKeyTab=true without keyTab
 * or principal.
 */
km_err km_sasl_krb5_jaas(const char *jaas, char **keytab, char **principal, char **service, char *err,
			 size_t errlen) __attribute__((warn_unused_result));
/* The name of k's memory credentials cache in this process ("MEMORY:..."; for tests and diagnostics). */
void km_sasl_krb5_ccache(const km_sasl_krb5 *k, char *out, size_t len);
/* Why the last step failed, one line ("" when it did not, or the mechanism says nothing more). */
const char *km_sasl_reason(const km_sasl *s);
/*
 * One exchange: the first call has in NULL and yields the first client message in out; each later
 * call takes the server's message (SaslAuthenticate auth_bytes) and yields the next one, or sets
 * *done when the exchange is complete and verified (SCRAM checks the server signature).
 * KM_ERR_SASL when the server's message is malformed or fails verification.
 */
km_err km_sasl_step(km_sasl *s, const uint8_t *in, size_t inlen, km_wr *out, bool *done)
	__attribute__((warn_unused_result));
/* Tests only: a fixed client nonce instead of a random one. */
void km_sasl_set_nonce(km_sasl *s, const char *nonce);
void km_sasl_free(km_sasl *s);

/* ---- async request/response client (used by the proxy's metadata refresh, the mirror, the state store) ---- */

typedef struct km_net_client km_net_client;

/*
 * Flat delivery, called once per request: err KM_OK with the response body (after the response
 * header) made contiguous, or an error (KM_ERR_TIMEOUT, KM_ERR_CLOSED, KM_ERR_IO, KM_ERR_DECODE)
 * with body NULL. The body is valid only during the call.
 */
typedef void (*km_net_response_cb)(km_net_client *c, km_err err, const uint8_t *body, size_t len, void *arg);
/*
 * Owned delivery, called once: the response body moved (not copied) into body, which the callee
 * owns and frees with evbuffer_free. body is NULL with an error.
 */
typedef void (*km_net_owned_cb)(km_net_client *c, km_err err, struct evbuffer *body, void *arg);
/*
 * Streaming delivery, called as the body arrives: chunk holds the body's bytes [off, off + its
 * length), moved out of the socket buffer; the callee moves what it keeps out of chunk
 * (evbuffer_remove_buffer / evbuffer_add_buffer), anything left is dropped after the call. last:
 * the final call for this response (a body of 0 bytes gets one call with an empty chunk). Every
 * byte delivered counts as unreleased until the consumer calls km_net_client_release; while more
 * than max_unreleased_bytes are unreleased the client stops reading the socket. On an error, one
 * call with chunk NULL and last true.
 */
typedef void (*km_net_stream_cb)(km_net_client *c, km_err err, struct evbuffer *chunk, size_t off, bool last,
				 void *arg);
/* Connection state: KM_OK when ready (connected, TLS, ApiVersions and SASL done), an error when it failed or closed. */
typedef void (*km_net_state_cb)(km_net_client *c, km_err err, void *arg);
/* There is room again under max_inflight / max_inflight_bytes after a send returned KM_ERR_FULL. */
typedef void (*km_net_writable_cb)(km_net_client *c, void *arg);

typedef struct km_net_client_opts {
	const char *client_id;       /* default "kmirror" */
	SSL_CTX *tls;                /* NULL: plaintext */
	bool tls_verify_host;
	const char *sasl_mechanism;  /* NULL: none; "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER" */
	const char *sasl_username;
	const char *sasl_password;
	/* GSSAPI: the broker's service name and the client's keytab and principal (km_sasl_krb5). */
	const char *sasl_kerberos_service_name;
	const char *sasl_kerberos_keytab;
	const char *sasl_kerberos_principal;
	const char *sasl_kerberos_setting;
	const char *sasl_kerberos_host; /* the brokers' service principal's host; NULL: the host connected to */
	/* OAUTHBEARER: where the token comes from, and where that was set (km_sasl_oauth). */
	const char *sasl_oauthbearer_token_endpoint_url;
	const char *sasl_oauthbearer_client_id, *sasl_oauthbearer_client_secret, *sasl_oauthbearer_scope;
	const char *sasl_oauthbearer_setting;
	const char *sasl_oauthbearer_token_command; /* km_sasl_oauth's command */
	bool skip_api_versions;      /* peers that do not answer ApiVersions: km_net_client_version says -1 */
	bool quiet_failures;         /* a connection that fails before it is ready logs at debug (km_cluster says it once) */
	int64_t connect_timeout_ms;  /* 0: 10 s; covers TCP, TLS, ApiVersions and SASL */
	int64_t request_timeout_ms;  /* 0: 30 s */
	int64_t max_frame_bytes;     /* 0: 100 MiB */
	size_t max_inflight;         /* requests sent or queued and not answered; 0: no cap */
	size_t max_inflight_bytes;   /* their framed bytes; 0: no cap (one request alone always fits) */
	size_t max_unreleased_bytes; /* streamed bytes delivered and not released; 0: 4 MiB */
	size_t read_fill_bytes;      /* how far one read event tops up the socket input; 0: 1 MiB */
	/*
	 * SO_SNDBUF of the connection; 0: the kernel's autotuning. Set only where net.core.wmem_max
	 * allows it whole (a smaller, fixed buffer would cap a long link's throughput below what
	 * autotuning reaches): docs/net.md, "Send buffers".
	 */
	int sndbuf_bytes;
	struct evdns_base *dns;      /* async name resolution; NULL resolves synchronously */
	km_net_state_cb on_state;
	km_net_writable_cb on_writable;
	void *arg;
} km_net_client_opts;

struct km_config;
/*
 * kmirrord's own way to the destination into o: the upstream_tls_verify_hostname and
 * upstream_sasl_* settings (the TLS context, the client id and the limits are the caller's).
 */
void km_net_client_opts_upstream(km_net_client_opts *o, const struct km_config *cfg);

km_net_client *km_net_client_new(struct event_base *base, const km_net_client_opts *opts);
/* Start connecting; requests sent before the connection is ready are queued (and count against the caps). */
km_err km_net_client_connect(km_net_client *c, const char *host, uint16_t port) __attribute__((warn_unused_result));

/*
 * One piece of a request body. Copied when release is NULL. Otherwise referenced, not copied:
 * buf NULL: the len bytes at p; buf set: bytes [off, off + len) of buf, which must not change
 * until release. release(release_arg) is called exactly once when the client no longer needs the
 * bytes: after they were written to the socket, or when the request failed after it was accepted
 * (the connection closed first). It may run on a later loop iteration, never from inside the send
 * call except for a piece of 0 bytes. When the send call itself fails, nothing is kept and
 * release is not called. release may run after km_net_client_free returned (the socket's output is
 * freed at the end of the loop iteration): release_arg and the bytes must live until it runs.
 */
typedef struct km_net_piece {
	const void *p;
	size_t len;
	struct evbuffer *buf;
	size_t off;
	void (*release)(void *release_arg);
	void *release_arg;
} km_net_piece;

typedef enum {
	KM_NET_NO_RESPONSE = 0, /* acks=0 Produce: the broker does not answer; not counted in the caps */
	KM_NET_FLAT,            /* on_flat */
	KM_NET_OWNED,           /* on_owned */
	KM_NET_STREAM,          /* on_stream */
} km_net_delivery;

typedef struct km_net_request {
	int16_t api_key;
	int16_t api_version;
	int hdr_version;       /* request header version (0, 1, 2); -1: from the API table */
	int resp_hdr_version;  /* response header version (0, 1); -1: from the API table */
	const km_net_piece *pieces; /* the body, in order */
	size_t npieces;
	km_net_delivery delivery;
	km_net_response_cb on_flat;
	km_net_owned_cb on_owned;
	km_net_stream_cb on_stream;
	void *arg;
} km_net_request;

/* A request of this key and version with header versions from the API table and no body yet. */
void km_net_request_init(km_net_request *rq, int16_t api_key, int16_t api_version);
/*
 * Send a request. KM_ERR_FULL when max_inflight or max_inflight_bytes is reached (on_writable fires
 * once there is room), KM_ERR_CLOSED when the client is closed or not connecting, KM_ERR_TOO_LARGE,
 * KM_ERR_INVAL (no callback for the delivery, an evbuffer piece out of range).
 */
km_err km_net_client_request(km_net_client *c, const km_net_request *rq) __attribute__((warn_unused_result));
/*
 * Send a request whose body (without header) is body/len, copied, with flat delivery.
 * hdr_version: request header version (1 or 2); resp_hdr_version: response header version (0 or 1).
 * cb NULL: no response expected (acks=0 Produce).
 */
km_err km_net_client_send(km_net_client *c, int16_t api_key, int16_t api_version, int hdr_version,
			  int resp_hdr_version, const uint8_t *body, size_t len, km_net_response_cb cb, void *arg)
	__attribute__((warn_unused_result));
/* The consumer of a streamed response is done with n delivered bytes: reading resumes under the cap. */
void km_net_client_release(km_net_client *c, size_t n);
/* Inside an on_stream call: the whole body's size of the response being streamed (its frame less the header). */
size_t km_net_client_stream_size(const km_net_client *c);

/* Highest version of api_key both the broker and the codec support; -1 when none (or not negotiated yet). */
int16_t km_net_client_version(const km_net_client *c, int16_t api_key);
/* The broker's finalized max version level of a feature ("metadata.version", ...); -1 when not finalized. */
int16_t km_net_client_feature(const km_net_client *c, const char *name);

typedef struct km_net_client_stats {
	size_t inflight, inflight_bytes; /* application requests, as counted against the caps */
	size_t unreleased;               /* streamed bytes delivered and not released */
	size_t peak_buffered;            /* most bytes seen waiting in the socket input at a read event */
	size_t peak_unreleased;
	uint64_t bytes_in;               /* response bytes taken from the socket input */
	bool paused;                     /* reading stopped for the unreleased cap */
} km_net_client_stats;

void km_net_client_stats_get(const km_net_client *c, km_net_client_stats *st);
bool km_net_client_ready(const km_net_client *c);
/*
 * Why the connection failed or closed, one line for a person ("TLS handshake failed: certificate
 * verify failed: ...", "SASL SCRAM-SHA-512 failed: SASL_AUTHENTICATION_FAILED: <the server's
 * message>", "closed by the peer during ApiVersions"); "" when it has not failed. Never holds a
 * credential. Valid until the next connect or free; read it in on_state to know why.
 */
const char *km_net_client_reason(const km_net_client *c);
/* Application requests sent or queued and not answered yet (what max_inflight counts). */
size_t km_net_client_inflight(const km_net_client *c);
/* Close; every pending request gets KM_ERR_CLOSED. Safe to call from inside a callback. */
void km_net_client_free(km_net_client *c);

#endif
