/*
 * kmirrord configuration: the options of every module in one struct, described by one table for the
 * option engine (kmirror/options.h). It sits in src/core so proxy, mirror and state can all read it.
 */
#ifndef KMIRROR_DAEMON_CONFIG_H
#define KMIRROR_DAEMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kmirror/error.h"
#include "kmirror/options.h"

#define KM_CONFIG_MAX_UPSTREAMS 32

typedef enum {
	KM_TLS_CLIENT_AUTH_NONE = 0,
	KM_TLS_CLIENT_AUTH_REQUESTED,
	KM_TLS_CLIENT_AUTH_REQUIRED,
} km_tls_client_auth;

/* mirror_pipelines: which mirrors' pipelines (and metadata sync) this kmirrord runs. */
typedef enum {
	KM_PIPELINES_ALL = 0, /* every mirror in the state (one kmirrord in front of the destination) */
	KM_PIPELINES_OWNED,   /* the mirrors the group __kmirror-sync gives this kmirrord */
	KM_PIPELINES_NONE,    /* none: this kmirrord only follows the state and serves clients */
} km_pipelines_mode;

/* read_only_error: the code of a refusal on a read-only mirror topic. */
typedef enum {
	KM_READ_ONLY_POLICY_VIOLATION = 0,
	KM_READ_ONLY_TOPIC_AUTHORIZATION_FAILED,
	KM_READ_ONLY_KMIRROR,
} km_read_only_error;

/*
 * Every field has one row in the option table (daemon_config.c), but for upstream_count and
 * upstream_sasl_password_from_file; strings are owned (NULL when empty).
 */
typedef struct km_config {
	km_hostport listen;
	bool listen_reuseport;    /* the client listeners (bootstrap, brokers) with SO_REUSEPORT */
	char *advertised_host;
	int64_t broker_port_base;
	int64_t broker_port_count;
	km_hostport upstream[KM_CONFIG_MAX_UPSTREAMS];
	int upstream_count;
	km_hostport http_listen; /* port 0: disabled */
	km_hostport admin_listen; /* port 0: the admin routes are served on http_listen */
	char *admin_tls_cert_file; /* admin_listen speaks TLS with these; NULL: plain HTTP */
	char *admin_tls_key_file;
	int64_t http_max_connections;  /* per HTTP listener; 0: no cap */
	int64_t http_max_header_bytes;
	int64_t http_max_headers;
	int64_t http_request_timeout_ms;
	char *upstream_file;      /* where a swap of the upstream is persisted; NULL: swaps refused */
	char *admin_token_file;   /* the HTTP admin endpoint's bearer token; NULL: endpoint refuses */
	int64_t log_level;        /* km_log_level */
	char *log_fetch_topics;   /* mirror topics whose Fetch answers are logged (comma-separated); "": none */
	int64_t max_frame_bytes;
	int64_t max_auth_frame_bytes;
	int64_t max_local_frame_bytes;
	int64_t idle_timeout_ms;
	int64_t frame_timeout_ms;
	int64_t upstream_connect_timeout_ms;
	int64_t upstream_request_timeout_ms;
	int64_t metadata_refresh_ms;
	int64_t max_inflight_requests;
	int64_t connection_buffer_bytes;
	int64_t splice_min_bytes;       /* 0: never splice */
	int64_t max_connections;        /* client connections, all listeners; 0: no cap */
	int64_t max_connections_per_ip; /* client connections from one address; 0: no cap */
	int64_t drain_timeout_ms;
	int64_t drain_interval_ms;
	int64_t swap_fetch_hold_ms;
	int64_t read_only_error; /* km_read_only_error */
	char *tls_cert_file;
	char *tls_key_file;
	char *tls_ca_file;
	char *tls_keystore_file;
	char *tls_keystore_password;
	char *tls_truststore_file;
	char *tls_truststore_password;
	int64_t tls_client_auth; /* km_tls_client_auth */
	bool upstream_tls;
	char *upstream_tls_ca_file;
	char *upstream_tls_cert_file;
	char *upstream_tls_key_file;
	char *upstream_tls_keystore_file;
	char *upstream_tls_keystore_password;
	char *upstream_tls_truststore_file;
	char *upstream_tls_truststore_password;
	bool upstream_tls_verify_hostname;
	char *upstream_sasl_mechanism;
	char *upstream_sasl_username;
	char *upstream_sasl_password;
	char *upstream_sasl_password_file;
	char *upstream_sasl_kerberos_service_name;
	char *upstream_sasl_kerberos_keytab;
	char *upstream_sasl_kerberos_principal;
	char *upstream_sasl_kerberos_host;
	char *upstream_sasl_oauthbearer_token_endpoint_url;
	char *upstream_sasl_oauthbearer_client_id;
	char *upstream_sasl_oauthbearer_client_secret;
	char *upstream_sasl_oauthbearer_client_secret_file;
	char *upstream_sasl_oauthbearer_scope;
	char *upstream_sasl_oauthbearer_token_command;
	/* Not an option: upstream_sasl_password was read from upstream_sasl_password_file (km_config_read_secrets). */
	bool upstream_sasl_password_from_file;
	/* Not an option: upstream_sasl_oauthbearer_client_secret was read from its _file. */
	bool upstream_sasl_oauthbearer_client_secret_from_file;
	char *mirror_state_topic;
	int64_t mirror_pipelines; /* km_pipelines_mode */
	int64_t mirror_state_partitions;
	int64_t mirror_state_replication_factor; /* -1: min(3, brokers) */
	char *mirror_sync_group;              /* the base of the group the lease joins */
	int64_t mirror_sync_group_move_after_s; /* 0: never move on its own */
	char *mirror_secret_key_file;
	char *mirror_file_dir;
	bool secret_file_mode_check; /* refuse secret files group or others may read */
} km_config;

/* The daemon's option table (daemon_config.c), for the engine's functions in kmirror/options.h. */
const km_opt_table *km_config_table(void);

/* The engine over km_config_table(). init fills cfg with the defaults. */
void km_config_init(km_config *cfg);
void km_config_free(km_config *cfg);
/* Deep copy (dst is overwritten, not freed). */
km_err km_config_copy(km_config *dst, const km_config *src) __attribute__((warn_unused_result));
/* Set one option from its text form; on failure err (size errlen) says why and cfg is unchanged. */
km_err km_config_set(km_config *cfg, const char *name, const char *value, char *err, size_t errlen)
	__attribute__((warn_unused_result));
/* Read "key = value" lines (# comments, blank lines). The first bad line fails the whole file. */
km_err km_config_load_file(km_config *cfg, const char *path, char *err, size_t errlen)
	__attribute__((warn_unused_result));
/* Cross-option checks (TLS files in pairs, upstreams present, port ranges). */
km_err km_config_validate(const km_config *cfg, char *err, size_t errlen) __attribute__((warn_unused_result));
/*
 * The secrets kept in files, read into cfg after km_config_validate: upstream_sasl_password from
 * upstream_sasl_password_file and upstream_sasl_oauthbearer_client_secret from its _file (one
 * trailing newline trimmed); the keytab and the token file are only checked. A file group or others may read is
 * refused unless secret_file_mode_check is false (then a warning is logged). mirror_secret_key_file
 * is the state store's to read (km_state_new).
 */
km_err km_config_read_secrets(km_config *cfg, char *err, size_t errlen) __attribute__((warn_unused_result));
/*
 * For SIGHUP: whether next may replace cur. next is validated as a whole first; then this fails
 * naming the first non-reloadable option that differs (those need a restart).
 */
km_err km_config_check_reload(const km_config *cur, const km_config *next, char *err, size_t errlen)
	__attribute__((warn_unused_result));

/*
 * For --check-config: opens every file and directory the options name (TLS certificates, keys and
 * CA bundles, the admin token, secret files, mirror_file_dir; upstream_file's directory must be
 * writable, the file itself may be absent). Returns how many cannot be used; out holds one line
 * each, "option path: why" (the system's error text).
 */
int km_config_check_files(const km_config *cfg, char *out, size_t outlen);
/*
 * Whether advertised_host is a loopback address (localhost, 127.x, ::1) while listen is not: then
 * clients on other hosts are sent to themselves. true with the warning in buf.
 */
bool km_config_loopback_warning(const km_config *cfg, char *buf, size_t len);

/*
 * The upstream swap's persistence (docs/proxy.md, "Upstream swap"). The file holds one line,
 * "upstream = HOST:PORT,...". apply: when cfg->upstream_file names a file that exists, its upstream
 * replaces cfg's (a missing file is no error: no swap yet). write: the list replaces the file's
 * content atomically (temporary file, fsync, rename, fsync of the directory).
 */
km_err km_config_apply_upstream_file(km_config *cfg, char *err, size_t errlen) __attribute__((warn_unused_result));
km_err km_config_write_upstream_file(const char *path, const km_hostport *list, int count, char *err, size_t errlen)
	__attribute__((warn_unused_result));
/* "HOST:PORT,HOST:PORT" into buf (truncated to len). */
void km_config_format_upstream(const km_hostport *list, int count, char *buf, size_t len);

#endif
